"""The ceiling: mlx-lm's own ``stream_generate`` in this process, greedy.

The model is loaded with mlxcore's loader (which is ``mlx_lm.load`` plus a description of
the model) but no plugin patches it and no engine runs: this is what plain mlx-lm does with
the same prompt tokens the server gets.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter
from typing import Any

import attrs

from mlxcore.bench.results import StreamRun
from mlxcore.bench.workloads import Message

log = logging.getLogger(__name__)


@attrs.define
class LoadedBaseline:
    """The model loaded in this process, and what the report says about it."""

    model: Any
    tokenizer: Any
    facts: dict[str, Any]


def load_baseline(model_arg: str | None) -> LoadedBaseline:
    """Resolve and load ``model_arg`` (None: the embedded default) in this process."""
    from mlxcore.models.loader import load_model
    from mlxcore.runtime import resolve_model_path

    source, resolved = resolve_model_path(model_arg)
    loaded = load_model(resolved)
    return LoadedBaseline(loaded.model, loaded.tokenizer, model_facts(loaded, source))


def model_facts(loaded: Any, source: str) -> dict[str, Any]:
    """Path, type, dtype and size of a loaded model (dtype: the one most weights use)."""
    from mlx.utils import tree_flatten

    by_dtype: Counter[str] = Counter()
    leaves: Any = tree_flatten(loaded.model.parameters())
    for _, value in leaves:
        by_dtype[str(value.dtype).removeprefix("mlx.core.")] += int(value.size)
    config = loaded.info.config
    quant = config.get("quantization") or config.get("quantization_config")
    return {
        "source": source,
        "path": str(loaded.info.path),
        "model_type": loaded.info.model_type,
        "dtype": by_dtype.most_common(1)[0][0] if by_dtype else None,
        "config_dtype": config.get("torch_dtype") or config.get("dtype"),
        "quantization": quant if isinstance(quant, dict) else None,
        "parameters": sum(by_dtype.values()),
        "max_position_embeddings": config.get("max_position_embeddings"),
    }


def prompt_tokens(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The prompt token ids the server builds for ``messages`` (same chat template)."""
    from mlxcore.prompts import render_chat_prompt

    return render_chat_prompt(tokenizer, messages)[1]


def timed_generate(
    baseline: LoadedBaseline, tokens: list[int], max_tokens: int, prefill_step_size: int
) -> StreamRun:
    """One greedy ``stream_generate`` call, timed like an HTTP stream."""
    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(0.0)
    first: float | None = None
    last = 0.0
    count = 0
    finish: str | None = None
    start = time.perf_counter()
    for resp in stream_generate(
        baseline.model,
        baseline.tokenizer,
        mx.array(tokens),
        max_tokens=max_tokens,
        sampler=sampler,
        prefill_step_size=prefill_step_size,
    ):
        last = time.perf_counter()
        if first is None:
            first = last
        count = resp.generation_tokens
        finish = resp.finish_reason
    first = first if first is not None else last
    return StreamRun(
        prompt_tokens=len(tokens),
        completion_tokens=count,
        ttft_s=first - start,
        decode_s=last - first,
        total_s=last - start,
        finish_reason=finish,
    )


def release(baseline: LoadedBaseline) -> None:
    """Drop the model's weights and MLX's buffer cache before the server loads its own."""
    import mlx.core as mx

    baseline.model = None
    gc.collect()
    mx.clear_cache()
