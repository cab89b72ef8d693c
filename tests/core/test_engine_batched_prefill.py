"""Batched prefill on real tiny models: prompts that arrive together are prefilled in
one forward pass, and every request's greedy tokens stay identical to mlx-lm's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.events import RequestHandle
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import (
    Result,
    assert_matches_mlx_lm,
    submit_together,
)

#: Different lengths (about 4 to 25 tokens), so the batch needs padding.
PROMPTS = [
    "The quick brown fox",
    "Once upon a time in a land far away, there lived a king with three daughters",
    "def fibonacci(n): return",
    "Paris is the capital of France, and Berlin is the capital of",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Roses are red, violets are blue, sugar is sweet and so",
]


def ids(rt: Runtime, text: str) -> tuple[int, ...]:
    return tuple(rt.tokenizer.encode(text))


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_5", "tiny_gemma4"])
def test_prompts_arriving_together_are_prefilled_together_and_match_mlx_lm(
    family: str, request: pytest.FixtureRequest, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(request.getfixturevalue(family))
    requests = [GenerationRequest(ids(rt, p), 12) for p in PROMPTS]
    assert len({len(r.prompt_tokens) for r in requests}) == len(requests)
    results = submit_together(rt, requests)
    for req, res in zip(requests, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
        assert res.finish is not None and res.finish.usage.cached_tokens == 0
    stats = rt.engine.stats()
    assert stats["prefill_batches"] == 1
    assert stats["prefill_batched_requests"] == len(requests)
    assert stats["requests_running"] == 0


def test_batching_off_by_flag_or_per_request(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    off = runtime(tiny_llama, prefill_batch_size=1)
    requests = [GenerationRequest(ids(off, p), 6) for p in PROMPTS[:4]]
    for req, res in zip(requests, submit_together(off, requests), strict=True):
        assert_matches_mlx_lm(off, req, res)
    assert off.engine.stats()["prefill_batches"] == 0

    rt = runtime(tiny_llama)
    opted_out = [
        GenerationRequest(ids(rt, p), 6, options={"batched_prefill": False}) for p in PROMPTS[:3]
    ]
    plain = [GenerationRequest(ids(rt, p), 6) for p in PROMPTS[3:]]
    results = submit_together(rt, [*opted_out, *plain])
    for req, res in zip([*opted_out, *plain], results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert rt.engine.stats()["prefill_batched_requests"] == len(plain)


def test_a_batch_stays_within_one_prefill_chunk(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_llama, prefill_step_size=40)
    requests = [GenerationRequest(ids(rt, p), 6) for p in PROMPTS]
    lengths = [len(r.prompt_tokens) for r in requests]
    assert lengths == [4, 17, 5, 13, 23, 16]
    for req, res in zip(requests, submit_together(rt, requests), strict=True):
        assert_matches_mlx_lm(rt, req, res)
    # padded to its longest row, a batch holds at most 40 tokens: [4, 17] (34) and
    # [5, 13] (26) batch; 23 and 16 (46) go alone
    stats = rt.engine.stats()
    assert (stats["prefill_batches"], stats["prefill_batched_requests"]) == (2, 4)


def test_cancelled_requests_leave_cleanly(
    tiny_qwen3: Path, runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime(tiny_qwen3)
    engine = rt.engine
    requests = [GenerationRequest(ids(rt, p), 10) for p in PROMPTS]
    handles: list[RequestHandle] = []
    before_batch, inside_batch = requests[1], requests[4]

    lookup = engine.cache.lookup

    def cancelling_lookup(tokens: Any) -> Any:
        # cancelled after admission, before the batch is formed
        if tuple(tokens) == before_batch.prompt_tokens:
            handles[1].cancel()
        return lookup(tokens)

    prefill_batch = engine.prefill.prefill_batch

    def cancelling_prefill_batch(tasks: Any) -> Any:
        handles[4].cancel()  # cancelled while the batch runs
        return prefill_batch(tasks)

    monkeypatch.setattr(engine.cache, "lookup", cancelling_lookup)
    monkeypatch.setattr(engine.prefill, "prefill_batch", cancelling_prefill_batch)
    results = [Result() for _ in requests]
    with engine._wake:
        for req, res in zip(requests, results, strict=True):
            handles.append(engine.submit(req, res.sink))
    for res in results:
        assert res.done.wait(120)
    for req, res in zip(requests, results, strict=True):
        if req is before_batch:
            assert res.finish is not None and res.finish.reason == "cancelled"
            assert res.tokens == []
        elif req is inside_batch:
            assert res.finish is not None and res.finish.reason == "cancelled"
            assert len(res.tokens) <= 1
        else:
            assert_matches_mlx_lm(rt, req, res)
    stats = engine.stats()
    assert stats["prefill_batched_requests"] == len(requests) - 1
    assert stats["requests_running"] == 0


def test_a_failing_batch_falls_back_to_single_prefills(
    tiny_llama: Path, runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime(tiny_llama)

    def explode(tasks: Any) -> Any:
        raise RuntimeError("batch blew up")

    monkeypatch.setattr(rt.engine.prefill, "prefill_batch", explode)
    requests = [GenerationRequest(ids(rt, p), 8) for p in PROMPTS[:4]]
    for req, res in zip(requests, submit_together(rt, requests), strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert rt.engine.stats()["prefill_batches"] == 0


def test_prefix_hits_join_fresh_prompts_in_a_batch(
    tiny_qwen3: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3)
    prefix = " ".join(f"word{i}" for i in range(40))
    first = GenerationRequest(ids(rt, prefix + " first question"), 4)
    (warm,) = submit_together(rt, [first])
    assert warm.finish is not None and warm.finish.usage.cached_tokens == 0
    hit = GenerationRequest(ids(rt, prefix + " second question, a longer one"), 10)
    fresh = [GenerationRequest(ids(rt, f"{n} {p}"), 10) for n, p in enumerate(PROMPTS[:3])]
    results = submit_together(rt, [hit, *fresh])
    for req, res in zip([hit, *fresh], results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert results[0].finish is not None
    assert results[0].finish.usage.cached_tokens >= len(ids(rt, prefix)) - 1
    for res in results[1:]:
        assert res.finish is not None and res.finish.usage.cached_tokens == 0
    assert rt.engine.stats()["prefill_batched_requests"] == 4


def test_hybrid_checkpoints_are_snapshotted_inside_a_batch(
    tiny_qwen3_5: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_qwen3_5)
    histories = [ids(rt, f"System: be brief. User: {p}") for p in PROMPTS[:3]]
    tail = ids(rt, " Assistant:")
    requests = [GenerationRequest((*h, *tail), 6, checkpoints=(len(h),)) for h in histories]
    for req, res in zip(requests, submit_together(rt, requests), strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert rt.engine.stats()["prefill_batched_requests"] == 3
    # the next turn of each conversation reuses the snapshot taken inside the batch
    follow = [GenerationRequest((*h, *ids(rt, " Assistant: ok. User: more")), 6) for h in histories]
    results = submit_together(rt, follow)
    for req, h, res in zip(follow, histories, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
        assert res.finish is not None and res.finish.usage.cached_tokens == len(h)
    assert rt.engine.stats()["prefill_batched_requests"] == 6


def test_one_and_two_token_prompts_batch_on_a_sliding_window_model(
    tiny_gemma4: Path, runtime: Callable[..., Runtime]
) -> None:
    # bodies of 0 and 1 tokens: the batch pads a one-token step to two (mlx-lm's
    # BatchRotatingKVCache refuses a one-token step while right padding is pending)
    rt = runtime(tiny_gemma4)
    requests = [GenerationRequest(p, 8) for p in [(1000,), (1001, 1002), (1003, 1004)]]
    for req, res in zip(requests, submit_together(rt, requests), strict=True):
        assert_matches_mlx_lm(rt, req, res)
    assert rt.engine.stats()["prefill_batched_requests"] == 3


def test_seeded_sampling_is_reproducible_inside_a_batch(
    tiny_llama: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(tiny_llama)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=123)
    seeded = GenerationRequest(ids(rt, PROMPTS[2]), 16, params)
    (alone,) = submit_together(rt, [seeded])
    others = [GenerationRequest(ids(rt, p), 16) for p in PROMPTS[3:6]]
    batch = submit_together(rt, [seeded, *others])
    assert batch[0].tokens == alone.tokens
    assert rt.engine.stats()["prefill_batched_requests"] == 4


def test_which_caches_can_be_batched() -> None:
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache

    from mlxcore.engine.batch_prefill import cache_is_batchable

    assert cache_is_batchable([KVCache(), ArraysCache(2)], 10_000)
    # a sliding window qualifies while the prompt fills at most half of it
    assert cache_is_batchable([KVCache(), RotatingKVCache(16)], 8)
    assert not cache_is_batchable([KVCache(), RotatingKVCache(16)], 9)
    assert not cache_is_batchable([RotatingKVCache(16, keep=4)], 4)
    assert not cache_is_batchable([QuantizedKVCache()], 4)
    assert not cache_is_batchable([], 4)
