"""Tool-call arguments streamed while the model writes them (Hermes JSON, Qwen XML and
MiniMax ``<invoke>`` bodies): the fragments of a call, in order, begin its final
arguments text exactly, arrive before the call is complete, and a call cut short is
aborted (its text then comes as content, as in a non-streamed answer)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mlxcore.output.calls import CallStream
from mlxcore.output.pipeline import OutputDelta
from mlxcore.parsers.base import ParsedDelta, ToolParser
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore_minimax.tools import MiniMaxM2ToolParser

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flags": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object"},
        "text": {"type": "string"},
    },
}
TOOLS = [{"type": "function", "function": {"name": "write", "parameters": SCHEMA}}]


def random_arguments(rng: random.Random) -> dict[str, Any]:
    alphabet = 'abc xyz\n\t"\\/<>é東👋{}[],:'
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
    args: dict[str, Any] = {"path": f"dir/{rng.randrange(1000)}.txt", "text": text}
    if rng.random() < 0.5:
        args["count"] = rng.randrange(-50, 50000)
    if rng.random() < 0.5:
        args["ratio"] = rng.choice([0.5, 1e-3, 12.25])
    if rng.random() < 0.5:
        args["flags"] = [rng.choice(["-a", "-b", "x y"]) for _ in range(rng.randrange(3))]
    if rng.random() < 0.3:
        args["options"] = {"deep": {"list": [1, 2, {"k": "v"}]}}
    keys = list(args)
    rng.shuffle(keys)
    return {k: args[k] for k in keys}


def hermes_text(args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": "write", "arguments": args}) + "\n</tool_call>"


def xml_text(args: dict[str, Any]) -> str:
    body = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function=write>\n{body}</function>\n</tool_call>"


def minimax_text(args: dict[str, Any]) -> str:
    body = "".join(
        f'<parameter name="{k}">\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n'
        for k, v in args.items()
    )
    return f'<minimax:tool_call>\n<invoke name="write">\n{body}</invoke>\n</minimax:tool_call>'


def run(parser: ToolParser, pieces: list[str]) -> tuple[list[ParsedDelta], ParsedDelta]:
    steps = [parser.feed(p) for p in pieces]
    return steps, parser.finish()


def cut(text: str, rng: random.Random) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        size = rng.choice([1, 2, 3, 5, 8, 40])
        out.append(text[pos : pos + size])
        pos += size
    return out


@pytest.mark.parametrize(
    ("make", "write"),
    [
        (HermesToolParser, hermes_text),
        (Qwen3CoderToolParser, xml_text),
        (MiniMaxM2ToolParser, minimax_text),
    ],
    ids=["hermes-json", "qwen-xml", "minimax-invoke"],
)
def test_fragments_begin_the_final_arguments_and_come_early(make: Any, write: Any) -> None:
    rng = random.Random(5)
    early = 0
    tricky = [{"path": "<x", "text": "<b>bold</b> and <"}, {"text": "\n\n<\r\n", "path": "<"}]
    for i in range(300):
        args = tricky[i] if i < len(tricky) else random_arguments(rng)
        steps, last = run(make(TOOLS), cut("Sure. " + write(args), rng))
        calls = [c for s in [*steps, last] for c in s.tool_calls]
        assert len(calls) == 1, calls
        call = calls[0]
        assert json.loads(call.arguments) == args
        parts = [p for s in [*steps, last] for p in s.call_parts]
        assert all(p.id == call.id and p.name == "write" and not p.aborted for p in parts)
        streamed = "".join(p.arguments for p in parts)
        assert call.arguments.startswith(streamed)
        before = "".join(p.arguments for s in steps for p in s.call_parts)
        early += len(before) >= len(call.arguments) // 2
    assert early >= 270  # most of each call streamed before the call completed


def test_a_call_cut_short_is_aborted_and_its_text_is_content() -> None:
    text = 'Sure.<tool_call>\n{"name": "write", "arguments": {"path": "a.txt", "text": "half'
    steps, last = run(HermesToolParser(TOOLS), [text[i : i + 4] for i in range(0, len(text), 4)])
    parts = [p for s in [*steps, last] for p in s.call_parts]
    assert parts[0].name == "write" and parts[-1].aborted
    assert not [c for s in [*steps, last] for c in s.tool_calls]
    content = "".join(s.content for s in [*steps, last])
    assert content == text  # exactly what a non-streamed answer shows


def test_call_stream_events_for_front_ends() -> None:
    rng = random.Random(1)
    args = random_arguments(rng)
    parser = HermesToolParser(TOOLS)
    stream = CallStream()
    events = []
    for piece in cut(hermes_text(args) + hermes_text({"path": "b"}), rng):
        d = parser.feed(piece)
        events += stream.events(OutputDelta(tool_calls=d.tool_calls, call_parts=d.call_parts))
    d = parser.finish()
    events += stream.events(OutputDelta(tool_calls=d.tool_calls, call_parts=d.call_parts))
    kinds = [e.kind for e in events]
    assert kinds[0] == "open" and kinds.count("open") == 2 and kinds.count("close") == 2
    for index in (0, 1):
        mine = [e for e in events if e.index == index]
        assert mine[0].kind == "open" and mine[-1].kind == "close"
        closing = mine[-1].call
        assert closing is not None
        assert "".join(e.text for e in mine if e.kind == "arguments") == closing.arguments
    assert json.loads(events[-1].call.arguments) == {"path": "b"}  # type: ignore[union-attr]


def test_unknown_tools_and_non_string_values_are_not_streamed_early() -> None:
    text = '<tool_call>\n{"name": "other", "arguments": {"text": "abcdefghijklmnop"}}\n</tool_call>'
    steps, _ = run(HermesToolParser(TOOLS), [text[i : i + 3] for i in range(0, len(text), 3)])
    assert not [p for s in steps for p in s.call_parts]
    text = '<tool_call>\n{"name": "write", "arguments": {"count": "12345678901234"}}'
    steps, _ = run(HermesToolParser(TOOLS), [text[i : i + 3] for i in range(0, len(text), 3)])
    streamed = "".join(p.arguments for s in steps for p in s.call_parts)
    assert streamed == "{"  # "count" is typed integer: its text is not sent as a string


@pytest.mark.parametrize("mode", ["named", "required"])
def test_a_forced_tool_choice_streams_its_call(mode: str) -> None:
    """``tool_choice`` named or required: the constrained JSON is streamed as written."""
    from mlxcore.structured import ConstrainedToolCallParser

    rng = random.Random(3)
    args = random_arguments(rng)
    text = json.dumps(args, ensure_ascii=False)
    if mode == "required":
        text = json.dumps([{"name": "write", "parameters": args}], ensure_ascii=False)
    parser = ConstrainedToolCallParser(TOOLS, mode=mode, name="write")  # type: ignore[arg-type]
    steps, last = run(parser, cut(text, rng))
    parts = [p for s in steps for p in s.call_parts]
    (call,) = last.tool_calls
    assert json.loads(call.arguments) == args
    assert parts and all(p.id == call.id for p in parts)
    streamed = "".join(p.arguments for p in parts)
    assert call.arguments.startswith(streamed) and len(streamed) >= len(call.arguments) // 2
