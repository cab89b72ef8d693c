"""What the agent-session benchmarks share (:mod:`mlxcore.bench.agent`, the replayed
tool-using session, and :mod:`mlxcore.bench.agent_long`, Claude Code-shaped sessions
past 100K tokens): the runtime they measure on, the prefix a prompt shares with earlier
ones, and a request's time to first token through the engine."""

from __future__ import annotations

import time

from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.prefill_plan import common_prefix
from mlxcore.engine.request import GenerationRequest
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime


def default_runtime(
    model: str, cache_size: str = "100000", *, whole_entries: bool = False
) -> Runtime:
    """A runtime with the installed autoloading plugins (template quirks included);
    ``whole_entries``: with the prefix cache mlxcore had before the radix tree (mlx-lm's
    LRU of whole entries, reused only at exact snapshots on hybrid models), the baseline
    of ``--agent-baseline whole-entries``."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection())
    config = ServerConfig(
        model=model,
        prefix_cache_size=cache_size,
        max_model_len=None,
        cache_strategy="lru" if whole_entries else None,
    )
    return build_runtime(config, PluginHooks(pm))


def shared_prefix(prompt: tuple[int, ...], earlier: list[tuple[int, ...]]) -> int:
    """The longest prefix ``prompt`` shares with any of ``earlier``."""
    return max((common_prefix(prompt, other) for other in earlier), default=0)


def processed_tokens(rt: Runtime | None) -> int:
    """The engine's ``prompt_tokens_processed`` so far (0 without a runtime)."""
    return int(rt.engine.stats()["prompt_tokens_processed"]) if rt is not None else 0


def time_to_first_token(rt: Runtime, request: GenerationRequest) -> tuple[float, FinishEvent]:
    """Run ``request`` to its end on ``rt``; the seconds to its first token, and its finish."""
    start = time.perf_counter()
    first: float | None = None
    for event in rt.engine.stream(request):
        if isinstance(event, TokenEvent) and first is None:
            first = time.perf_counter() - start
        if isinstance(event, FinishEvent):
            return first or (time.perf_counter() - start), event
    raise RuntimeError("generation ended without a finish event")
