"""Parser conformance kit: one list of cases, checked every way a parser is fed.

A parser must answer the same whether output arrives at once or in pieces, so
every :class:`Case` is checked in each of :data:`MODES`: ``whole`` (one
``parse``), ``chars`` (one character at a time), ``chunks`` (fixed pieces of
each of :data:`CHUNK_SIZES` characters: 2, 3 and 7), ``random`` (seeded random
pieces) and ``tokens`` (token by token through a real tokenizer's streaming
detokenizer, as the server does), against the expected content, reasoning and
tool calls (names and parsed arguments; ids excepted). Generic checks come
with it: plain text passes through unchanged and is not held back long; an
incomplete marker is held back mid-stream and returned by ``finish``; a fresh
parser finishes empty; tool-call arguments are JSON objects. Subclass
:class:`ParserConformance` in a pytest ``Test*`` class::

    from mlxcore.testing.conformance import Case, ParserConformance

    class TestMyParser(ParserConformance):
        parser_class = MyToolParser
        MARKERS = ("<call>",)
        CASES = [
            Case("one-call", "Hi<call>f(1)</call>", content="Hi", calls=[("f", {"x": 1})]),
            Case("truncated", "Hi<call>f(", content="Hi<call>f("),
        ]

Each case becomes one test per mode (``test_conformance_case[one-call-chars]``);
:func:`check_case` does the same without pytest.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs

from mlxcore.parsers.base import ParsedDelta, ReasoningParser, ToolParser

MODES = ("whole", "chars", "chunks", "random", "tokens")
"""The feeding modes every case is checked in."""

CHUNK_SIZES = (2, 3, 7)
"""Piece lengths of the ``chunks`` mode (``chars`` is size 1, ``whole`` the rest)."""


def tool(name: str, description: str = "", **properties: Any) -> dict[str, Any]:
    """An OpenAI function tool whose parameters have these property schemas::

    tool("get_weather", city={"type": "string"}, days={"type": "integer"})
    """
    params = {"type": "object", "properties": properties}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


DEFAULT_TOOLS: tuple[dict[str, Any], ...] = (
    tool(
        "get_weather",
        "Current weather in a city.",
        city={"type": "string"},
        days={"type": "integer"},
        unit={"type": "string", "enum": ["celsius", "fahrenheit"]},
    ),
    tool("search", "Search the web.", query={"type": "string"}, limit={"type": "number"}),
)
"""Tools given to tool parsers when a case names none."""

DEFAULT_PLAIN_TEXTS: tuple[str, ...] = (
    "Hello, world!",
    "The answer is 42.\n\nIt follows from 6 * 7.",
    "a < b and c > d; x<y; 1 <= 2",
    "<b>bold</b> and <i>italic</i> HTML, <br/> too",
    "Unicode: héllo, 日本語, emoji 🎉, math ∑.",
    "  leading and trailing spaces  ",
    "[a list] {a: set} (parens) [Calling it a day]",
    '{"json": true, "list": [1, 2]}',
    "Line one\n  indented\n\ttabbed\n",
    "",
)
"""Texts without markup: every parser must return them unchanged, as content."""

Outcome = tuple[str, str, list[tuple[str, Any]]]
"""Comparable result: (content, reasoning, [(tool name, parsed arguments)])."""


@attrs.frozen
class Case:
    """One input (``text``, exactly what the model wrote) and the expected
    ``content``, ``reasoning`` and ``calls`` (``(name, arguments)``, arguments as
    parsed values: ``{"days": 3}``). ``tools``: the request's tools for a tool
    parser (``None``: the class's ``TOOLS``); ``starts_in_reasoning``: for a
    reasoning parser, the prompt opened the block."""

    id: str
    text: str
    content: str = ""
    reasoning: str = ""
    calls: Sequence[tuple[str, Mapping[str, Any]]] = attrs.field(default=(), converter=tuple)
    tools: Sequence[Mapping[str, Any]] | None = None
    starts_in_reasoning: bool = False

    def expected(self) -> Outcome:
        """The outcome this case asks for."""
        return self.content, self.reasoning, [(n, dict(a)) for n, a in self.calls]


Parser = ToolParser | ReasoningParser
ParserFactory = Callable[[Case], Parser]


def outcome(delta: ParsedDelta) -> Outcome:
    """``delta`` as a comparable outcome; raises if a call's arguments are not a JSON object."""
    calls = [(call.name, json.loads(call.arguments)) for call in delta.tool_calls]
    bad = [args for _, args in calls if not isinstance(args, dict)]
    assert not bad, f"tool call arguments must be JSON objects: {bad!r}"
    ids = [call.id for call in delta.tool_calls]
    assert all(ids) and len(set(ids)) == len(ids), f"tool call ids must be unique: {ids}"
    return delta.content, delta.reasoning, calls


def run_pieces(parser: Parser, pieces: Sequence[str]) -> tuple[ParsedDelta, ParsedDelta]:
    """Feed ``pieces`` then finish: (everything released, what was released before finish)."""
    total = ParsedDelta()
    for piece in pieces:
        total.extend(parser.feed(piece))
    before = ParsedDelta(total.content, total.reasoning, list(total.tool_calls))
    total.extend(parser.finish())
    return total, before


def split_random(text: str, rng: random.Random, max_len: int = 8) -> list[str]:
    """``text`` cut at random places into pieces of 1 to ``max_len`` characters."""
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, max_len)
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def split_fixed(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of ``size`` characters (the last one may be shorter)."""
    return [text[pos : pos + size] for pos in range(0, len(text), size)]


def split_tokens(text: str, tokenizer: Any) -> list[str]:
    """``text`` as the server sees it: tokenized, then streamed through the
    tokenizer's detokenizer one token at a time (an mlx-lm ``TokenizerWrapper``)."""
    from mlxcore.output.detokenize import continuation_detokenizer

    detok = continuation_detokenizer(tokenizer)
    pieces: list[str] = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        detok.add_token(token)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    return [p for p in pieces if p]


def run_pipeline(
    text: str,
    tokenizer: Any,
    *,
    reasoning: ReasoningParser | None = None,
    tools: ToolParser | None = None,
    engine_reason: str = "stop",
) -> Any:
    """``text`` tokenized and pushed one token at a time through the server's real
    :class:`~mlxcore.output.pipeline.OutputPipeline` with these parser instances;
    returns the merged :class:`~mlxcore.output.pipeline.OutputDelta` (with the
    finish reason the pipeline gives for ``engine_reason``)."""
    from mlxcore.engine.strategies import StepToken
    from mlxcore.output.detokenize import continuation_detokenizer
    from mlxcore.output.pipeline import OutputPipeline

    pipe = OutputPipeline(continuation_detokenizer(tokenizer), reasoning=reasoning, tools=tools)
    steps = [pipe.push([StepToken(t)]) for t in tokenizer.encode(text, add_special_tokens=False)]
    steps.append(pipe.finish(engine_reason))
    total = steps[-1]
    total.content = "".join(s.content for s in steps)
    total.reasoning = "".join(s.reasoning for s in steps)
    total.tool_calls = [c for s in steps for c in s.tool_calls]
    return total


def check_case(
    factory: ParserFactory,
    case: Case,
    mode: str,
    *,
    tokenizer: Any = None,
    seed: int = 0,
    random_splits: int = 4,
) -> None:
    """Raise ``AssertionError`` unless ``case`` gives its expected outcome in ``mode``.

    In ``tokens`` mode a tokenizer that does not give the text back exactly
    (normalisation) is compared against a whole parse of what it gives back.
    """
    expected = case.expected()
    if mode == "whole":
        _compare(outcome(factory(case).parse(case.text)), expected, case, mode)
        return
    if mode not in MODES or (mode == "tokens" and tokenizer is None):
        raise ValueError(f"mode {mode!r} needs a tokenizer or is unknown (known: {MODES})")
    splits = {"random": random_splits, "chunks": len(CHUNK_SIZES)}.get(mode, 1)
    for split in range(splits):
        if mode == "chars":
            pieces = list(case.text)
        elif mode == "chunks":
            pieces = split_fixed(case.text, CHUNK_SIZES[split])
        elif mode == "random":
            pieces = split_random(case.text, random.Random(f"{seed}:{split}:{case.text}"))
        else:
            pieces = split_tokens(case.text, tokenizer)
        want = expected
        joined = "".join(pieces)
        if joined != case.text:  # the tokenizer does not round-trip this text
            want = outcome(factory(case).parse(joined))
        got, _ = run_pieces(factory(case), pieces)
        _compare(outcome(got), want, case, f"{mode} (split {split}: {pieces[:40]!r})")


def _compare(got: Outcome, want: Outcome, case: Case, how: str) -> None:
    if got != want:
        names = ("content", "reasoning", "tool calls")
        diffs = [
            f"  {n}: got {g!r}\n  {' ' * len(n)}  want {w!r}"
            for n, g, w in zip(names, got, want, strict=True)
            if g != w
        ]
        raise AssertionError(f"case {case.id!r} fed {how}:\n" + "\n".join(diffs))


@functools.cache
def loaded_test_model(arch: str) -> Any:
    """A small real test model (:func:`mlxcore.testing.build_test_model`) loaded lazily
    with :func:`mlxcore.models.loader.load_model`, cached for the process: its
    ``tokenizer`` feeds ``tokens`` mode and its ``info`` tests ``matches``."""
    from mlxcore.models.loader import load_model
    from mlxcore.testing.models import build_test_model

    return load_model(build_test_model(arch), lazy=True)


def find_chat_template(name: str, extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> str | None:
    """The text of chat template ``name`` (``"Qwen3.5-4B.jinja"``), or ``None``.

    Looks in mlxcore's test assets, the folders in ``$MLXCORE_CHAT_TEMPLATES``
    (``os.pathsep``-separated), then ``extra_dirs``.
    """
    dirs = [Path(__file__).parent / "assets" / "chat-templates"]
    dirs += [Path(d) for d in os.environ.get("MLXCORE_CHAT_TEMPLATES", "").split(os.pathsep) if d]
    dirs += [Path(d) for d in extra_dirs]
    for folder in dirs:
        path = folder / name
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """Render ``messages`` with a chat template the way transformers does."""
    from transformers.utils.chat_template_utils import render_jinja_template

    kwargs.setdefault("bos_token", "<bos>")
    kwargs.setdefault("eos_token", "<eos>")
    render: Any = render_jinja_template  # returns (rendered conversations, indices)
    rendered, _ = render(
        conversations=[list(messages)],
        tools=list(tools) if tools else None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return str(rendered[0])


def last_turn(rendered: str, header: str, end: str) -> str:
    """The text of the last turn of ``rendered``: after the last ``header``, before
    its ``end`` marker - what a model writes for that turn."""
    start = rendered.rindex(header) + len(header)
    stop = rendered.find(end, start)
    return rendered[start : stop if stop >= 0 else len(rendered)]


class ParserConformance:
    """Pytest mixin: subclass it in a ``Test*`` class and set :attr:`parser_class`.

    Attributes to set:
        parser_class: the :class:`ToolParser` or :class:`ReasoningParser` subclass.
        CASES: the format's cases (or override :meth:`cases`).
        MARKERS: markup the parser holds back while incomplete (``<tool_call>``...).
        PLAIN_TEXTS: texts that must pass through unchanged.
        PROMPTS: for reasoning parsers, ``(prompt text, opens reasoning)`` pairs for
            ``prompt_opens_reasoning``.
        TOOLS: tools for cases that give none.
        tokenizer_fixture: name of a pytest fixture giving a tokenizer, to check
            every case token by token (or override :meth:`conformance_tokenizer`).
    """

    parser_class: ClassVar[type[ToolParser] | type[ReasoningParser]]
    CASES: ClassVar[Sequence[Case]] = ()
    MARKERS: ClassVar[Sequence[str]] = ()
    PLAIN_TEXTS: ClassVar[Sequence[str]] = DEFAULT_PLAIN_TEXTS
    PROMPTS: ClassVar[Sequence[tuple[str, bool]]] = ()
    TOOLS: ClassVar[Sequence[Mapping[str, Any]]] = DEFAULT_TOOLS
    tokenizer_fixture: ClassVar[str | None] = None
    RANDOM_SPLITS: ClassVar[int] = 4
    SEED: ClassVar[int] = 0
    MAX_HELD: ClassVar[int] = 64
    """Plain text may be held back at most this many characters before ``finish``."""

    def cases(self) -> Sequence[Case]:
        """The cases to check (default: :attr:`CASES`)."""
        return self.CASES

    def new_parser(self, case: Case | None = None) -> Parser:
        """A fresh parser for ``case`` (tools, ``starts_in_reasoning``)."""
        cls = self.parser_class
        if issubclass(cls, ReasoningParser):
            return cls(starts_in_reasoning=bool(case and case.starts_in_reasoning))
        tools = case.tools if case is not None and case.tools is not None else self.TOOLS
        return cls(list(tools))

    def conformance_tokenizer(self, request: Any) -> Any:
        """The tokenizer for ``tokens`` mode, or ``None`` to skip that mode."""
        if self.tokenizer_fixture is None:
            return None
        return request.getfixturevalue(self.tokenizer_fixture)

    def pytest_generate_tests(self, metafunc: Any) -> None:
        """Parametrize :meth:`test_conformance_case` with the cases and feeding modes."""
        if "conformance_case" in metafunc.fixturenames:
            cases = list(self.cases())
            metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])
        if "conformance_mode" in metafunc.fixturenames:
            metafunc.parametrize("conformance_mode", MODES)

    def test_conformance_case(self, conformance_case: Case, conformance_mode: str, request: Any):
        """Each case gives its expected outcome in every feeding mode."""
        tokenizer = None
        if conformance_mode == "tokens":
            tokenizer = self.conformance_tokenizer(request)
            if tokenizer is None:
                import pytest

                pytest.skip("no tokenizer for this parser (set tokenizer_fixture)")
        check_case(
            self.new_parser,
            conformance_case,
            conformance_mode,
            tokenizer=tokenizer,
            seed=self.SEED,
            random_splits=self.RANDOM_SPLITS,
        )

    def test_conformance_plain_text(self):
        """Plain text comes back unchanged, as content, and is not held back for long."""
        for text in self.PLAIN_TEXTS:
            whole = outcome(self.new_parser().parse(text))
            assert whole == (text, "", []), f"plain text {text!r} changed: {whole!r}"
            total, before = run_pieces(self.new_parser(), list(text))
            assert outcome(total) == whole, f"{text!r} fed by character: {outcome(total)!r}"
            held = len(text) - len(before.content)
            assert text.startswith(before.content) and held <= self.MAX_HELD, (
                f"{held} characters of {text!r} held back until finish: {before.content!r}"
            )

    def test_conformance_markup_prefix_held(self):
        """Every incomplete start of each marker is held back mid-stream (never shown
        early) and given back as content by ``finish``."""
        lead = "Answer: "
        for markup in self.MARKERS:
            for k in range(1, len(markup)):
                text = lead + markup[:k]
                total, before = run_pieces(self.new_parser(), list(text))
                assert lead.startswith(before.content), (
                    f"prefix {markup[:k]!r} released before it was decided: {before.content!r}"
                )
                assert outcome(total) == (text, "", []), (
                    f"held prefix {markup[:k]!r} not returned by finish: {outcome(total)!r}"
                )

    def test_conformance_fresh_parser(self):
        """A parser fed nothing (or empty strings) releases nothing."""
        parser = self.new_parser()
        assert not parser.feed("")
        assert not parser.finish()

    def test_conformance_prompt_opens_reasoning(self):
        """``prompt_opens_reasoning`` gives the expected answer for each of :attr:`PROMPTS`."""
        for text, opens in self.PROMPTS:
            cls = self.parser_class
            assert issubclass(cls, ReasoningParser), "PROMPTS are for reasoning parsers"
            assert cls.prompt_opens_reasoning(text) is opens, f"prompt ...{text[-80:]!r}"
