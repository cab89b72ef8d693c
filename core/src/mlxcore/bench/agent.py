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
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.bench.agent_runtime import (
    default_runtime,
    processed_tokens,
    shared_prefix,
    time_to_first_token,
)
from mlxcore.config import ServerConfig
from mlxcore.engine.request import SamplingParams
from mlxcore.hooks import PluginHooks
from mlxcore.request_builder import ChatPrompt, RequestSpec, build_generations
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
    """One measured request (a turn of the main conversation, or a side request)."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    cold_ttft_s: float
    shared: int = 0
    """The longest prefix the prompt shares with any earlier request of the run."""
    kind: str = "main"
    baseline_ttft_s: float | None = None
    """TTFT on the baseline engine (``--agent-baseline``), None without one."""

    @property
    def cached_fraction(self) -> float:
        """Share of the prompt served from the prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def speedup(self) -> float:
        """Cold TTFT over cached TTFT."""
        return self.cold_ttft_s / self.ttft_s if self.ttft_s > 0 else 0.0


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
    side_requests: bool = False,
    baseline: bool = False,
) -> dict[str, Any]:
    """Replay the session; return per-turn numbers and the summary the targets need.

    ``sessions`` conversations (each with its own system prompt) take turns in
    round-robin; ``turns`` counts the turns of each. ``restart_at=N`` shuts the measured
    runtime down after turn N (counted from 1) and builds a new one, as a server restart
    would: what survives is what its plugins kept outside the process. ``make_runtime``
    builds the measured runtime (default: installed plugins, a 100000-token prefix cache);
    the cold side is always a runtime without prefix cache. ``side_requests`` adds, after
    each main turn, a request sharing its system prompt and tools with a first user
    message of its own (an agent's title or sub-agent request); ``baseline`` measures
    every request on a third runtime with whole-entry prefix caching as well.
    """
    build = make_runtime or (lambda: default_runtime(model))
    warm, cold = build(), default_runtime(model, "0")
    base = default_runtime(model, whole_entries=True) if baseline else None
    results: list[list[Turn]] = [[] for _ in range(sessions)]
    ordered: list[Turn] = []
    seen: list[tuple[int, ...]] = []
    computed = {"measured": 0, "baseline": 0}

    def measure(messages: list[dict[str, Any]], kind: str) -> Turn:
        spec = RequestSpec(
            prompt=ChatPrompt(messages, TOOLS),
            sampling=SamplingParams(),
            new_id=lambda: f"agent-{kind}",
            max_tokens=max_tokens,
        )
        (built,) = build_generations(warm, spec)  # the path an HTTP chat request takes
        request = built.request
        prompt = request.prompt_tokens
        before = processed_tokens(warm), processed_tokens(base)
        ttft, finish = time_to_first_token(warm, request)
        base_ttft = time_to_first_token(base, request)[0] if base is not None else None
        computed["measured"] += processed_tokens(warm) - before[0]
        computed["baseline"] += processed_tokens(base) - before[1]
        cold_ttft, _ = time_to_first_token(
            cold, attrs.evolve(request, checkpoints=(), boundaries=())
        )
        shared = shared_prefix(prompt, seen)
        seen.append(prompt)
        cached = finish.usage.cached_tokens
        ordered.append(Turn(len(prompt), cached, ttft, cold_ttft, shared, kind, base_ttft))
        return ordered[-1]

    try:
        chats = [_opening(number, system_tokens) for number in range(sessions)]
        for turn in range(turns):
            for number, messages in enumerate(chats):
                results[number].append(measure(messages, "main"))
                if side_requests:
                    measure(_side_request(messages, turn), "side")
                messages += _next_messages(turn)
            if restart_at is not None and turn + 1 == restart_at:
                warm.engine.shutdown()
                warm = build()
        cache_stats = {
            k: v for k, v in warm.engine.stats().items() if k.startswith("prefix_cache_")
        }
    finally:
        for rt in (warm, cold, base):
            if rt is not None:
                rt.engine.shutdown()
    out = {**_summary(results, restart_at), "prefix_cache": cache_stats}
    if side_requests or base is not None:
        out.update(_requests_summary(ordered, seen, computed, base is not None))
    return out


SIDE_REQUEST = "Write a 5-10 word title for the conversation so far. Reply with the title only."


def _side_request(messages: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """A request an agent sends beside its main turn (a title, a sub-agent): the same
    system prompt and tools, then a first user message of its own."""
    return [messages[0], {"role": "user", "content": f"{SIDE_REQUEST} (turn {turn})"}]


def _distinct_tokens(prompts: list[tuple[int, ...]]) -> int:
    """How many nodes a token trie of ``prompts`` has: the tokens a server that never
    computed a prefix twice would process."""
    return sum(len(p) - shared_prefix(p, prompts[:i]) for i, p in enumerate(prompts))


def _requests_summary(
    requests: list[Turn],
    seen: list[tuple[int, ...]],
    computed: dict[str, int],
    with_baseline: bool,
) -> dict[str, Any]:
    """Every request in order, and how much prompt processing the run took against the
    distinct tokens it sent."""
    later = [t for t in requests if t.shared > 0]
    distinct = _distinct_tokens(seen)
    out: dict[str, Any] = {
        "requests": [_turn_body(t) for t in requests],
        "distinct_tokens": distinct,
        "computed_tokens": computed["measured"],
        "computed_over_distinct": round(computed["measured"] / max(1, distinct), 3),
        "min_cached_of_shared": round(min((_ofshared_prefix(t) for t in later), default=1.0), 4),
    }
    if with_baseline:
        out["baseline_computed_tokens"] = computed["baseline"]
        out["baseline_computed_over_distinct"] = round(computed["baseline"] / max(1, distinct), 3)
    return out


def _ofshared_prefix(t: Turn) -> float:
    """Cached tokens over the prefix shared with earlier requests (1.0 when none)."""
    return min(1.0, t.cached_tokens / t.shared) if t.shared else 1.0


def _opening(session: int, system_tokens: int) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"Session {session}. " + _system_prompt(system_tokens)},
        {"role": "user", "content": "Refactor the project; start by reading module 0."},
    ]


