"""Prefill scheduling under mixed load (decision 0009) on real tiny models: short prompts
go ahead of a long prefill, a long prefill is chunked at the decode budget, a shared new
prefix is computed once; every request's greedy tokens stay identical to mlx-lm's."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxcore.engine.events import TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import Result, assert_matches_mlx_lm, submit_together


def token_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(300, 3000) for _ in range(n)]


class Timed(Result):
    """A result that also records when each token arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def sink(self, event: object) -> None:
        if isinstance(event, TokenEvent):
            self.times.extend(time.perf_counter() for _ in event.tokens)
        super().sink(event)


def wait_all(results: list[Timed], timeout: float = 120.0) -> None:
    for res in results:
        assert res.done.wait(timeout), "a request never finished"


def submit_when(rt: Runtime, ready: Callable[[], bool], requests: list[GenerationRequest]):
    """Submit ``requests`` between two engine steps, once ``ready()`` holds there."""
    results = [Timed() for _ in requests]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with rt.engine._wake:  # the engine thread takes this lock between steps
            if ready():
                for req, res in zip(requests, results, strict=True):
                    rt.engine.submit(req, res.sink)
                return results
        time.sleep(0.0005)
    raise TimeoutError("the engine never reached the wanted state")


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_qwen3_5"])
def test_sessions_sharing_a_new_prefix_compute_it_once(
    family: str, request: pytest.FixtureRequest, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(request.getfixturevalue(family), prefill_step_size=128)
    prefix = token_ids(1, 300)
    suffixes = [[3000 + i, *token_ids(10 + i, 4 + i)] for i in range(6)]
    requests = [GenerationRequest(tuple(prefix + s), 6) for s in suffixes]
    results = submit_together(rt, requests)
    for req, res in zip(requests, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
    cached = [res.finish.usage.cached_tokens for res in results if res.finish is not None]
    assert cached == [0] + [len(prefix)] * 5
    stats = rt.engine.stats()
    assert stats["prefill_shared_prefix_waits"] == 5
    total = sum(len(r.prompt_tokens) for r in requests)
    assert stats["prompt_tokens_processed"] == total - 5 * len(prefix)


def test_a_follower_starts_on_its_own_when_its_leader_is_cancelled(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3, prefill_step_size=32)
    prefix = token_ids(2, 600)
    leader = GenerationRequest((*prefix, 5, 6), 4)
    follower = GenerationRequest((*prefix, 7, 8, 9), 4)
    lead, follow = Timed(), Timed()
    with rt.engine._wake:
        handle = rt.engine.submit(leader, lead.sink)
        rt.engine.submit(follower, follow.sink)
    time.sleep(0.02)
    handle.cancel()
    wait_all([lead, follow])
    assert follow.finish is not None and follow.finish.reason in ("length", "stop")
    assert_matches_mlx_lm(rt, follower, follow)
    assert rt.engine.stats()["requests_running"] == 0


def test_short_requests_arriving_during_a_long_prefill_go_first(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_llama, prefill_step_size=32)
    long_req = GenerationRequest(tuple(token_ids(3, 3000)), 4)
    long_res = Timed()
    rt.engine.submit(long_req, long_res.sink)
    shorts = [GenerationRequest(tuple(token_ids(20 + i, 8 + i)), 4) for i in range(4)]

    def long_in_progress() -> bool:
        prefilling = rt.engine._loop.prefilling
        return bool(prefilling) and 0 < prefilling[0].processed < 2000

    results = submit_when(rt, long_in_progress, shorts)
    wait_all([long_res, *results])
    for req, res in zip([long_req, *shorts], [long_res, *results], strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert all(res.times[0] < long_res.times[0] for res in results)
    assert rt.engine.stats()["prefill_batched_requests"] >= 2


def runner_tokens_during_a_long_prefill(
    rt: Runtime, seed: int, runner_tokens: int, long_tokens: int, after: int
) -> list[float]:
    """A runner decodes; after ``after`` of its tokens a long prompt arrives. Returns the
    times of the runner's tokens while the long prompt waited for its first token (both
    checked against mlx-lm; skips when the runner stopped early)."""
    runner = GenerationRequest(tuple(token_ids(seed, 20)), runner_tokens)
    runner_res = Timed()
    rt.engine.submit(runner, runner_res.sink)
    long_req = GenerationRequest(tuple(token_ids(seed + 1, long_tokens)), 4)
    [long_res] = submit_when(rt, lambda: len(runner_res.times) >= after, [long_req])
    submitted = time.perf_counter()
    wait_all([runner_res, long_res])
    assert_matches_mlx_lm(rt, runner, runner_res)
    assert_matches_mlx_lm(rt, long_req, long_res)
    if runner_res.finish is not None and runner_res.finish.reason == "stop":
        pytest.skip("the runner stopped early; nothing to interleave with")
    return [t for t in runner_res.times if submitted < t < long_res.times[0]]


def test_a_long_prefill_is_chunked_at_the_decode_budget_while_others_decode(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_llama, prefill_step_size=512, prefill_decode_chunk=16)
    during = runner_tokens_during_a_long_prefill(rt, 4, 120, 400, after=2)
    # 400 tokens in 16-token chunks: about 25 steps, each with a decode step for the runner
    assert len(during) >= 20, len(during)


def test_the_time_share_sizes_the_chunks_from_measured_steps(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    """A tiny share: once a stretched step has been measured, chunks fall to the floor
    (128 tokens, half the cap) instead of the 256-token cap; tokens stay mlx-lm's."""
    rt = runtime(tiny_llama, prefill_step_size=512, prefill_decode_chunk=256,
                 prefill_time_share=0.001)  # fmt: skip
    during = runner_tokens_during_a_long_prefill(rt, 6, 160, 2000, after=3)
    pacer = rt.engine._loop.pacer
    assert pacer.decode_period is not None and pacer.token_cost is not None
    # the first chunk takes the cap (nothing measured yet), then (2000 - 256) / 128 = 13.6
    # chunks; at the cap it would be 2000 / 256 = 7.8
    assert len(during) >= 12, len(during)


def test_the_decode_chunk_flag_is_validated() -> None:
    from mlxcore.settings import non_negative_int

    assert non_negative_int("0") == 0
    for bad in ("-1", "x"):
        with pytest.raises(Exception, match="integer >= 0"):
            non_negative_int(bad)


def test_sessions_over_three_prefixes_finish_and_leave_nothing_parked(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3, prefill_step_size=64)
    prefixes = [token_ids(30 + k, 200) for k in range(3)]
    requests = [
        GenerationRequest(tuple(prefixes[i % 3] + token_ids(100 + i, 3)), 3) for i in range(12)
    ]
    results = submit_together(rt, requests)
    for req, res in zip(requests, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
    loop = rt.engine._loop
    assert not loop.parked and not loop.prefilling and not loop.live
    assert rt.engine.stats()["prefill_shared_prefix_waits"] == 9
