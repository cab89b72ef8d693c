"""The output pipeline: UTF-8-safe streaming, stop strings, parsers, finish reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcore.engine.strategies import StepToken
from mlxcore.output import OutputPipeline
from mlxcore.output.stops import StopMatcher
from mlxcore.parsers.base import ParsedDelta, ToolCall, ToolParser


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


@pytest.mark.parametrize(
    ("pieces", "stops", "expected", "matched"),
    [
        (["hello wor", "ld STOP", " after"], ["STOP"], "hello world ", "STOP"),
        (["a", "b", "S", "T", "O", "P", "c"], ["STOP"], "ab", "STOP"),
        (["abc ST", "ONE"], ["STOP"], "abc STONE", None),
        (["x<", "/end>", "y"], ["</end>", "zz"], "x", "</end>"),
        (["one two three"], ["three", "two"], "one ", "two"),
        (["trailing ST"], ["STOP"], "trailing ST", None),
        (["no stops at all"], [], "no stops at all", None),
    ],
)
def test_stop_matcher(
    pieces: list[str], stops: list[str], expected: str, matched: str | None
) -> None:
    matcher = StopMatcher(stops)
    assert feed_all(matcher, pieces) == expected
    assert matcher.matched == matched


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3: Path):
    from mlxcore.models.loader import load_model

    return load_model(tiny_qwen3).tokenizer


TEXT = "Grüße 👋🏽 from 東京, naïve café — ∑x² ≤ 10."


def push_one_by_one(pipe: OutputPipeline, ids: list[int]) -> list[str]:
    pieces = [pipe.push([StepToken(t)]).content for t in ids]
    pieces.append(pipe.finish("stop").content)
    return pieces


def test_multibyte_characters_never_reach_the_client_broken(tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT.split())  # some characters span several tokens
    pieces = push_one_by_one(OutputPipeline(tokenizer.detokenizer), ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


def test_stop_string_split_across_tokens_is_hidden(tokenizer) -> None:
    ids = tokenizer.encode("The answer is 42. END OF ANSWER and more", add_special_tokens=False)
    pipe = OutputPipeline(tokenizer.detokenizer, stops=["END OF"])
    pieces = []
    for t in ids:
        pieces.append(pipe.push([StepToken(t)]).content)
        if pipe.stop_matched:
            break
    final = pipe.finish("length")
    assert "".join(pieces) + final.content == "The answer is 42. "
    assert final.finish_reason == "stop"


def test_hidden_ids_are_not_shown(tokenizer) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer.encode("done", add_special_tokens=False), eos]
    pipe = OutputPipeline(tokenizer.detokenizer, hidden_ids=frozenset({eos}))
    assert "".join(push_one_by_one(pipe, ids)) == "done"


class BracketCalls(ToolParser):
    """[[name]] anywhere is a call; a trailing '[' is held back."""

    name = "bracket-test"

    def __init__(self, tools=None) -> None:
        super().__init__(tools)
        self.held = ""

    def feed(self, text: str) -> ParsedDelta:
        buf = self.held + text
        out = ParsedDelta()
        while "[[" in buf and "]]" in buf[buf.index("[[") :]:
            start = buf.index("[[")
            end = buf.index("]]", start)
            out.content += buf[:start]
            out.tool_calls.append(ToolCall(buf[start + 2 : end], "{}"))
            buf = buf[end + 2 :]
        cut = buf.find("[")
        self.held, out.content = (
            (buf[cut:], out.content + buf[:cut]) if cut >= 0 else ("", out.content + buf)
        )
        return out

    def finish(self) -> ParsedDelta:
        held, self.held = self.held, ""
        return ParsedDelta(content=held)


def test_tool_calls_set_finish_reason_and_stay_out_of_content(tokenizer) -> None:
    ids = tokenizer.encode("Let me check. [[get_weather]]", add_special_tokens=False)
    pipe = OutputPipeline(tokenizer.detokenizer, tools=BracketCalls([]))
    deltas = [pipe.push([StepToken(t)]) for t in ids] + [pipe.finish("stop")]
    content = "".join(d.content for d in deltas)
    calls = [c.name for d in deltas for c in d.tool_calls]
    assert "[[" not in content and content.strip() == "Let me check."
    assert calls == ["get_weather"]
    assert deltas[-1].finish_reason == "tool_calls"


def test_length_finish_keeps_its_reason_and_flushes(tokenizer) -> None:
    ids = tokenizer.encode("unfinished [[call", add_special_tokens=False)
    pipe = OutputPipeline(tokenizer.detokenizer, tools=BracketCalls([]))
    text = "".join(pipe.push([StepToken(t)]).content for t in ids)
    final = pipe.finish("length")
    assert final.finish_reason == "length"
    assert text + final.content == "unfinished [[call"
