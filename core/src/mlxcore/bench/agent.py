"""The agent-session benchmark: a replayed multi-turn tool-using conversation.

A coding agent sends a long system prompt with tools, then one tool call and one
tool result per turn, with a user text now and then. Every turn's prompt extends
the previous one, so prefix reuse should make each turn's time to first token
depend on the new suffix only. This replays such a session through the real
engine (chat template, plugins, prefix cache, checkpoints) and measures, per turn,
the cached share of the prompt and the TTFT, against the same prompt cold (a
second engine whose prefix cache is disabled), side by side in one run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.prompts import render_chat
from mlxcore.runtime import Runtime, build_runtime

TOOL_NAMES = ("read_file", "write_file", "grep", "list_dir", "run_tests", "edit_file")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')}: " + "details of the operation " * 6,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "pattern": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in TOOL_NAMES
]


@attrs.frozen
class Turn:
    """One measured turn."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    cold_ttft_s: float

    @property
    def cached_fraction(self) -> float:
        """Share of the prompt served from the prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def speedup(self) -> float:
        """Cold TTFT over cached TTFT."""
        return self.cold_ttft_s / self.ttft_s if self.ttft_s > 0 else 0.0


def default_runtime(model: str, cache_size: str = "100000") -> Runtime:
    """A runtime with the installed autoloading plugins (template quirks included)."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection())
    config = ServerConfig(model=model, prefix_cache_size=cache_size, max_model_len=None)
    return build_runtime(config, PluginHooks(pm))


def _ttft(rt: Runtime, request: GenerationRequest) -> tuple[float, FinishEvent]:
    start = time.perf_counter()
    first: float | None = None
    for event in rt.engine.stream(request):
        if isinstance(event, TokenEvent) and first is None:
            first = time.perf_counter() - start
        if isinstance(event, FinishEvent):
            return first or (time.perf_counter() - start), event
    raise RuntimeError("generation ended without a finish event")


def _system_prompt(target_tokens: int) -> str:
    line = "Follow the repository conventions; run the tests before you finish; be brief. "
    return line * max(1, target_tokens // 16)


def _next_messages(turn: int) -> list[dict[str, Any]]:
    call = {
        "id": f"call_{turn}",
        "type": "function",
        "function": {
            "name": TOOL_NAMES[turn % len(TOOL_NAMES)],
            "arguments": {"path": f"src/module_{turn}.py"},
        },
    }
    result = json.dumps({"lines": [f"line {i} of module {turn}" for i in range(6)]})
    out: list[dict[str, Any]] = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{turn}", "content": result},
    ]
    if turn % 5 == 4:
        out.append({"role": "user", "content": f"Good. Now look at module {turn + 1} too."})
    return out


def run_agent_session(
    model: str,
    *,
    turns: int = 20,
    system_tokens: int = 10_000,
    max_tokens: int = 4,
    sessions: int = 1,
    restart_at: int | None = None,
    make_runtime: Callable[[], Runtime] | None = None,
) -> dict[str, Any]:
    """Replay the session; return per-turn numbers and the summary the targets need.

    ``sessions`` conversations (each with its own system prompt) take turns in
    round-robin; ``turns`` counts the turns of each. ``restart_at=N`` shuts the measured
    runtime down after turn N (counted from 1) and builds a new one, as a server restart
    would: what survives is what its plugins kept outside the process. ``make_runtime``
    builds the measured runtime (default: installed plugins, a 100000-token prefix cache);
    the cold side is always a runtime without prefix cache.
    """
    build = make_runtime or (lambda: default_runtime(model))
    warm, cold = build(), default_runtime(model, "0")
    results: list[list[Turn]] = [[] for _ in range(sessions)]
    try:
        chats = [_opening(number, system_tokens) for number in range(sessions)]
        for turn in range(turns):
            for number, messages in enumerate(chats):
                rendered = render_chat(warm.tokenizer, messages, tools=TOOLS)
                request = GenerationRequest(
                    tuple(rendered.ids), max_tokens, checkpoints=rendered.checkpoints()
                )
                ttft, finish = _ttft(warm, request)
                cold_ttft, _ = _ttft(cold, GenerationRequest(tuple(rendered.ids), max_tokens))
                results[number].append(
                    Turn(len(rendered.ids), finish.usage.cached_tokens, ttft, cold_ttft)
                )
                messages += _next_messages(turn)
            if restart_at is not None and turn + 1 == restart_at:
                warm.engine.shutdown()
                warm = build()
        cache_stats = {
            k: v for k, v in warm.engine.stats().items() if k.startswith("prefix_cache_")
        }
    finally:
        warm.engine.shutdown()
        cold.engine.shutdown()
    return {**_summary(results, restart_at), "prefix_cache": cache_stats}


