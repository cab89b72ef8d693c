"""The streaming machinery shared by every parser: hold-back, blocks, logging, cost."""

from __future__ import annotations

import logging
import time

import pytest

from mlxcore.parsers.base import ParsedDelta
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.parsers.streaming import BracketScanner, MarkerSet, TailFinder, WhitespaceGate
from mlxcore.parsers.think import ThinkReasoningParser
from mlxcore.testing.conformance import DEFAULT_TOOLS, run_pieces

TOOLS = list(DEFAULT_TOOLS)


def test_marker_set_finds_earliest_and_longest() -> None:
    markers = MarkerSet(["<a>", "<ab>", "</a>"])
    assert markers.find("x <ab> <a>") == (2, "<ab>")
    assert markers.find("nothing") == (-1, "")
    assert markers.find("<a> <a>", 1) == (4, "<a>")
    assert markers.partial("text <a") == 2
    assert markers.partial("text </") == 2
    assert markers.partial("text <x") == 0
    assert markers.partial("") == 0
    with pytest.raises(ValueError):
        MarkerSet([])


def test_tail_finder_sees_a_marker_split_across_pieces() -> None:
    finder = TailFinder("</tool_call>")
    assert finder.add("abc</tool") == -1
    assert finder.add("_ca") == -1
    assert finder.add("ll>rest") == 3
    assert finder.text() == "abc</tool_call>rest"
    assert len(finder) == len("abc</tool_call>rest")


@pytest.mark.parametrize(
    ("pieces", "end"),
    [
        (['{"a": "}]", "b": [1, {"c": 2}]} tail'], 31),
        (['{"a": "\\"}"}'], 12),
        (["  [1, [2], 3]"], 13),
        (["{", '"k"', ": ", "1}", "x"], 8),
    ],
)
def test_bracket_scanner_finds_the_end(pieces: list[str], end: int) -> None:
    scanner = BracketScanner()
    results = [scanner.add(p) for p in pieces]
    assert end in results and not scanner.failed


def test_bracket_scanner_raw_quote_split_across_pieces() -> None:
    scanner = BracketScanner(raw_quote='<|"|>')
    text = '{a:<|"|>}{"]<|"|>,b:[1]}'
    results = [scanner.add(ch) for ch in text]
    assert results.index(len(text)) == len(text) - 1
    assert all(r == -1 for r in results[:-1])


@pytest.mark.parametrize("text", ["x{}", "{]", "}"])
def test_bracket_scanner_fails_on_non_values(text: str) -> None:
    scanner = BracketScanner()
    assert scanner.add(text) == -1 and scanner.failed


def test_whitespace_gate() -> None:
    gate = WhitespaceGate()
    assert gate.push("Hello ") == "Hello"
    assert gate.push("world\n\n") == " world"
    gate.block()
    assert gate.push("\n  ") == ""
    assert gate.push(" again ") == "\n   again"
    assert gate.flush() == " "
    fresh = WhitespaceGate(after_block=True)
    assert fresh.push("\n\n") == "" and fresh.flush() == ""
    assert fresh.push(" x") == "x"


def test_truncated_and_malformed_calls_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mlxcore.parsers")
    out = HermesToolParser(TOOLS).parse('<tool_call>{"name": "search", "argu')
    assert out.content == '<tool_call>{"name": "search", "argu' and not out.tool_calls
    out = HermesToolParser(TOOLS).parse("<tool_call>{oops}</tool_call>")
    assert out.content == "<tool_call>{oops}</tool_call>"
    records = [r for r in caplog.records if r.name == "mlxcore.parsers.hermes"]
    assert [("truncated" in r.getMessage(), "malformed" in r.getMessage()) for r in records] == [
        (True, False),
        (False, True),
    ]


