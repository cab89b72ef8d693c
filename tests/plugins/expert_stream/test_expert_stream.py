"""Expert streaming (issue 59, first part): a mixture-of-experts model served with its
routed experts read from disk into a cache of at most 35% of their bytes gives the
fully loaded model's greedy tokens, alone and batched, float32 and 4-bit; bad sizes and
models are refused at start with the size that works; a checkpoint cut short while
serving fails the requests that need it, not the server."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import UsageError
from mlxcore.testing.runtime import make_runtime, reference_tokens, submit_together
from mlxcore_expert_stream import cache_of
from mlxcore_expert_stream.testing import mlx_lm_checkpoint, routed_bytes

EXPERTS, TOP_K = 16, 2
PROMPTS = [[100 + 7 * i + j for j in range(5 + 3 * i)] for i in range(8)]


EXPERT_COUNT_FIELD = {"minimax": "num_local_experts", "gpt_oss": "num_local_experts"}
"""The config field that sets a test model's routed experts, where not ``num_experts``."""


LONG = pytest.mark.long  # more families: `make test-long`


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("qwen3_5_moe", None), id="qwen3_5_moe-float32"),
        pytest.param(("qwen3_5_moe", 4), id="qwen3_5_moe-4-bit", marks=LONG),
        pytest.param(("qwen3_moe", None), id="qwen3_moe-float32"),
        pytest.param(("qwen3_moe", 4), id="qwen3_moe-4-bit", marks=LONG),
        pytest.param(("minimax", None), id="minimax-float32", marks=LONG),
        pytest.param(("gpt_oss", 4), id="gpt_oss-4-bit-expert-biases"),
    ],
)
def moe(request: pytest.FixtureRequest, mlxcore_model_factory: Any, tmp_path_factory: Any) -> Path:
    arch, bits = request.param
    field = EXPERT_COUNT_FIELD.get(arch, "num_experts")
    source = Path(mlxcore_model_factory(arch, **{field: EXPERTS}))
    folder = tmp_path_factory.mktemp("moe") / f"{arch}-{bits or 'f32'}"
    return mlx_lm_checkpoint(source, folder, bits)


@pytest.fixture(scope="module")
def qwen3_moe(mlxcore_model_factory: Any) -> Path:
    """One model for the refusals and faults (its tiny checkpoint is mlx-lm's format)."""
    return Path(mlxcore_model_factory("qwen3_moe", num_experts=EXPERTS))


def _generate(rt: Any, prompts: list[list[int]], n: int = 12) -> list[list[int]]:
    results = submit_together(rt, [GenerationRequest(p, n) for p in prompts])
    return [r.tokens for r in results]


def test_streamed_experts_give_the_fully_loaded_models_tokens(moe: Path) -> None:
    budget = int(0.35 * routed_bytes(moe))
    full = make_runtime(moe)
    try:
        alone_full = [_generate(full, [p])[0] for p in PROMPTS[:3]]
        batched_full = _generate(full, PROMPTS)
        expected = reference_tokens(full, PROMPTS[0], 12)
    finally:
        full.engine.shutdown()
    streamed = make_runtime(moe, "expert-stream", plugin_options={"expert_memory": budget})
    try:
        cache = cache_of(streamed.model)
        assert cache is not None and cache.capacity == budget
        assert [_generate(streamed, [p])[0] for p in PROMPTS[:3]] == alone_full
        assert _generate(streamed, PROMPTS) == batched_full
        assert alone_full[0] == expected[: len(alone_full[0])]  # and mlx-lm's own
        stats = cache.stats
        assert stats.misses > 0 and stats.hits > 0  # random routers: a low hit rate
        assert 0 < stats.nbytes <= budget  # the slot tables, allocated once
        figures = streamed.engine.stats()  # what /metrics, /health and the page show
        assert figures["expert_cache_misses"] == stats.misses
        assert figures["expert_cache_capacity_bytes"] == budget
        assert streamed.engine.memory.weights >= budget  # admission counts the whole cache
    finally:
        streamed.engine.shutdown()


def test_a_cache_smaller_than_one_tokens_experts_is_refused_with_the_size_that_works(
    qwen3_moe: Path,
) -> None:
    moe = qwen3_moe
    per_layer_expert = routed_bytes(moe) // EXPERTS
    smallest = TOP_K * per_layer_expert
    with pytest.raises(UsageError, match=f"smallest that works is {smallest} bytes"):
        make_runtime(moe, "expert-stream", plugin_options={"expert_memory": smallest - 1})


def test_a_model_without_routed_experts_is_refused(tiny_qwen3: Path) -> None:
    with pytest.raises(UsageError, match="no routed experts"):
        make_runtime(tiny_qwen3, "expert-stream", plugin_options={"expert_memory": 10**9})


def test_a_checkpoint_cut_short_while_serving_fails_requests_not_the_server(
    qwen3_moe: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "moe"
    shutil.copytree(qwen3_moe, copy)
    smallest = TOP_K * routed_bytes(copy) // EXPERTS
    rt = make_runtime(copy, "expert-stream", plugin_options={"expert_memory": smallest})
    try:
        first = submit_together(rt, [GenerationRequest(PROMPTS[1], 4)])[0]
        assert first.finish is not None and first.finish.reason == "length"
        weights = copy / "model.safetensors"
        with weights.open("r+b") as f:
            f.truncate(weights.stat().st_size // 2)
        broken = submit_together(rt, [GenerationRequest(PROMPTS[5], 8)])[0]
        assert broken.finish is not None and broken.finish.reason == "error"
        assert "shorter than its header" in (broken.finish.error or ""), broken.finish
        shutil.copy(qwen3_moe / "model.safetensors", weights)  # the file is whole again
        again = submit_together(rt, [GenerationRequest(PROMPTS[5], 8)])[0]
        assert again.finish is not None and again.finish.reason == "length", again.finish
    finally:
        rt.engine.shutdown()
