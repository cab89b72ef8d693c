"""The bodies of the CLI commands (argument parsing lives in :mod:`mlxcore.cli.main`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import pluggy

from mlxcore.cli.distributed import parallel_mode
from mlxcore.cli.model_specs import ServedModels
from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.prefix_pool import PrefixPool
from mlxcore.engine.request import SamplingParams
from mlxcore.engine.validation import RequestRejected
from mlxcore.errors import MediaError, MlxcoreError
from mlxcore.hooks import PluginHooks
from mlxcore.models.catalog import ModelSpec
from mlxcore.output import OutputDelta
from mlxcore.plugins import plugin_statuses
from mlxcore.request_builder import (
    ChatPrompt,
    RequestSpec,
    TextPrompt,
    build_generations,
)
from mlxcore.runtime import Runtime, build_runtime

log = logging.getLogger(__name__)


def list_plugins(pm: pluggy.PluginManager) -> int:
    """Print the installed and built-in plugins as a table."""
    rows = plugin_statuses(pm)
    header = ("NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS")
    table = [header] + [
        (
            r.name,
            r.distribution,
            r.version,
            r.status,
            ", ".join(h.removeprefix("mlxcore_") for h in r.hooks) or "-",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
    return 0


DEFAULT_MAX_TOKENS = 256
"""``mlxcore generate``'s budget without ``--max-tokens`` (cut to what the context leaves)."""


def generate_spec(args: argparse.Namespace) -> RequestSpec:
    """The command line's request, in the terms every front end uses."""
    prompt: ChatPrompt | TextPrompt
    if args.raw:
        prompt = TextPrompt(text=args.prompt)
    else:
        system = [{"role": "system", "content": args.system}] if args.system else []
        prompt = ChatPrompt([*system, {"role": "user", "content": args.prompt}])
    options = args.request_options
    if not isinstance(options, dict):
        raise MlxcoreError("--request-options must be a JSON object")
    return RequestSpec(
        prompt=prompt,
        sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
        new_id=lambda: "cli",
        max_tokens=args.max_tokens,
        default_max_tokens=DEFAULT_MAX_TOKENS,
        extras=options,
    )


def generate(args: argparse.Namespace, config: ServerConfig, hooks: PluginHooks) -> int:
    """One generation through the request builder, the engine and the output pipeline
    (the path an HTTP request takes), streamed to stdout.

    Reasoning, when the model's parser separates it, goes to stderr. A request the model
    cannot serve ends with the message an HTTP client would get in its 400.
    """
    rt = build_runtime(config, hooks)
    try:
        (gen,) = build_generations(rt, generate_spec(args))
    except (RequestRejected, MediaError) as exc:
        rt.engine.shutdown()
        raise MlxcoreError(exc.message) from None
    except BaseException:
        rt.engine.shutdown()
        raise
    pipeline = gen.pipeline
    start = time.perf_counter()
    first_at: float | None = None
    finish: FinishEvent | None = None
    try:
        for event in rt.engine.stream(gen.request):
            if isinstance(event, TokenEvent):
                first_at = first_at or time.perf_counter()
                _show(pipeline.push(event.tokens))
            else:
                finish = event
                _show(pipeline.finish(event.reason))
    finally:
        rt.engine.shutdown()
    sys.stdout.write("\n")
    if finish is None or finish.reason == "error":
        raise MlxcoreError(f"generation failed: {finish.error if finish else 'no result'}")
    elapsed = time.perf_counter() - (first_at or start)
    n = finish.usage.completion_tokens
    log.info(
        "finish=%s prompt=%d tokens, generated=%d tokens, TTFT %.3fs, %.1f tok/s",
        finish.reason,
        finish.usage.prompt_tokens,
        n,
        (first_at or start) - start,
        (n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0,
    )
    return 0


def _show(delta: OutputDelta) -> None:
    if delta.reasoning:
        sys.stderr.write(delta.reasoning)
        sys.stderr.flush()
    if delta.content:
        sys.stdout.write(delta.content)
    for call in delta.tool_calls:
        sys.stdout.write(f"\n[tool call] {call.name}({call.arguments})")
    sys.stdout.flush()


def serve(config: ServerConfig, hooks: PluginHooks, models: ServedModels) -> int:
    """Serve the model(s) over HTTP until interrupted.

    One model is loaded before the server starts (a model that cannot load stops
    start-up). With several, the first and the pinned ones load as the server starts;
    the others on their first request.
    """
    from mlxcore.server.app import serve as run_server
    from mlxcore.server.metrics import Metrics
    from mlxcore.server.router import ModelRouter

    pool = PrefixPool()  # one prefix-cache budget for every model served

    def build(spec: ModelSpec, elsewhere: Callable[[], int]) -> Runtime:
        return build_runtime(spec.config, spec.hooks, elsewhere, prefix_pool=pool)

    router = ModelRouter(
        models.specs,
        build,
        Metrics(),
        memory_budget=models.memory_budget,
        idle_unload=models.idle_unload,
        accept_any_name=config.accept_any_model_name,
        prefix_pool=pool,
    )
    enabled = [name for name, plugin in hooks.pm.list_name_plugin() if plugin is not None]
    log.info("plugins: %s", ", ".join(enabled))
    if config.distributed:
        return _serve_distributed(config, hooks, router, run_server)
    parallel_mode(config)  # --tensor-parallel without --distributed is refused
    if router.single:
        rt = build_runtime(config, hooks, prefix_pool=pool)
        log.info("model: %s (%s)", router.default.spec.name, rt.info.model_type)
        log.debug("model folder: %s", rt.info.path)
        router.adopt(router.default, rt)
        del rt  # the router owns it now: unloading the model must be able to free it
        return run_server(router, hooks)
    preload = [slot for slot in router.slots if slot is router.default or slot.pinned]
    for slot in router.slots:
        entry = slot.spec.entry
        log.info(
            "model %s%s%s%s",
            entry.name,
            f" (aliases {', '.join(entry.aliases)})" if entry.aliases else "",
            ", pinned" if entry.pinned else "",
            {
                "embed": ", embeddings",
                "rerank": ", reranker",
                "stt": ", speech to text",
                "tts": ", text to speech",
            }.get(entry.task, ""),
        )
    return run_server(router, hooks, preload)


def _serve_distributed(
    config: ServerConfig, hooks: PluginHooks, router: Any, run_server: Callable[..., int]
) -> int:
    """One rank of ``serve --distributed``: rank 0 serves HTTP, the others follow."""
    from mlxcore.cli.distributed import exit_now, follow, start_rank

    if not router.single:
        raise MlxcoreError("--distributed serves one model: drop --model / --models-config")
    rt, lockstep = start_rank(config, hooks)
    if lockstep.channel.rank != 0:
        exit_now(follow(rt, lockstep))
    rt.engine.step_sync = lockstep
    rt.engine.start()
    log.info("model: %s (%s), distributed", router.default.spec.name, rt.info.model_type)
    router.adopt(router.default, rt)
    # uvicorn raises the stop signal again once it has shut down; the group's exit
    # status must say how the server ended, not that a signal stopped it
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    exit_now(int(run_server(router, hooks)))
    return 0  # not reached
