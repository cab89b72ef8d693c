"""Rows leave the plain decoder's batch lazily (defaults/decoder.py): a removed sequence's
row stays, computed and ignored, until a join or until a quarter of the rows have left.
Greedy tokens stay mlx-lm's however the rows leave."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mlxcore.defaults.decoder import LEFT_SHARE
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import Result, assert_matches_mlx_lm, submit_together


def prompt(seed: int, n: int = 12) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(300, 3000) for _ in range(n))


class Watch:
    """Samples the decoder's rows between engine steps: (rows in the batch, live rows)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.rt.engine._wake:  # the engine thread takes this lock between steps
                decoder = self.rt.engine._loop.decoder
                self.seen.append((len(decoder.slots), len(decoder)))  # type: ignore[attr-defined]
            time.sleep(0.0005)

    def stop(self) -> list[tuple[int, int]]:
        self._stop.set()
        self._thread.join()
        return self.seen


def test_staggered_ends_keep_rows_until_a_quarter_left_and_tokens_stay_mlx_lms(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3)
    requests = [
        GenerationRequest(prompt(i), 8 + 6 * i, sampling=SamplingParams()) for i in range(8)
    ]
    watch = Watch(rt)
    results = submit_together(rt, requests)
    seen = watch.stop()
    for req, res in zip(requests, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
    lingering = [rows - live for rows, live in seen if rows > live]
    assert lingering, "no removed row ever stayed in the batch"
    assert max(rows - live for rows, live in seen if rows) < LEFT_SHARE * 8 + 1
    assert rt.engine._loop.decoder.slots == []  # type: ignore[attr-defined]


def test_a_join_compacts_the_rows_that_left_and_tokens_stay_mlx_lms(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3)
    runners = [GenerationRequest(prompt(91 + i), 60, sampling=SamplingParams()) for i in range(5)]
    short = GenerationRequest(prompt(99), 2, sampling=SamplingParams())
    late = GenerationRequest(prompt(100), 6, sampling=SamplingParams())
    first = [Result() for _ in range(6)]
    with rt.engine._wake:
        for req, res in zip([*runners, short], first, strict=True):
            rt.engine.submit(req, res.sink)
    assert first[-1].done.wait(60)
    decoder = rt.engine._loop.decoder
    with rt.engine._wake:  # one row of six left: below a quarter, it stays
        assert (len(decoder.slots), len(decoder)) == (6, 5)  # type: ignore[attr-defined]
    [joined] = submit_together(rt, [late])
    with rt.engine._wake:  # the join dropped the short one's row; the late one's stays
        assert (len(decoder.slots), len(decoder)) == (6, 5)  # type: ignore[attr-defined]
    assert all(res.done.wait(120) for res in first)
    for req, res in zip([*runners, short, late], [*first, joined], strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert decoder.slots == []  # type: ignore[attr-defined]