def _opening(session: int, system_tokens: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"Session {session}. " + _system_prompt(system_tokens)},
        {"role": "user", "content": "Refactor the project; start by reading module 0."},
    ]


def _turn_body(t: Turn) -> dict[str, Any]:
    return {
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "cached_fraction": round(t.cached_fraction, 4),
        "ttft_s": round(t.ttft_s, 4),
        "cold_ttft_s": round(t.cold_ttft_s, 4),
        "speedup": round(t.speedup, 2),
    }


def _summary(results: list[list[Turn]], restart_at: int | None) -> dict[str, Any]:
    later = [t for session in results for t in session[1:]]
    out: dict[str, Any] = {
        "turns": [_turn_body(t) for t in results[0]],
        "min_cached_fraction_after_first": round(min(t.cached_fraction for t in later), 4),
        "min_speedup_after_first": round(min(t.speedup for t in later), 2),
    }
    if len(results) > 1:
        out["sessions"] = [[_turn_body(t) for t in session] for session in results]
    if restart_at is not None and restart_at < len(results[0]):
        after = [session[restart_at] for session in results]
        out["restart_at"] = restart_at
        out["first_turn_after_restart"] = [_turn_body(t) for t in after]
        out["speedup_after_restart"] = round(min(t.speedup for t in after), 2)
    return out


def add_agent_options(parser: Any) -> None:
    """``mlxcore bench --agent-session``: run only the agent-session replay."""
    group = parser.add_argument_group("agent session")
    group.add_argument(
        "--agent-session",
        action="store_true",
        help="replay a multi-turn tool-using agent session instead of the default benchmark "
        "(the model, --prefix-cache-size and --plugin flags apply to the measured side)",
    )
    group.add_argument("--agent-turns", type=int, default=20, help="turns to replay")
    group.add_argument(
        "--agent-system-tokens", type=int, default=10_000, help="approximate system prompt size"
    )
    group.add_argument(
        "--agent-sessions",
        type=int,
        default=1,
        help="conversations taking turns in round-robin, each with its own system prompt",
    )
    group.add_argument(
        "--restart-at",
        type=int,
        default=None,
        metavar="N",
        help="stop the measured engine after turn N and start a fresh one (a server restart)",
    )


def main_agent(
    args: Any, config: ServerConfig | None = None, hooks: PluginHooks | None = None
) -> int:
    """Run the agent-session replay on the command's model; print a table or JSON."""
    from mlxcore.runtime import resolve_model_path

    model = str(resolve_model_path(args.model)[1].path)
    make_runtime = None
    if config is not None and hooks is not None:
        measured = attrs.evolve(config, model=model, max_model_len=None)
        make_runtime = lambda: build_runtime(measured, hooks)  # noqa: E731
    result = run_agent_session(
        model,
        turns=args.agent_turns,
        system_tokens=args.agent_system_tokens,
        sessions=args.agent_sessions,
        restart_at=args.restart_at,
        make_runtime=make_runtime,
    )
    targets = {
        "cached_fraction_after_first >= 0.9": result["min_cached_fraction_after_first"] >= 0.9,
        "ttft_speedup_after_first >= 10": result["min_speedup_after_first"] >= 10,
    }
    if "speedup_after_restart" in result:
        targets["ttft_speedup_after_restart >= 10"] = result["speedup_after_restart"] >= 10
    result["targets"] = targets
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'turn':>4} {'ses':>3} {'prompt':>7} {'cached':>7} {'share':>6} {'TTFT s':>8} "
          f"{'cold s':>8} {'x':>7}")  # fmt: skip
    for session, turns in enumerate(result.get("sessions", [result["turns"]])):
        for i, t in enumerate(turns):
            print(
                f"{i + 1:>4} {session:>3} {t['prompt_tokens']:>7} {t['cached_tokens']:>7} "
                f"{t['cached_fraction']:>6.3f} {t['ttft_s']:>8.3f} {t['cold_ttft_s']:>8.3f} "
                f"{t['speedup']:>7.1f}"
            )
    print(json.dumps(result["targets"]))
    return 0
