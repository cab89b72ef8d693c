"""Micro-benchmark: how fast each registered parser consumes streamed model text.

Every tool and reasoning parser of the built-in and autoloaded plugins is fed a
realistic response in its own format (reasoning, prose with unicode, ``<`` and
braces, several tool calls with nested arguments) in token-sized pieces of
``--chunk`` characters (default 4), one fresh parser per response, as the server
does per request; responses are repeated until ``--megabytes`` of UTF-8 text
went through. The best of ``--repeat`` runs is reported in MB/s (10^6 bytes of
model text per second of this process's CPU time, and of wall time, which other
processes on a busy machine lower) with the CPU time per ``feed`` call; the
target is at least 1 MB/s of CPU time per parser (a model streams a few kB/s,
so parsing must be negligible).

    .venv/bin/python scripts/parser_throughput.py [--megabytes 1] [--chunk 4] [--repeat 3]

Exit code 1 when a parser is below ``--target`` MB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from mlxcore.hooks import PluginHooks
from mlxcore.parsers.base import ParsedDelta, ReasoningParser, ToolParser
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.registry import Registry
from mlxcore.testing.conformance import DEFAULT_TOOLS

Q = '<|"|>'
PROSE = (
    "Sure - here is what I found. The forecast for Zürich says 3 °C < 5 °C, so pack a coat; "
    'the API returned {"status": "ok", "items": [1, 2, 3]} and a note: "use <b>bold</b> '
    'sparingly". 日本語のテキストも少し。 Emoji 🎉 too. Next, I will compare a<b and c>d, '
    "then summarise the three options in a list:\n\n1. first option\n2. second option\n"
    "3. third option\n\n"
)
REASONING = (
    "The user asks about the weather and hotels. I need two lookups: get_weather for "
    "Paris over 3 days, then search for Rome hotels. Careful with units {celsius} and "
    'quotes "like this"; no need for <b>markup</b>. 思考: 二つの検索。\n'
)


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes/Qwen JSON call block."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def xml_call(name: str, arguments: dict[str, Any]) -> str:
    """A Qwen3-Coder XML call block."""
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def gemma_value(value: Any) -> str:
    """A value in Gemma 4's call syntax."""
    if isinstance(value, str):
        return f"{Q}{value}{Q}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_value(v) for v in value) + "]"
    return json.dumps(value)


def gemma_call(name: str, arguments: dict[str, Any]) -> str:
    """A Gemma 4 call block."""
    return f"<|tool_call>call:{name}{gemma_value(arguments)}<tool_call|>"


def minimax_call(name: str, arguments: dict[str, Any]) -> str:
    """A MiniMax-M2 call block with one invoke."""
    params = "".join(
        f'<parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</parameter>\n'
        for k, v in arguments.items()
    )
    return f'<minimax:tool_call>\n<invoke name="{name}">\n{params}</invoke>\n</minimax:tool_call>'


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_weather", {"city": 'Paris "centre" {1er}', "days": 3, "unit": "celsius"}),
    ("search", {"query": "Rome hotels < 200 € near 東京 café", "limit": 5}),
]
CALL_WRITERS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "hermes": hermes_call,
    "qwen3_coder": xml_call,
    "gemma4": gemma_call,
    "minimax_m2": minimax_call,
}
REASONING_WRAP: dict[str, tuple[str, str, bool]] = {
    # name: (opening written by the model, closing, whether the prompt opened it)
    "think": ("<think>\n", "\n</think>\n\n", False),
    "gemma4": ("<|channel>thought\n", "<channel|>", False),
    "minimax_m2": ("", "\n</think>\n\n", True),
}
FAMILY_CALLS = {"think": "hermes", "gemma4": "gemma4", "minimax_m2": "minimax_m2"}