def test_undecided_text_is_released_as_soon_as_it_is_decided() -> None:
    """Degraded-form candidates naming unknown tools are released before finish."""
    parser = HermesToolParser(TOOLS)
    released = ParsedDelta()
    for ch in "<function=unknown>\n<parameter=a>\n1\n</parameter>\n</function>\nmore text":
        released.extend(parser.feed(ch))
    assert released.content.startswith("<function=unknown>\n<parameter=a>")
    parser = HermesToolParser(TOOLS)
    for ch in '{"name": "nope", "arguments": {':
        released.extend(parser.feed(ch))
    assert parser.feed("").content == "" and '{"name": "nope"' in released.content


def test_call_ids_are_fresh_and_openai_shaped() -> None:
    text = '<tool_call>{"name": "search", "arguments": {}}</tool_call>' * 3
    calls = HermesToolParser(TOOLS).parse(text).tool_calls
    assert len({c.id for c in calls}) == 3
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)


JSON_CALL = ('<tool_call>{"name": "search", "arguments": {"query": "', '"}}</tool_call>')
XML_CALL = (
    "<tool_call>\n<function=search>\n<parameter=query>\n",
    "\n</parameter>\n</function>\n</tool_call>",
)


@pytest.mark.parametrize(
    ("make", "around"),
    [
        (lambda: HermesToolParser(TOOLS), JSON_CALL),
        (lambda: Qwen3CoderToolParser(TOOLS), XML_CALL),
        (lambda: HermesToolParser(TOOLS), ('[Calling tool: search({"query": "', '"})]')),
        (lambda: HermesToolParser(TOOLS), ("", "")),
        (lambda: ThinkReasoningParser(starts_in_reasoning=True), ("", "</think>done")),
    ],
    ids=["json-block", "xml-block", "degraded", "content", "reasoning"],
)
def test_work_is_proportional_to_the_text(make, around, monkeypatch) -> None:
    """Every character handed to a scanner, gate or block buffer is counted: the
    total stays a small multiple of the output, however it is cut (no re-scan of
    what was already decided; a quadratic re-join would blow the bound)."""
    counted = [0]

    def counting(cls: type, method: str, size) -> None:
        original = getattr(cls, method)

        def wrapper(self, *args):
            result = original(self, *args)
            counted[0] += size(self, args, result)
            return result

        monkeypatch.setattr(cls, method, wrapper)

    counting(MarkerSet, "find", lambda s, a, r: len(a[0]) - (a[1] if len(a) > 1 else 0))
    counting(MarkerSet, "partial", lambda s, a, r: min(len(a[0]), len(max(s.markers, key=len))))
    counting(TailFinder, "add", lambda s, a, r: len(a[0]) + len(s.marker) - 1)
    counting(TailFinder, "text", lambda s, a, r: len(r))
    counting(BracketScanner, "add", lambda s, a, r: len(a[0]))
    counting(WhitespaceGate, "push", lambda s, a, r: len(a[0]))
    text = around[0] + "word, " * 5_000 + around[1]
    for size in (1, 3, 64):
        counted[0] = 0
        run_pieces(make(), [text[i : i + size] for i in range(0, len(text), size)])
        assert counted[0] < 30 * len(text), (size, counted[0] / len(text))


@pytest.mark.parametrize(
    ("make", "around"),
    [
        (lambda: HermesToolParser(TOOLS), JSON_CALL),
        (lambda: ThinkReasoningParser(starts_in_reasoning=True), ("", "</think>done")),
    ],
    ids=["json-block", "reasoning"],
)
def test_time_is_linear_in_the_output(make, around: tuple[str, str]) -> None:
    """Feeding 4x more text costs about 4x CPU time, not 16x (loose bound: shared CI)."""

    def cpu(n: int) -> float:
        text = around[0] + "word, " * n + around[1]
        pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            run_pieces(make(), pieces)
            best = min(best, time.process_time() - start)
        return best

    small, large = cpu(2_000), cpu(8_000)
    assert large < 10 * small + 0.05, (small, large)
