"""The parser contract: incremental text in, content / reasoning / tool calls out.

A parser is fed the decoded text of one generation piece by piece (``feed``)
and flushed once at the end (``finish``). Non-streaming use is the same calls
with the whole text at once (``parse``), so streaming and non-streaming give
identical results by construction; the conformance kit in
:mod:`mlxcore.testing.conformance` checks every case both ways.

Parsers are offered by plugins through the ``mlxcore_tool_parsers`` and
``mlxcore_reasoning_parsers`` hooks, as classes. The core picks one per model
(``matches``) or by name (``--tool-call-parser``), and creates a fresh instance
per request.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from mlxcore.model_info import ModelInfo

if TYPE_CHECKING:
    from mlxcore.structured.call_grammar import CallFormat, Function, GrammarKit


def new_tool_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` + 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@attrs.define
class ToolCall:
    """One complete tool call: function name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = attrs.field(factory=new_tool_call_id)


@attrs.frozen
class CallPart:
    """A piece of a tool call still being written, for streaming: the call's id and
    name, and the next fragment of its arguments text. The call's fragments, in order,
    begin its final :attr:`ToolCall.arguments` (the complete call, with the same id,
    comes in :attr:`ParsedDelta.tool_calls` when it is decoded)."""

    id: str
    name: str
    arguments: str = ""
    aborted: bool = False
    """The call will not complete after all (its block turned out malformed or was cut
    short): streaming front ends end it as incomplete; its text comes as content."""


@attrs.define
class ParsedDelta:
    """What one ``feed``/``finish`` call releases to the client."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = attrs.field(factory=list)
    call_parts: list[CallPart] = attrs.field(factory=list)
    """Calls still being written (see :class:`CallPart`)."""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls or self.call_parts)

    def extend(self, other: ParsedDelta) -> None:
        """Append ``other`` to this delta in place."""
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)
        self.call_parts.extend(other.call_parts)


class _Parser(abc.ABC):
    """Behaviour shared by tool and reasoning parsers."""

    name: ClassVar[str]
    """The registry name users pass to ``--tool-call-parser`` / ``--reasoning-parser``."""

    control_tokens: ClassVar[tuple[str, ...]] = ()
    """Special tokens of this format that never carry text for the client (turn or
    media markers). The parser removes them itself; listing them also lets the
    output pipeline hide them by token id for requests where no instance of the
    parser runs (no tools, thinking turned off)."""

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """True when this parser recognises the model (chat template, vocabulary).

        Called once at model load for ``auto`` selection. The default never matches,
        so a parser without detection is used only when named explicitly.
        """
        return False

    @abc.abstractmethod
    def feed(self, text: str) -> ParsedDelta:
        """Consume the next piece of generated text; return what can be released now.

        Text that might still turn out to be markup is held back until it is decided.
        """

    def finish(self) -> ParsedDelta:
        """Flush at the end of generation. Held-back text that never became a
        complete call must be returned as content, never dropped."""
        return ParsedDelta()

    def parse(self, text: str) -> ParsedDelta:
        """Parse a whole generation at once (``feed`` + ``finish``)."""
        out = self.feed(text)
        out.extend(self.finish())
        return out


class ToolParser(_Parser):
    """Extracts tool calls from generated text.

    Args:
        tools: the request's ``tools`` (OpenAI function definitions), used for
            schema-typed arguments and to recognise degraded call forms.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tools = list(tools or [])

    @classmethod
    def call_grammar(cls, functions: Sequence[Function], kit: GrammarKit) -> CallFormat | None:
        """The grammar of this format's calls, so that they can be constrained (decision
        0023): the text that opens a call and a rule, written with ``kit``, for what
        follows it up to and including the closer, allowing a call of any of
        ``functions`` with arguments valid for its schema.

        Under ``tool_choice: auto`` the output is free until the opener, constrained
        to this rule after it, and free again after the closer; ``required`` and named
        choices start with the opener. Raise
        :class:`~mlxcore.structured.call_grammar.GrammarUnsupported` for a schema the
        format cannot express (the request then runs unconstrained). The default,
        ``None``, declares no grammar.
        """
        return None

    def tool_names(self) -> set[str]:
        """The function names the request declared."""
        names = set()
        for tool in self.tools:
            fn = tool.get("function", tool)
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                names.add(fn["name"])
        return names


class ReasoningParser(_Parser):
    """Separates reasoning ("thinking") text from the answer.

    Args:
        starts_in_reasoning: the prompt already opened the reasoning block (some
            templates end the generation prompt with ``<think>``), so output starts
            inside it.
    """

    def __init__(self, *, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        """True when ``prompt_text`` (the rendered prompt) leaves a reasoning block open."""
        return False
