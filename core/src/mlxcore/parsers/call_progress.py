"""How far a tool call still being written has got: its name, and a prefix of its final
arguments text that can be streamed now.

A tool parser's arguments text is ``json.dumps`` of the decoded arguments after they are
made to fit the tool's schema (:func:`~mlxcore.parsers.schema_types.conform_value`).
The prefix given here is always a prefix of that final text: it holds only the members
whose value is complete (typed exactly as the final decode types them) and, last, a
string member still being written when its schema says it is a string (text is kept
as written). So a client sees argument fragments as the model writes them, and their
concatenation is the call's arguments exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from mlxcore.parsers.base import CallPart, ToolCall, new_tool_call_id
from mlxcore.parsers.qwen_xml import (
    FUNCTION,
    FUNCTION_END,
    PARAMETER,
    PARAMETER_END,
    trim_newlines,
)
from mlxcore.parsers.schema_types import coerce_text, conform_value, schema_types

_DECODER = json.JSONDecoder(strict=False)
_WS = " \t\r\n"


@attrs.frozen
class Progress:
    """A call being written: its name, its complete members (raw values) and the string
    member still open (its key and the text so far)."""

    name: str
    members: tuple[tuple[str, Any], ...] = ()
    open_member: tuple[str, str] | None = None


def arguments_prefix(
    progress: Progress,
    properties: Mapping[str, Any],
    typed: Callable[[Any, Any], Any] = conform_value,
) -> str:
    """The streamable prefix of the final arguments text of ``progress``: ``typed(raw,
    schema)`` turns each complete member's value into its final form."""
    parts = [
        f"{_dumps(key)}: {_dumps(typed(value, properties.get(key)))}"
        for key, value in progress.members
    ]
    text = "{" + ", ".join(parts)
    if progress.open_member is not None:
        key, partial = progress.open_member
        if _is_string(properties.get(key)) or not properties:
            text += (", " if parts else "") + f"{_dumps(key)}: " + _dumps(partial)[:-1]
    return text


READ_STEP = 24
"""Characters a pending call's body grows by, at least, before it is read again (a few
tokens: a small call still streams in several fragments, and reading costs tens of
microseconds)."""

_JSON_TRIGGERS = re.compile(r'["{},\]]')
"""Characters without which new JSON text cannot complete a name or a member, or open
the arguments or a string."""
_MARKUP_TRIGGERS = re.compile(">")
"""Without a ``>``, new tag-format text completes no tag."""
_JSON_ENDS_STRING = re.compile(r'["\\]')
"""What may end (or escape inside) the JSON string being written."""
_MARKUP_ENDS_VALUE = re.compile(r"[<\r\n]")
"""What may end the tag-format value being written (or be held back at its end)."""


