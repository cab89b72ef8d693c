"""The ``gemma4`` tool parser.

Native form (official template google-gemma-4-31B-it.jinja), several in a row::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

Control markup never reaches the client: the turn, tool-declaration, media and
string markers are dropped wherever they appear, a stray ``<tool_call|>`` too,
and a ``<|tool_response>...<tool_response|>`` block the model writes itself (a
made-up tool result: the real one comes from the client) is dropped whole. A
``<|channel>...<channel|>`` block reaching this parser (reasoning parser turned
off) is dropped as well.

Degraded forms, recovered only for the request's tools: ``call:NAME{...}`` at
the start of a line without ``<|tool_call>`` (optionally followed by the orphan
``<tool_call|>`` models then write), plus the generic forms of
:mod:`mlxcore.parsers.degraded` (``[Calling tool: NAME({...})]``, a bare JSON
line).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ToolCall
from mlxcore.parsers.blocks import PENDING, REJECT, Block, DropBlock, TagBlock, Verdict
from mlxcore.parsers.degraded import DEGRADED_MARKERS, degraded_block
from mlxcore.parsers.streaming import BracketScanner
from mlxcore.parsers.tool_stream import StreamingToolParser
from mlxcore.structured.call_grammar import CallFormat, Function, GrammarKit, GrammarUnsupported
from mlxcore_gemma4.grammar import GemmaValues
from mlxcore_gemma4.values import CALL, QUOTE, GemmaSyntaxError, parse_call, parse_calls

TOOL_CALL = "<|tool_call>"
TOOL_CALL_END = "<tool_call|>"
TOOL_RESPONSE = "<|tool_response>"
TOOL_RESPONSE_END = "<tool_response|>"
CHANNEL = "<|channel>"
CHANNEL_END = "<channel|>"
CONTROL_TOKENS = (
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)
"""Markers that never carry text for the client (dropped by both Gemma 4 parsers)."""

_CLOSED_BY = {TOOL_RESPONSE: TOOL_RESPONSE_END, CHANNEL: CHANNEL_END}
_ORPHANS = (TOOL_CALL_END, TOOL_RESPONSE_END, CHANNEL_END)
_INLINE = (QUOTE, *CONTROL_TOKENS)
_MAX_NAME = 256


class Gemma4ToolParser(StreamingToolParser):
    """Gemma 4 tool calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``.

    Matches models whose chat template writes ``<|tool_call>`` or whose
    vocabulary has the ``<|tool_call>`` and ``<|"|>`` tokens.
    """

    name = "gemma4"
    control_tokens = CONTROL_TOKENS
    markers = (TOOL_CALL, CALL, *_CLOSED_BY, *_ORPHANS, *_INLINE, *DEGRADED_MARKERS)

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The Gemma 4 template, or the Gemma 4 tool-call tokens."""
        if info.template_mentions(TOOL_CALL, QUOTE):
            return True
        return info.has_token(TOOL_CALL) and info.has_token(QUOTE)

    @classmethod
    def call_grammar(cls, functions: Sequence[Function], kit: GrammarKit) -> CallFormat:
        """``<|tool_call>call:NAME{...}<tool_call|>``, the arguments in Gemma 4's syntax
        (:mod:`mlxcore_gemma4.grammar`); parallel calls are blocks in a row."""
        forbidden = (QUOTE, TOOL_CALL, TOOL_CALL_END, *CONTROL_TOKENS)
        alternatives = []
        for fn in functions:
            if not fn.name or "{" in fn.name or any(c.isspace() for c in fn.name):
                raise GrammarUnsupported(f"the name {fn.name!r} cannot follow 'call:'")
            arguments = GemmaValues(kit, QUOTE, forbidden).arguments(fn.parameters)
            alternatives.append(kit.rule(f"{kit.literal(CALL + fn.name)} {arguments}", "fn"))
        body = f"{kit.choice(alternatives)} {kit.markup(TOOL_CALL_END)}"
        return CallFormat(TOOL_CALL, kit.rule(body, "call"))

    def open_block(self, marker: str) -> Block | None:
        """A block per native call, control marker and degraded form."""
        if marker == TOOL_CALL:
            return TagBlock(marker, TOOL_CALL_END, self.decode_body)
        if marker in _CLOSED_BY:
            return DropBlock(marker, _CLOSED_BY[marker])
        if marker in _ORPHANS:
            return DropBlock(marker)
        if marker in _INLINE:
            return DropBlock(marker, inline=True)
        if marker == CALL:
            if not self._names or not self.at_line_start:
                return None
            return BareCallBlock(marker, self._names, self.make_call)
        return degraded_block(self, marker)

    def decode_body(self, body: str, closed: bool = True) -> list[ToolCall] | None:
        """The calls of one ``<|tool_call>`` block; ``None`` unless it is well formed
        (the syntax is strict enough that a cut-short call never parses)."""
        calls = parse_calls(body)
        if calls is None:
            return None
        return [self.make_call(name, args) for name, args in calls]


class BareCallBlock(Block):
    """``call:NAME{...}`` without ``<|tool_call>``, for a known tool NAME."""

    def __init__(
        self, opener: str, names: set[str], make: Callable[[str, Mapping[str, Any]], ToolCall]
    ) -> None:
        super().__init__(opener)
        self.names = names
        self.make = make
        self._brace = -1
        self._end = -1
        self._scanner = BracketScanner(raw_quote=QUOTE)

    def advance(self, new: str, final: bool) -> Verdict:
        """Name up to ``{``, the balanced arguments, then an optional ``<tool_call|>``."""
        self._text.add(new)
        if self._brace < 0:
            text = self.text()
            brace = text.find("{", len(self.opener))
            head = text[len(self.opener) : brace if brace >= 0 else len(text)].strip()
            if any(c.isspace() for c in head) or len(head) > _MAX_NAME:
                return REJECT
            if brace < 0:
                return REJECT if final else PENDING
            if head not in self.names:
                return REJECT
            self._brace = brace
            new = text[brace:]
        if self._end < 0:
            end = self._scanner.add(new)
            if self._scanner.failed or (end < 0 and final):
                return REJECT
            if end < 0:
                return PENDING
            self._end = self._brace + end
        text = self.text()
        rest = text[self._end :]
        end = self._end
        if rest.startswith(TOOL_CALL_END):
            end += len(TOOL_CALL_END)
        elif (rest and TOOL_CALL_END.startswith(rest) and not final) or (not rest and not final):
            return PENDING
        try:
            name, args, _ = parse_call(text[: self._end])
        except GemmaSyntaxError:
            return REJECT
        return Verdict("calls", end, (self.make(name, args),))
