"""A burst of requests reaching an idle engine starts together (``--burst-gather``, and
short prompts prefilled batch after batch before the first decode step): no stream that
started first decodes while the later arrivals' joins stretch its steps."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import (
    Result,
    after_each_step,
    assert_matches_mlx_lm,
    submit_together,
)


def prompt(seed: int, n: int = 12) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(300, 3000) for _ in range(n))


def greedy_requests(count: int, max_tokens: int, length: int = 12) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt(i, length), max_tokens, sampling=SamplingParams())
        for i in range(count)
    ]


def assert_all_match_mlx_lm(
    rt: Runtime, requests: list[GenerationRequest], results: list[Result]
) -> None:
    for request, result in zip(requests, results, strict=True):
        assert_matches_mlx_lm(rt, request, result)


def batch_sizes(rt: Runtime) -> list[int]:
    """The decoder's rows after each of its steps."""
    return after_each_step(rt, len)


def submit_apart(rt: Runtime, requests: list[GenerationRequest], gap: float) -> list[Result]:
    results = [Result() for _ in requests]
    for request, result in zip(requests, results, strict=True):
        rt.engine.submit(request, result.sink)
        time.sleep(gap)
    assert all(result.done.wait(120) for result in results)
    return results


def test_requests_arriving_a_few_ms_apart_start_in_one_batch(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3, burst_gather=0.1)  # generous: a loaded CI machine is slow
    sizes = batch_sizes(rt)
    requests = greedy_requests(5, 6)
    results = submit_apart(rt, requests, 0.01)
    assert sizes[0] == 5, sizes
    assert_all_match_mlx_lm(rt, requests, results)


def test_without_gathering_the_first_arrival_starts_alone(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3, burst_gather=0)
    sizes = batch_sizes(rt)
    requests = greedy_requests(3, 30)
    submit_apart(rt, requests, 0.15)
    assert sizes[0] == 1, sizes


def test_more_short_prompts_than_one_prefill_batch_all_join_before_the_first_step(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3, prefill_batch_size=4)
    sizes = batch_sizes(rt)
    requests = greedy_requests(10, 5)
    results = submit_together(rt, requests)
    assert sizes[0] == 10, sizes  # three prefill batches, then one decode batch
    assert_all_match_mlx_lm(rt, requests, results)


def test_the_opening_prefill_stops_at_the_step_budget(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    # 40-token prompts, 2 per batch, a 100-token step: two batches (80 tokens), then the
    # budget is spent and the first decode step runs before the rest join
    rt = runtime(tiny_qwen3, prefill_batch_size=2, prefill_step_size=100)
    sizes = batch_sizes(rt)
    requests = greedy_requests(8, 5, length=40)
    results = submit_together(rt, requests)
    assert sizes[0] == 4, sizes
    assert_all_match_mlx_lm(rt, requests, results)