class ProgressReader:
    """Follows one pending ``<tool_call>``-style block as its text arrives: the name and
    streamable arguments prefix of the call in it (JSON or XML body), for known tools.

    Cheap however long the call: while a string value is being written, new text that
    cannot end it (no quote or backslash in JSON; no ``<`` or line break in XML) extends
    the prefix directly; text that can complete nothing (no quote, brace, bracket or
    comma in JSON; no ``>`` in tags) is only kept; otherwise the body is read again, at
    most each time it grew by :data:`READ_STEP` characters or 1/16 of its length (so the
    total work stays linear).

    Args:
        opener: the block's opening marker (the first text fed starts with it).
        names: the request's tool names.
        properties: a tool's parameter schemas by name.
        unwrapped: text the opener stands for at the start of the body (``<function=``
            for a call without its wrapper).
        markup: the tag-based format a body that is not JSON is read in (default:
            :data:`QWEN_XML`).
        arguments_of: the body is this function's arguments object itself (a named
            ``tool_choice``), not a call; a body that starts with ``[`` is a list of
            calls (``tool_choice: required``), of which the first is streamed.
    """

    def __init__(
        self,
        opener: str,
        names: set[str],
        properties: Callable[[str], Mapping[str, Any]],
        *,
        unwrapped: str = "",
        markup: Markup | None = None,
        arguments_of: str | None = None,
    ) -> None:
        self._skip = len(opener)
        self._names = names
        self._properties = properties
        self._markup = markup or QWEN_XML
        self._function = arguments_of
        self._chunks: list[str] = [unwrapped] if unwrapped else []
        self._size = len(unwrapped)
        self._read_at = 0
        self._found: Progress | None = None
        self._prefix = ""
        self._xml = False
        self._extendable = False  # the prefix ends inside the open value, nothing held back

    def feed(self, text: str) -> tuple[str, str] | None:
        """Take the block's next text; the call's name and arguments prefix so far."""
        if self._skip:
            cut = min(self._skip, len(text))
            text, self._skip = text[cut:], self._skip - cut
        if not text:
            return self._answer()
        self._chunks.append(text)
        self._size += len(text)
        ends = _MARKUP_ENDS_VALUE if self._xml else _JSON_ENDS_STRING
        if self._extendable and ends.search(text) is None:
            assert self._found is not None and self._found.open_member is not None
            key, value = self._found.open_member
            self._found = attrs.evolve(self._found, open_member=(key, value + text))
            self._prefix += _dumps(text)[1:-1]
            self._read_at = self._size
            return self._answer()
        self._extendable = False  # until the body is read again
        open_value = self._found is not None and self._found.open_member is not None
        triggers = _MARKUP_TRIGGERS if self._xml else _JSON_TRIGGERS
        if not open_value and triggers.search(text) is None:
            return self._answer()  # nothing that completes a name, a member or a tag
        if self._size - self._read_at >= max(READ_STEP, self._read_at // 16):
            self._read()
        return self._answer()

    def _read(self) -> None:
        body = "".join(self._chunks)
        self._chunks = [body]
        self._read_at = len(body)
        text = body.lstrip()
        typed: Callable[[Any, Any], Any] = conform_value
        self._xml = not text.startswith(("{", "["))
        if self._function is not None:
            found = object_progress(self._function, text)
        elif self._xml:
            found, typed = markup_call_progress(text, self._markup), xml_argument
        else:
            found = json_call_progress(text[1:] if text.startswith("[") else text)
        if found is None or found.name not in self._names:
            self._found, self._extendable = None, False
            return
        props = self._properties(found.name)
        self._found = found
        self._prefix = arguments_prefix(found, props, typed)
        open_member = found.open_member
        self._extendable = open_member is not None and (
            _is_string(props.get(open_member[0])) or not props
        )
        if self._xml and self._extendable and open_member is not None:
            # only when nothing is held back: the value is all the text after its tag
            raw = body[body.rfind(">") + 1 :]
            raw = raw[2:] if raw.startswith("\r\n") else raw[1:] if raw.startswith("\n") else raw
            self._extendable = raw == open_member[1]
        elif self._extendable:  # no escape left unfinished at the end of the body
            self._extendable = "\\" not in body[-12:]

    def _answer(self) -> tuple[str, str] | None:
        return None if self._found is None else (self._found.name, self._prefix)


class CallSender:
    """The parts sent for one call streamed while it is written, and how it ends."""

    def __init__(self) -> None:
        self.sent: CallPart | None = None
        """The call's id, name and the arguments sent so far (``None``: nothing yet)."""

    def update(self, found: tuple[str, str] | None) -> list[CallPart]:
        """The parts that tell what ``found`` (a name and an arguments prefix) adds."""
        if found is None:
            return []
        name, prefix = found
        out: list[CallPart] = []
        if self.sent is None:
            self.sent = CallPart(new_tool_call_id(), name)
            out.append(self.sent)
        sent = self.sent
        if sent.name != name or not prefix.startswith(sent.arguments):
            return out  # not a continuation of what was sent: wait for the end
        if len(prefix) > len(sent.arguments):
            out.append(CallPart(sent.id, name, prefix[len(sent.arguments) :]))
            self.sent = CallPart(sent.id, name, prefix)
        return out

    def settle(self, calls: Sequence[ToolCall]) -> tuple[list[ToolCall], CallPart | None]:
        """``calls`` (what the block decoded to) with the first given the streamed id
        when it continues what was sent; otherwise ``calls`` as they are and the part
        that aborts the streamed call (``None`` when nothing was sent)."""
        out = list(calls)
        sent = self.sent
        self.sent = None
        if sent is None:
            return out, None
        first = out[0] if out else None
        if first and first.name == sent.name and first.arguments.startswith(sent.arguments):
            out[0] = ToolCall(first.name, first.arguments, sent.id)
            return out, None
        return out, CallPart(sent.id, sent.name, aborted=True)


def xml_argument(raw: str, schema: Any) -> Any:
    """An XML-written value in its final form (typed text, then conformed)."""
    return conform_value(coerce_text(raw, schema), schema)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _is_string(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema_types(schema) == ["string"]


# -- the JSON format: {"name": ..., "arguments": {...}} -------------------------------


def json_call_progress(body: str) -> Progress | None:
    """The progress of ``{"name": NAME, "arguments": {...`` (``parameters`` too): known
    once the name is complete and the arguments object has begun."""
    pos = _skip(body, 0)
    if not body.startswith("{", pos):
        return None
    pos += 1
    name: str | None = None
    while True:
        pos = _skip(body, pos)
        key, pos = _decode(body, pos)
        if not isinstance(key, str):
            return None
        pos = _skip(body, pos)
        if not body.startswith(":", pos):
            return None
        pos = _skip(body, pos + 1)
        if key in ("arguments", "parameters"):
            if name is None or not body.startswith("{", pos):
                return None
            return _object_progress(name, body, pos + 1)
        value, pos = _decode(body, pos)
        if value is _INCOMPLETE or not _delimited(body, pos):
            return None
        if key == "name":
            if not isinstance(value, str) or not value.strip():
                return None
            name = value.strip()
        pos = _skip(body, pos)
        if not body.startswith(",", pos):
            return None
        pos += 1


def object_progress(name: str, body: str) -> Progress | None:
    """The progress of an arguments object written alone (``{"city": "Par``)."""
    pos = _skip(body, 0)
    return _object_progress(name, body, pos + 1) if body.startswith("{", pos) else None


def _object_progress(name: str, body: str, pos: int) -> Progress:
    members: list[tuple[str, Any]] = []
    while True:
        pos = _skip(body, pos)
        if body.startswith("}", pos):
            return Progress(name, tuple(members))
        key, after = _decode(body, pos)
        if not isinstance(key, str):
            return Progress(name, tuple(members))
        pos = _skip(body, after)
        if not body.startswith(":", pos):
            return Progress(name, tuple(members))
        pos = _skip(body, pos + 1)
        value, after = _decode(body, pos)
        if value is _INCOMPLETE or not _delimited(body, after):
            partial = _partial_string(body, pos) if body.startswith('"', pos) else None
            return Progress(name, tuple(members), None if partial is None else (key, partial))
        members.append((key, value))
        pos = _skip(body, after)
        if not body.startswith(",", pos):
            return Progress(name, tuple(members))
        pos += 1


_INCOMPLETE = object()


def _decode(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError:
        return _INCOMPLETE, pos


def _delimited(text: str, pos: int) -> bool:
    """A value ending at ``pos`` is complete: something follows it (a number could
    still grow)."""
    return pos < len(text)


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _partial_string(text: str, pos: int) -> str | None:
    """The characters of the JSON string opening at ``pos`` written so far (an escape
    still incomplete left out)."""
    end = pos + 1
    safe = end
    while end < len(text):
        char = text[end]
        if char == '"':
            return None  # closed after all: not partial
        if char == "\\":
            width = 6 if text.startswith("u", end + 1) else 2
            if end + width > len(text):
                break
            high = width == 6 and text[end + 2 : end + 4].lower() in ("d8", "d9", "da", "db")
            if high and end + 12 > len(text):
                break  # the first half of a surrogate pair: wait for the second
            end += width
        else:
            end += 1
        safe = end
    try:
        value = json.loads('"' + text[pos + 1 : safe] + '"', strict=False)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


# -- the XML format: <function=NAME><parameter=K>V</parameter>... ---------------------


@attrs.frozen
class Markup:
    """A tag-based call format: how a call and each of its parameters open and end.

    Attributes:
        call: matches the call's opening tag at the start of the body; its first
            group that matched is the tool name.
        parameter: matches a parameter's opening tag; its first group that matched is
            the parameter name.
        parameter_start: the text every parameter tag starts with.
        parameter_end: the closing tag of a parameter.
        markers: tags whose beginning at the end of an open value is held back.
    """

    call: re.Pattern[str]
    parameter: re.Pattern[str]
    parameter_start: str
    parameter_end: str
    markers: tuple[str, ...]


QWEN_XML = Markup(
    re.compile(re.escape(FUNCTION) + r"([^>]*)>"),
    re.compile(re.escape(PARAMETER) + r"([^>]*)>"),
    PARAMETER,
    PARAMETER_END,
    (PARAMETER, PARAMETER_END, FUNCTION_END),
)
"""Qwen3-Coder / Qwen3.5: ``<function=NAME>`` and ``<parameter=KEY>``."""


def _group(match: re.Match[str]) -> str:
    return next((g for g in match.groups() if g is not None), "").strip()


def markup_call_progress(body: str, markup: Markup = QWEN_XML) -> Progress | None:
    """The progress of a tag-based call (newlines around values trimmed as the final
    decode trims them)."""
    text = body.lstrip()
    opened = markup.call.match(text)
    if opened is None:
        return None
    name = _group(opened)
    if not name or any(c.isspace() for c in name):
        return None
    members: list[tuple[str, Any]] = []
    pos = opened.end()
    while True:
        start = text.find(markup.parameter_start, pos)
        if start < 0 or text[pos:start].strip():
            return Progress(name, tuple(members))
        tag = markup.parameter.match(text, start)
        if tag is None:
            return Progress(name, tuple(members))
        key, key_end = _group(tag), tag.end()
        end = text.find(markup.parameter_end, key_end)
        following = text.find(markup.parameter_start, key_end)
        if end < 0 or 0 <= following < end:
            if following >= 0:  # closed by the next parameter (the lenient rule)
                members.append((key, trim_newlines(text[key_end:following])))
                pos = following
                continue
            value = _held_back(text[key_end:], markup.markers)
            return Progress(name, tuple(members), (key, value) if key else None)
        members.append((key, trim_newlines(text[key_end:end])))
        pos = end + len(markup.parameter_end)


def _held_back(value: str, markers: tuple[str, ...]) -> str:
    """An open value without what may still change: the newline after the opening tag,
    a trailing newline (the template's, before the closing tag) and a possible start of
    a marker."""
    for head in ("\r\n", "\n"):
        if value.startswith(head):
            value = value[len(head) :]
            break
    else:
        if value in ("", "\r"):
            return ""
    cut = value.rfind("<")
    if cut >= 0 and any(m.startswith(value[cut:]) for m in markers):
        value = value[:cut]
    return value.rstrip("\r\n")
