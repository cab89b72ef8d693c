"""Quantized KV cache (``--kv-cache-dtype``) through the real engine: greedy tokens
identical to ``mlx_lm.generate(kv_bits=...)`` alone and in a changing batch, on dense
and hybrid models; prefix-cache entries keep their quantization; the memory budget
counts quantized bytes; models and decoders that cannot do it are refused."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from mlxcore.engine.kv_quant import BatchQuantizedKVCache, KVQuantization
from mlxcore.engine.memory import MemoryBudget
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import UsageError
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import (
    Result,
    after_each_step,
    assert_matches_mlx_lm,
    make_runtime,
    submit_together,
)

GROUP = 32  # the tiny test models are built with head_dim 32 here (16 by default)


@pytest.fixture(scope="module")
def qwen3_kv(mlxcore_model_factory: Callable[..., Path]) -> Path:
    return mlxcore_model_factory("qwen3", head_dim=GROUP)


@pytest.fixture(scope="module")
def qwen3_5_kv(mlxcore_model_factory: Callable[..., Path]) -> Path:
    return mlxcore_model_factory("qwen3_5", head_dim=GROUP)


def prompts(seed: int, count: int, low: int = 5, high: int = 150) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [
        tuple(rng.randrange(300, 3000) for _ in range(rng.randrange(low, high)))
        for _ in range(count)
    ]


def quantized(
    rt_model: Path, runtime: Callable[..., Runtime], bits: int, start: int = 0
) -> Runtime:
    return runtime(
        rt_model,
        kv_cache_dtype=f"int{bits}",
        kv_group_size=GROUP,
        kv_quant_start=start,
        prefill_step_size=64,
    )


def mlx_lm_args(bits: int, start: int = 0) -> dict[str, Any]:
    return {
        "kv_bits": bits,
        "kv_group_size": GROUP,
        "quantized_kv_start": start,
        "prefill_step_size": 64,
    }


@pytest.mark.parametrize(("family", "bits"), [("qwen3_kv", 8), ("qwen3_5_kv", 4)])
def test_a_changing_batch_matches_mlx_lm_with_kv_bits(
    family: str, bits: int, request: pytest.FixtureRequest, runtime: Callable[..., Runtime]
) -> None:
    rt = quantized(request.getfixturevalue(family), runtime, bits)
    first = [GenerationRequest(p, 10 + 6 * i) for i, p in enumerate(prompts(1, 3))]
    later = [GenerationRequest(p, 12) for p in prompts(2, 3)]
    results = [Result() for _ in first + later]
    with rt.engine._wake:
        for req, res in zip(first, results, strict=False):
            rt.engine.submit(req, res.sink)
    assert results[0].done.wait(120)  # the others are still decoding when the rest join
    for req, res in zip(later, results[3:], strict=True):
        rt.engine.submit(req, res.sink)
    for res in results:
        assert res.done.wait(120)
    for req, res in zip(first + later, results, strict=True):
        assert_matches_mlx_lm(rt, req, res, **mlx_lm_args(bits))
    stats = rt.engine.stats()
    assert 0 < stats["memory_kv_quantized_bytes_per_token"] < stats["memory_kv_bytes_per_token"]


def test_quantization_starts_where_kv_quant_start_says(
    qwen3_kv: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = quantized(qwen3_kv, runtime, 4, start=40)
    kinds = after_each_step(rt, lambda d: type(d.cache[0]).__name__ if d.cache else "")
    # 30 prompt tokens: full precision for the prompt and the first ten tokens, then int4
    req = GenerationRequest(prompts(3, 1, 30, 31)[0], 24)
    (res,) = submit_together(rt, [req])
    assert_matches_mlx_lm(rt, req, res, **mlx_lm_args(4, start=40))
    switched = kinds.index("BatchQuantizedKVCache")  # the running batch was converted
    assert 8 <= switched <= 11 and "BatchQuantizedKVCache" not in kinds[:switched], kinds
    # a prompt past the start is quantized after its first prefill chunk, as mlx-lm does
    req = GenerationRequest(prompts(4, 1, 140, 141)[0], 8)
    (res,) = submit_together(rt, [req])
    assert_matches_mlx_lm(rt, req, res, **mlx_lm_args(4, start=40))


def test_prefix_cache_entries_stay_quantized_and_are_reused(
    qwen3_kv: Path, runtime: Callable[..., Runtime]
) -> None:
    rt = quantized(qwen3_kv, runtime, 8)
    plain = runtime(qwen3_kv, prefill_step_size=64)
    history = prompts(5, 1, 150, 151)[0]
    for engine_rt in (rt, plain):
        submit_together(engine_rt, [GenerationRequest(history, 6)])
    found = rt.engine.cache.lookup((*history, 1))
    assert found.cached_tokens >= len(history) - 1
    assert all(isinstance(layer, QuantizedKVCache) for layer in found.cache)
    assert rt.engine.stats()["prefix_cache_bytes"] < plain.engine.stats()["prefix_cache_bytes"] / 2
    turn = GenerationRequest((*history, 7, 8, 9), 12)
    (res,) = submit_together(rt, [turn])
    assert res.finish is not None and res.finish.usage.cached_tokens >= len(history) - 1
    assert_matches_mlx_lm(rt, turn, res, **mlx_lm_args(8))


def test_the_batch_cache_extracts_what_was_merged() -> None:
    mx.random.seed(0)
    kv = KVQuantization(8, GROUP)
    rows = []
    for n in (3, 7):
        layer: Any = QuantizedKVCache(GROUP, 8)
        layer.update_and_fetch(mx.random.normal((1, 2, n, 64)), mx.random.normal((1, 2, n, 64)))
        rows.append(layer)
    batch = kv.merge(rows)
    assert batch.size() == 7 and batch.offset.tolist() == [3, 7]
    batch.update_and_fetch(mx.random.normal((2, 2, 1, 64)), mx.random.normal((2, 2, 1, 64)))
    other = kv.merge([rows[0]])
    batch.extend(other)
    assert batch.offset.tolist() == [4, 8, 3]
    for i, src in enumerate(rows):
        out = batch.extract(i)
        assert out.offset == src.offset + 1
        for mine, theirs in zip(out.keys, src.keys, strict=True):
            assert mx.array_equal(mine[..., : src.offset, :], theirs[..., : src.offset, :])
    batch.filter(mx.array([1]))
    assert batch.offset.tolist() == [8] and batch.left_padding.tolist() == [0]
    assert isinstance(batch, BatchQuantizedKVCache) and batch.nbytes > 0


def test_the_budget_counts_quantized_bytes() -> None:
    budget = MemoryBudget(10_000_000, 0, per_token=1000, quantized=(250, 100))
    assert budget.cost(50) == 50 * 1000  # below the start: full precision
    assert budget.cost(1000) == 1000 * 250  # quantized
    assert budget.cost(120) == 100 * 1000  # it held 100 full-precision tokens on the way
    unquantized = MemoryBudget(10_000_000, 0, per_token=1000)
    max_context = budget.max_context()
    assert max_context is not None and max_context == 4 * (unquantized.max_context() or 0)


def test_models_and_settings_that_cannot_quantize_are_refused(
    tiny_qwen3: Path, tiny_gemma4: Path, qwen3_kv: Path, runtime: Callable[..., Runtime]
) -> None:
    with pytest.raises(UsageError, match="head size 16 is not a multiple of --kv-group-size 64"):
        runtime(tiny_qwen3, kv_cache_dtype="int8")
    with pytest.raises(UsageError, match=r"RotatingKVCache.*sliding-window"):
        runtime(tiny_gemma4, kv_cache_dtype="int8", kv_group_size=GROUP)
    with pytest.raises(UsageError, match="unknown value 'fp8'"):
        runtime(qwen3_kv, kv_cache_dtype="fp8")


def test_a_speculative_decoder_is_refused_not_silently_unquantized(qwen3_5_kv: Path) -> None:
    with pytest.raises(UsageError, match="'qwen35-mtp' decoder does not keep a quantized"):
        make_runtime(qwen3_5_kv, "qwen35-mtp", kv_cache_dtype="int8", kv_group_size=GROUP)


def test_a_hybrid_resumed_from_a_snapshot_matches_mlx_lm_with_kv_bits(
    qwen3_5_kv: Path, runtime: Callable[..., Runtime]
) -> None:
    """A hybrid model with int8 keys and values resumes from the snapshot taken where a
    message starts (at a chunk boundary, as mlx-lm's own prefill chunks fall) with mlx-lm's
    tokens: the stored segments are quantized as the running cache was."""
    rt = quantized(qwen3_5_kv, runtime, 8)
    history = prompts(6, 1, 600, 601)[0]
    submit_together(rt, [GenerationRequest(history, 4, boundaries=(320,))])
    side = GenerationRequest((*history[:340], *range(900, 930)), 10)
    (res,) = submit_together(rt, [side])
    assert res.finish is not None and res.finish.usage.cached_tokens == 320
    assert_matches_mlx_lm(rt, side, res, **mlx_lm_args(8))
