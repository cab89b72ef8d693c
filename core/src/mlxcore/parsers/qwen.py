"""The ``<tool_call>`` family: Hermes JSON (Qwen2.5, Qwen3) and Qwen3-Coder XML (Qwen3.5).

Both formats wrap each call in ``<tool_call>...</tool_call>`` and differ only in
the body (JSON object vs ``<function=NAME>`` XML), so one parser class reads
both bodies; the two registered names differ in which chat templates they
claim for ``auto`` and document what the model is expected to write.

Besides the native blocks, these parsers recognise (for the request's tools
only) a ``<function=NAME>...</function>`` without its ``<tool_call>`` wrapper and
the generic degraded forms of :mod:`mlxcore.parsers.degraded`. A stray
``</tool_call>`` is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ToolCall
from mlxcore.parsers.blocks import Block, DropBlock, JsonTagBlock, NamedBlock
from mlxcore.parsers.call_progress import ProgressReader
from mlxcore.parsers.degraded import DEGRADED_MARKERS, degraded_block
from mlxcore.parsers.hermes import decode_json_calls
from mlxcore.parsers.qwen_xml import FUNCTION, FUNCTION_END, decode_xml_functions
from mlxcore.parsers.schema_types import coerce_arguments, parameters_of
from mlxcore.parsers.tool_stream import StreamingToolParser

if TYPE_CHECKING:
    from mlxcore.structured.call_grammar import CallFormat, Function, GrammarKit

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
XML_MARKUP = (TOOL_CALL, TOOL_CALL_END, FUNCTION, FUNCTION_END, "<parameter=", "</parameter>")
"""Text an XML argument value may not hold (the parser would take it for markup)."""


class ToolCallTagParser(StreamingToolParser):
    """``<tool_call>`` blocks holding a JSON object or ``<function=...>`` XML."""

    name = "tool_call_tag"
    markers = (TOOL_CALL, TOOL_CALL_END, FUNCTION, *DEGRADED_MARKERS)

    def open_block(self, marker: str) -> Block | None:
        """A block for each ``<tool_call>``, unwrapped ``<function=`` or degraded form."""
        block: Block | None
        if marker == TOOL_CALL:
            block = JsonTagBlock(marker, TOOL_CALL_END, self.decode_body)
        elif marker == TOOL_CALL_END:
            return DropBlock(marker)
        elif marker == FUNCTION:
            if not self._names:
                return None
            block = NamedBlock(marker, ">", FUNCTION_END, self.decode_body, self._names)
        else:
            return degraded_block(self, marker)
        block.progress = ProgressReader(
            marker,
            self._names,
            lambda name: parameters_of(self.tools, name),
            unwrapped=FUNCTION if marker == FUNCTION else "",
        )
        return block

    def decode_body(self, body: str, closed: bool = True) -> list[ToolCall] | None:
        """The calls in one block body (JSON or XML), ``None`` when malformed;
        ``closed`` false (the output ended inside the block): strict XML."""
        text = body.strip()
        if text.startswith(FUNCTION):
            functions = decode_xml_functions(text, strict=not closed)
            if functions is None:
                return None
            return [
                self.make_call(name, coerce_arguments(raw, parameters_of(self.tools, name)))
                for name, raw in functions
            ]
        calls = decode_json_calls(text)
        if calls is None:
            return None
        return [self.make_call(name, args) for name, args in calls]


class HermesToolParser(ToolCallTagParser):
    """Hermes / Qwen JSON calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

    Matches chat templates that render ``<tool_call>`` followed by a JSON object
    with ``"name"`` (Qwen2.5, Qwen3, Hermes, SmolLM3...) and no ``<function=``.
    """

    name = "hermes"

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The template writes ``<tool_call>`` with a JSON ``"name"`` key."""
        template = info.chat_template or ""
        if TOOL_CALL not in template or FUNCTION in template:
            return False
        return '"name"' in template or '\\"name\\"' in template

    @classmethod
    def call_grammar(cls, functions: Sequence[Function], kit: GrammarKit) -> CallFormat:
        """``<tool_call>``, a newline, ``{"name": N, "arguments": {...}}`` as the template's
        ``tojson`` writes it, a newline, ``</tool_call>``."""
        from mlxcore.structured.call_grammar import CallFormat, definitions

        objects = []
        for fn in functions:
            params = {k: v for k, v in fn.parameters.items() if k not in ("$defs", "definitions")}
            shape = {
                "type": "object",
                "properties": {
                    "name": {"const": fn.name},
                    "arguments": params or {"type": "object"},
                },
                "required": ["name", "arguments"],
            }
            objects.append(kit.json_value(shape, definitions(fn.parameters)))
        body = f'"\\n" {kit.choice(objects)} "\\n" {kit.markup(TOOL_CALL_END)}'
        return CallFormat(TOOL_CALL, kit.rule(body, "call"))


class Qwen3CoderToolParser(ToolCallTagParser):
    """Qwen3-Coder XML calls, values typed from the request's JSON schema::

        <tool_call>
        <function=get_weather>
        <parameter=city>
        Paris
        </parameter>
        </function>
        </tool_call>

    Matches chat templates that render ``<tool_call>`` with ``<function=`` and
    ``<parameter=`` (Qwen3-Coder, Qwen3.5, Qwen3-Next...).
    """

    name = "qwen3_coder"

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The template writes ``<tool_call>``, ``<function=`` and ``<parameter=``."""
        return info.template_mentions(TOOL_CALL, FUNCTION, "<parameter=")

    @classmethod
    def call_grammar(cls, functions: Sequence[Function], kit: GrammarKit) -> CallFormat:
        """``<tool_call>`` and one ``<function=NAME>`` with a ``<parameter=KEY>`` per
        argument (in the schema's order, the required ones always), each value on its
        own lines, then ``</function>`` and ``</tool_call>``."""
        from mlxcore.structured.call_grammar import CallFormat

        alternatives = [
            kit.tagged_call(
                fn,
                f"<function={fn.name}>\n",
                "</function>\n",
                lambda key: f"<parameter={key}>\n",
                "\n</parameter>\n",
                XML_MARKUP,
            )
            for fn in functions
        ]
        body = f'"\\n" {kit.choice(alternatives)} {kit.markup(TOOL_CALL_END)}'
        return CallFormat(TOOL_CALL, kit.rule(body, "call"))