def response(kind: str, name: str) -> tuple[str, bool, int]:
    """(model text for parser ``name`` of ``kind``, starts in reasoning, calls expected)."""
    writer = CALL_WRITERS.get(FAMILY_CALLS.get(name, name) if kind == "reasoning" else name)
    calls = [writer(n, a) for n, a in CALLS] if writer else []
    answer = PROSE + "Let me check.\n\n" + "\n".join(calls) + "\n\n" + PROSE
    if kind == "tool":
        return answer, False, len(calls)
    opening, closing, opened = REASONING_WRAP.get(name, ("", "", False))
    return opening + REASONING * 3 + closing + answer, opened, 0


def feed_all(parser: ToolParser | ReasoningParser, pieces: Sequence[str]) -> ParsedDelta:
    """Feed ``pieces`` then finish; everything released."""
    total = ParsedDelta()
    for piece in pieces:
        total.extend(parser.feed(piece))
    total.extend(parser.finish())
    return total


def feed_only(parser: ToolParser | ReasoningParser, pieces: Sequence[str]) -> None:
    """Feed ``pieces`` then finish, keeping nothing: the parser's own cost."""
    feed = parser.feed
    for piece in pieces:
        feed(piece)
    parser.finish()


def bench(
    make: Callable[[], ToolParser | ReasoningParser],
    text: str,
    *,
    chunk: int,
    megabytes: float,
    repeat: int,
) -> tuple[float, float, float, ParsedDelta]:
    """Best MB/s over ``repeat`` runs by CPU time and by wall time, CPU microseconds
    per feed, and one run's output."""
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    size = len(text.encode("utf-8"))
    rounds = max(1, int(megabytes * 1e6 / size))
    sample = feed_all(make(), pieces)
    cpu = wall = float("inf")
    for _ in range(repeat):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            feed_only(make(), pieces)
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start_wall)
    total = size * rounds / 1e6
    return total / cpu, total / wall, cpu / (rounds * len(pieces)) * 1e6, sample


def factory(kind: str, cls: Any, opened: bool) -> Callable[[], ToolParser | ReasoningParser]:
    """Fresh parsers of ``cls`` as the server makes them per request (the default tools
    for a tool parser, the prompt's reasoning state for a reasoning parser)."""
    if kind == "tool":
        tools = list(DEFAULT_TOOLS)
        return lambda: cls(tools)
    return lambda: cls(starts_in_reasoning=opened)


def machine() -> str:
    """One line describing this machine and interpreter."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu}, {cores} cores available, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table; exit 1 when a parser misses the target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=1.0, help="text per run (default 1)")
    parser.add_argument("--chunk", type=int, default=4, help="characters per feed (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best counts (default 3)")
    parser.add_argument("--target", type=float, default=1.0, help="MB/s required (default 1)")
    args = parser.parse_args(argv)

    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    hooks = PluginHooks(pm)
    registries: list[tuple[str, Registry[Any]]] = [
        ("tool", hooks.tool_parsers()),
        ("reasoning", hooks.reasoning_parsers()),
    ]
    print(f"machine: {machine()}")
    print(
        f"chunk: {args.chunk} characters per feed, {args.megabytes:g} MB per run, "
        f"best of {args.repeat}"
    )
    print(
        f"{'kind':<10} {'parser':<12} {'MB/s cpu':>9} {'MB/s wall':>9} {'us/feed':>8} "
        f"{'calls':>6}  verdict"
    )
    slow = []
    for kind, registry in registries:
        for entry in registry:
            text, opened, want_calls = response(kind, entry.name)
            make = factory(kind, entry.item, opened)
            rate, wall_rate, per_feed, sample = bench(
                make, text, chunk=args.chunk, megabytes=args.megabytes, repeat=args.repeat
            )
            got = len(sample.tool_calls)
            if kind == "tool" and got != want_calls:
                print(
                    f"error: {entry.name} found {got} calls, expected {want_calls}", file=sys.stderr
                )
                return 2
            ok = rate >= args.target
            if not ok:
                slow.append(entry.name)
            verdict = "ok" if ok else f"BELOW {args.target:g} MB/s"
            print(
                f"{kind:<10} {entry.name:<12} {rate:>9.2f} {wall_rate:>9.2f} {per_feed:>8.2f} "
                f"{got:>6}  {verdict}"
            )
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
