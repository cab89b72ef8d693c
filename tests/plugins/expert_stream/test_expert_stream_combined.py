"""Expert streaming combined with the rest of the engine (issue 59): the qwen35-mtp
decoder verifying drafts through streamed experts, an agent session on the hybrid MoE
model with int4 KV resuming from the radix cache, and the disk tier serving a restart;
greedy tokens always those of the fully loaded model under the same settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import Result, make_runtime, submit_together
from mlxcore_expert_stream import cache_of
from mlxcore_expert_stream.testing import mlx_lm_checkpoint, routed_bytes
from mlxcore_qwen35_mtp.extract import extract

EXPERTS = 16
SYSTEM = tuple(range(40, 340))  # a 300-token system prompt and tools
TURNS = [tuple(range(500 + 20 * t, 512 + 20 * t)) for t in range(4)]  # each user message


@pytest.fixture(scope="module")
def hybrid_moe(mlxcore_model_factory: Any, tmp_path_factory: Any) -> Path:
    """qwen3_5_moe as mlx-lm saves it, its MTP head restored beside it as a sidecar."""
    source = Path(mlxcore_model_factory("qwen3_5_moe", num_experts=EXPERTS))
    folder = mlx_lm_checkpoint(source, tmp_path_factory.mktemp("moe") / "qwen3_5_moe")
    extract(source, folder)
    return folder


@pytest.fixture
def runtimes() -> Iterator[Any]:
    made: list[Runtime] = []

    def make(model: Path, *plugins: str, **options: Any) -> Runtime:
        config = {k: options.pop(k) for k in ("kv_cache_dtype", "kv_group_size") if k in options}
        rt = make_runtime(model, *plugins, plugin_options=options, **config)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.engine.shutdown()


def _budget(folder: Path) -> int:
    return int(0.35 * routed_bytes(folder))


def _one(rt: Runtime, prompt: tuple[int, ...], n: int, **options: Any) -> Result:
    (result,) = submit_together(rt, [GenerationRequest(prompt, n, **options)])
    assert result.finish is not None and result.finish.reason == "length", result.finish
    return result


def test_the_mtp_decoder_verifies_through_streamed_experts(hybrid_moe: Path, runtimes: Any) -> None:
    mtp = {
        "num_speculative_tokens": 2,
        "mtp_auto_off": False,
        "speculative_disable_by_batch_size": 8,  # speculate with all 8 in the batch
    }
    prompts = [tuple(range(100 + 9 * i, 118 + 9 * i)) for i in range(8)]
    full = runtimes(hybrid_moe, "qwen35-mtp", **mtp)
    together_full = submit_together(full, [GenerationRequest(p, 16) for p in prompts])
    expected = [r.tokens for r in together_full]
    streamed = runtimes(
        hybrid_moe, "qwen35-mtp", "expert-stream", expert_memory=_budget(hybrid_moe), **mtp
    )
    assert streamed.engine.decoder.name == "qwen35-mtp"
    assert cache_of(streamed.model) is not None
    alone = [_one(streamed, p, 16) for p in prompts[:3]]
    assert [r.tokens for r in alone] == expected[:3]
    assert all("speculative_acceptance" in r.finish.usage.extra for r in alone if r.finish)
    together = submit_together(streamed, [GenerationRequest(p, 16) for p in prompts])
    assert [r.tokens for r in together] == expected
    assert all("speculative_acceptance" in r.finish.usage.extra for r in together if r.finish)


def _session(rt: Runtime, turns: int) -> list[Result]:
    """An agent session: each turn's prompt is the last prompt, its answer and a new
    user message, with a checkpoint where the new message starts."""
    history: tuple[int, ...] = SYSTEM
    results = []
    for message in TURNS[:turns]:
        prompt = (*history, *message)
        result = _one(rt, prompt, 10, checkpoints=(len(history),))
        results.append(result)
        history = (*prompt, *result.tokens)
    return results


def test_an_int4_agent_session_resumes_from_the_radix_cache_and_the_disk_tier(
    hybrid_moe: Path, runtimes: Any, tmp_path: Path
) -> None:
    disk = {"disk_cache_dir": str(tmp_path), "disk_cache_min_tokens": 64}
    full = runtimes(hybrid_moe, kv_cache_dtype="int4", kv_group_size=32)
    expected = _session(full, len(TURNS))
    streamed_options = {"expert_memory": _budget(hybrid_moe), "kv_cache_dtype": "int4", **disk}
    streamed_options["kv_group_size"] = 32
    streamed = runtimes(hybrid_moe, "expert-stream", "disk-cache", **streamed_options)
    first = _session(streamed, len(TURNS) - 1)
    assert [r.tokens for r in first] == [r.tokens for r in expected[:-1]]
    shared = len(SYSTEM)
    for turn, result in enumerate(first[1:], start=1):
        assert result.finish is not None
        cached = result.finish.usage.cached_tokens
        assert cached >= 0.9 * shared, (turn, cached, shared)
        shared += len(TURNS[turn - 1]) + len(first[turn - 1].tokens)
    streamed.engine.shutdown()  # writes the queued entries to disk

    restarted = runtimes(hybrid_moe, "expert-stream", "disk-cache", **streamed_options)
    history = tuple(SYSTEM)
    for message, result in zip(TURNS, first, strict=False):
        history = (*history, *message, *result.tokens)
    last = _one(
        restarted, (*history, *TURNS[-1]), 10,
        checkpoints=(len(history),), options={"explain_cache": True},
    )  # fmt: skip
    assert last.tokens == expected[-1].tokens
    assert last.finish is not None
    cache = last.finish.usage.extra["mlxcore"]["cache"]
    assert cache["source"] == "disk" and cache["cached_tokens"] >= 0.9 * len(history), cache
