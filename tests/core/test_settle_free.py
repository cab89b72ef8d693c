"""The plain decoder's settle-free steps (a GPU's default, forced here on the CPU with
``MLXCORE_SETTLE_FREE=1``): greedy tokens stay mlx-lm's in a changing batch, a seeded
sampled request draws the same tokens alone and beside others, and no step leaves work
for the next one to wait on (no greedy fallbacks, no redraws)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.row_sampling import SETTLE_FREE_ENV
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import assert_matches_mlx_lm, submit_together


def prompt(seed: int, n: int = 12) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(300, 3000) for _ in range(n))


@pytest.fixture
def settle_free_rt(
    tiny_qwen3: Path, runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> Runtime:
    monkeypatch.setenv(SETTLE_FREE_ENV, "1")
    rt = runtime(tiny_qwen3)
    assert rt.engine._loop.decoder.settle_free  # type: ignore[attr-defined]
    return rt


def test_greedy_tokens_stay_mlx_lms_as_rows_join_and_leave(settle_free_rt: Runtime) -> None:
    rt = settle_free_rt
    requests = [
        GenerationRequest(prompt(i), 6 + 5 * i, sampling=SamplingParams()) for i in range(6)
    ]
    for req, res in zip(requests, submit_together(rt, requests), strict=True):
        assert_matches_mlx_lm(rt, req, res)
    late = GenerationRequest(prompt(50), 9, sampling=SamplingParams())
    [res] = submit_together(rt, [late])
    assert_matches_mlx_lm(rt, late, res)
    stats = rt.engine._loop.decoder.stats()  # type: ignore[attr-defined]
    assert stats == {
        "greedy_exact_fallbacks": 0,
        "sampling_redraws": 0,
        "greedy_relaunched_steps": 0,
    }


def test_a_seeded_request_draws_the_same_alone_and_in_a_batch(settle_free_rt: Runtime) -> None:
    rt = settle_free_rt
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=123)

    def mine() -> GenerationRequest:
        return GenerationRequest(prompt(7), 16, sampling=params)

    [alone] = submit_together(rt, [mine()])
    others = [
        GenerationRequest(prompt(20 + i), 16, sampling=SamplingParams(temperature=1.1, seed=i))
        for i in range(3)
    ]
    greedy = GenerationRequest(prompt(30), 16, sampling=SamplingParams())
    together = submit_together(rt, [*others, mine(), greedy])
    assert together[3].tokens == alone.tokens and len(set(alone.tokens)) > 1
    assert_matches_mlx_lm(rt, greedy, together[4])
    assert rt.engine._loop.decoder.stats()["sampling_redraws"] == 0  # type: ignore[attr-defined]