def _turn_body(t: Turn) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": t.kind,
        "prompt_tokens": t.prompt_tokens,
        "shared": t.shared,
        "cached_tokens": t.cached_tokens,
        "cached_fraction": round(t.cached_fraction, 4),
        "cached_of_shared": round(_ofshared_prefix(t), 4),
        "ttft_s": round(t.ttft_s, 4),
        "cold_ttft_s": round(t.cold_ttft_s, 4),
        "speedup": round(t.speedup, 2),
    }
    if t.baseline_ttft_s is not None:
        out["baseline_ttft_s"] = round(t.baseline_ttft_s, 4)
    return out


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
    group.add_argument(
        "--agent-shape",
        choices=("short", "claude-code"),
        default="short",
        help="short: a small tool call and result per turn; claude-code: a session at its "
        "real size (~17.5K tokens of system prompt and 24 tools, a ~7K-token tool result "
        "and a reminder per turn, a side request after each turn, a compaction at the end; "
        "--agent-turns 34 reaches 256K tokens)",
    )
    group.add_argument(
        "--agent-result-tokens", type=int, default=7_000,
        help="claude-code shape: tokens of each tool result",
    )  # fmt: skip
    group.add_argument(
        "--agent-no-cold", action="store_true",
        help="claude-code shape: skip the cold runs of the first and last turns",
    )  # fmt: skip
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
        "--agent-side-requests",
        action="store_true",
        help="after each turn, a side request sharing the system prompt and tools (a title "
        "or sub-agent request), as Claude Code sends",
    )
    group.add_argument(
        "--agent-baseline",
        choices=("none", "whole-entries"),
        default="none",
        help="also run every request on an engine with the whole-entry prefix cache mlxcore "
        "had before the radix tree, side by side",
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
    if args.agent_shape == "claude-code":
        from mlxcore.bench.agent_long import print_rows, run_long_session  # heavier imports
        from mlxcore.bench.agent_shapes import SessionShape

        shape = SessionShape(turns=args.agent_turns, result_tokens=args.agent_result_tokens)
        long = run_long_session(
            model, shape, sessions=args.agent_sessions, make_runtime=make_runtime,
            cold=not args.agent_no_cold,
        )  # fmt: skip
        if getattr(args, "json", False):
            print(json.dumps(long, indent=2))
        else:
            print_rows(long)
            print(json.dumps(long["targets"]))
        return 0
    result = run_agent_session(
        model,
        turns=args.agent_turns,
        system_tokens=args.agent_system_tokens,
        sessions=args.agent_sessions,
        restart_at=args.restart_at,
        make_runtime=make_runtime,
        side_requests=args.agent_side_requests,
        baseline=args.agent_baseline == "whole-entries",
    )
    targets = {
        "cached_fraction_after_first >= 0.9": result["min_cached_fraction_after_first"] >= 0.9,
        "ttft_speedup_after_first >= 10": result["min_speedup_after_first"] >= 10,
    }
    if "speedup_after_restart" in result:
        targets["ttft_speedup_after_restart >= 10"] = result["speedup_after_restart"] >= 10
    if "computed_over_distinct" in result:
        targets["computed_over_distinct <= 1.2"] = result["computed_over_distinct"] <= 1.2
        targets["cached_of_shared >= 0.9"] = result["min_cached_of_shared"] >= 0.9
    result["targets"] = targets
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
        return 0
    if "requests" in result:
        _print_requests(result)
    else:
        _print_turns(result)
    print(json.dumps(result["targets"]))
    return 0


def _print_turns(result: dict[str, Any]) -> None:
    print(f"{'turn':>4} {'ses':>3} {'prompt':>7} {'cached':>7} {'share':>6} {'TTFT s':>8} "
          f"{'cold s':>8} {'x':>7}")  # fmt: skip
    for session, turns in enumerate(result.get("sessions", [result["turns"]])):
        for i, t in enumerate(turns):
            print(
                f"{i + 1:>4} {session:>3} {t['prompt_tokens']:>7} {t['cached_tokens']:>7} "
                f"{t['cached_fraction']:>6.3f} {t['ttft_s']:>8.3f} {t['cold_ttft_s']:>8.3f} "
                f"{t['speedup']:>7.1f}"
            )


def _print_requests(result: dict[str, Any]) -> None:
    print(f"{'#':>3} {'kind':>4} {'prompt':>7} {'shared':>7} {'cached':>7} {'of shr':>6} "
          f"{'TTFT s':>8} {'base s':>8} {'cold s':>8}")  # fmt: skip
    for i, t in enumerate(result["requests"]):
        base = t.get("baseline_ttft_s")
        print(
            f"{i + 1:>3} {t['kind']:>4} {t['prompt_tokens']:>7} {t['shared']:>7} "
            f"{t['cached_tokens']:>7} {t['cached_of_shared']:>6.3f} {t['ttft_s']:>8.3f} "
            f"{'-' if base is None else f'{base:.3f}':>8} {t['cold_ttft_s']:>8.3f}"
        )
    line = (
        f"prompt tokens computed {result['computed_tokens']} for "
        f"{result['distinct_tokens']} distinct ({result['computed_over_distinct']}x)"
    )
    if "baseline_computed_tokens" in result:
        line += (
            f"; whole-entry baseline {result['baseline_computed_tokens']} "
            f"({result['baseline_computed_over_distinct']}x)"
        )
    print(line)
