"""The ``minimax_m2`` tool parser.

Native form (official template MiniMax-M2.jinja), several invokes per block::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    </minimax:tool_call>

Argument values are typed from the request's JSON schema (integer, number,
boolean, null, array, object, unions; a string by default). A stray
``</minimax:tool_call>`` is dropped. Recovered for the request's tools only: an
``<invoke name=...>`` without its wrapper, a Qwen-style ``<tool_call>`` block
(MiniMax models fall into it), and the generic degraded forms.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ToolCall
from mlxcore.parsers.blocks import Block, DropBlock, NamedBlock, TagBlock
from mlxcore.parsers.call_progress import ProgressReader
from mlxcore.parsers.degraded import DEGRADED_MARKERS, degraded_block
from mlxcore.parsers.hermes import decode_json_calls
from mlxcore.parsers.qwen_xml import FUNCTION, decode_xml_functions
from mlxcore.parsers.schema_types import coerce_arguments, parameters_of
from mlxcore.parsers.tool_stream import StreamingToolParser
from mlxcore.structured.call_grammar import CallFormat, Function, GrammarKit
from mlxcore_minimax.invoke import INVOKE, INVOKE_END, MARKUP, decode_invokes

TOOL_CALL = "<minimax:tool_call>"
TOOL_CALL_END = "</minimax:tool_call>"
QWEN_TOOL_CALL = "<tool_call>"
QWEN_TOOL_CALL_END = "</tool_call>"
INVOKE_OPENER = INVOKE + " name="
VALUE_MARKUP = (TOOL_CALL, TOOL_CALL_END, INVOKE, INVOKE_END, "<parameter", "</parameter>")
"""Text an argument value may not hold (the parser would take it for markup)."""


class MiniMaxM2ToolParser(StreamingToolParser):
    """MiniMax-M2 ``<minimax:tool_call>`` / ``<invoke>`` calls.

    Matches models whose chat template writes ``<minimax:tool_call>`` or whose
    vocabulary has it as a token.
    """

    name = "minimax_m2"
    markers = (TOOL_CALL, TOOL_CALL_END, INVOKE_OPENER, QWEN_TOOL_CALL, *DEGRADED_MARKERS)

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The MiniMax-M2 template or tool-call token."""
        return info.template_mentions(TOOL_CALL) or info.has_token(TOOL_CALL)

    @classmethod
    def call_grammar(cls, functions: Sequence[Function], kit: GrammarKit) -> CallFormat:
        """``<minimax:tool_call>``, then one ``<invoke name="N">`` (several with parallel
        calls) with a ``<parameter name="K">VALUE</parameter>`` line per argument (in the
        schema's order, the required ones always), then ``</minimax:tool_call>``."""
        alternatives = [
            kit.tagged_call(
                fn,
                f'<invoke name="{fn.name}">\n',
                "</invoke>\n",
                lambda key: f'<parameter name="{key}">',
                "</parameter>\n",
                VALUE_MARKUP,
                bad_chars='">',
            )
            for fn in functions
        ]
        invokes = kit.choice(alternatives) + ("+" if kit.parallel else "")
        body = f'"\\n" {invokes} {kit.markup(TOOL_CALL_END)}'
        return CallFormat(TOOL_CALL, kit.rule(body, "call"))

    def open_block(self, marker: str) -> Block | None:
        """A block per native call, stray closer and degraded form."""
        if marker == TOOL_CALL:
            block: Block = TagBlock(marker, TOOL_CALL_END, self.decode_body)
            block.progress = self._reader(marker)
            return block
        if marker == TOOL_CALL_END:
            return DropBlock(marker)
        if not self._names:
            return None
        if marker == INVOKE_OPENER:
            block = NamedBlock(marker, ">", INVOKE_END, self.decode_body, self._names, unquote=True)
            block.progress = self._reader(marker, unwrapped=INVOKE_OPENER)
            return block
        if marker == QWEN_TOOL_CALL:
            return TagBlock(marker, QWEN_TOOL_CALL_END, self.decode_qwen_body)
        return degraded_block(self, marker)

    def _reader(self, marker: str, unwrapped: str = "") -> ProgressReader:
        """Streams the first ``<invoke>`` of a block while it is written."""
        return ProgressReader(
            marker,
            self._names,
            lambda name: parameters_of(self.tools, name),
            unwrapped=unwrapped,
            markup=MARKUP,
        )

    def decode_body(self, body: str, closed: bool = True) -> list[ToolCall] | None:
        """The invokes of one block, typed by the schema; ``None`` when malformed."""
        invokes = decode_invokes(body.strip(), strict=not closed)
        if invokes is None:
            return None
        return [
            self.make_call(name, coerce_arguments(raw, parameters_of(self.tools, name)))
            for name, raw in invokes
        ]

    def decode_qwen_body(self, body: str, closed: bool = True) -> list[ToolCall] | None:
        """A Qwen-style block (JSON or ``<function=`` XML) naming only known tools."""
        text = body.strip()
        if text.startswith(FUNCTION):
            functions = decode_xml_functions(text, strict=not closed)
            typed = [
                (name, coerce_arguments(raw, parameters_of(self.tools, name)))
                for name, raw in functions or []
            ]
        else:
            typed = list(decode_json_calls(text) or [])
        if not typed or any(name not in self._names for name, _ in typed):
            return None
        return [self.make_call(name, args) for name, args in typed]
