"""Degraded tool-call forms that models fall into after many turns.

After long conversations (and at low quantisation) models sometimes stop using
their native markup and write a call as plain text. Two such forms are
recognised by every built-in tool parser, and only when the name is one of the
request's tools (anything else is ordinary content):

* ``[Calling tool: NAME({...JSON...})]`` (also ``[Calling tool=NAME(...)]``);
* a bare JSON object on its own line: ``{"name": "NAME", "arguments": {...}}``
  (``"parameters"`` is accepted for ``"arguments"``).

Format-specific degraded forms (``<function=NAME>`` without ``<tool_call>``...)
live with their formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from mlxcore.parsers.base import ToolCall
from mlxcore.parsers.blocks import PENDING, REJECT, Block, Verdict
from mlxcore.parsers.streaming import BracketScanner

MakeCall = Callable[[str, Mapping[str, Any]], ToolCall]

CALLING_TOOL = "[Calling tool"
JSON_LINE_MARKERS = ('{"name"', '{ "name"')
DEGRADED_MARKERS = (CALLING_TOOL, *JSON_LINE_MARKERS)
"""Markers a parser adds to its own to recognise the degraded forms."""

_HEAD = re.compile(r"\s*[:=]?\s*([^\s()\[\]{}]+)\s*\(\s*")
_HEAD_SO_FAR = re.compile(r"\s*[:=]?\s*[^\s()\[\]{}]*\s*")
_TAIL = re.compile(r"\s*\)\s*\]")
_TAIL_SO_FAR = re.compile(r"\s*(\)\s*)?")
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_MAX_HEAD = 300


def json_arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict: a dict, a JSON object text, or ``None`` (missing means ``{}``)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class CallingToolBlock(Block):
    """``[Calling tool: NAME({...})]`` for a known tool NAME."""

    def __init__(self, opener: str, names: set[str], make: MakeCall) -> None:
        super().__init__(opener)
        self.names = names
        self.make = make
        self._name = ""
        self._args_at = -1  # offset where the arguments start
        self._args_end = -1  # offset just past the arguments
        self._scanner: BracketScanner | None = None

    def advance(self, new: str, final: bool) -> Verdict:
        """Name, then a JSON object (or nothing), then ``)]``."""
        self._text.add(new)
        if self._args_at < 0:
            text = self.text()
            head = text[len(self.opener) :]
            match = _HEAD.match(head)
            if match is None:
                so_far = _HEAD_SO_FAR.fullmatch(head) and len(head) < _MAX_HEAD
                return PENDING if so_far and not final else REJECT
            if match.group(1) not in self.names:
                return REJECT
            self._name = match.group(1)
            self._args_at = len(self.opener) + match.end()
            new = ""
        if self._args_end < 0:
            if self._scanner is None:
                rest = self.text()[self._args_at :]
                start = rest.lstrip()
                if not start:
                    return REJECT if final else PENDING
                if start[0] == ")":
                    self._args_end = self._args_at
                    return self._tail(final)
                self._scanner = BracketScanner()
                new = rest
            end = self._scanner.add(new)
            if self._scanner.failed or (end < 0 and final):
                return REJECT
            if end < 0:
                return PENDING
            self._args_end = self._args_at + end
        return self._tail(final)

    def _tail(self, final: bool) -> Verdict:
        text = self.text()
        rest = text[self._args_end :]
        match = _TAIL.match(rest)
        if match is None:
            return PENDING if _TAIL_SO_FAR.fullmatch(rest) and not final else REJECT
        args = json_arguments(text[self._args_at : self._args_end] or None)
        if args is None:
            return REJECT
        call = self.make(self._name, args)
        return Verdict("calls", self._args_end + match.end(), (call,))


class JsonLineBlock(Block):
    """``{"name": NAME, "arguments": {...}}`` alone on its line, for a known tool NAME."""

    def __init__(self, opener: str, names: set[str], make: MakeCall) -> None:
        super().__init__(opener)
        self.names = names
        self.make = make
        self._scanner = BracketScanner()
        self._named = False
        self._end = -1

    def advance(self, new: str, final: bool) -> Verdict:
        """Check the name early, then read the object, then the rest of its line."""
        self._text.add(new)
        if self._end < 0:
            end = self._scanner.add(new)
            if self._scanner.failed:
                return REJECT
            if not self._named:
                text = self.text()
                match = _NAME.match(text)
                if match is not None:
                    name = _unescape(match.group(1))
                    if name not in self.names:
                        return REJECT
                    self._named = True
                elif end >= 0 or len(text) > _MAX_HEAD:
                    return REJECT
            if end < 0:
                return REJECT if final else PENDING
            self._end = end
        text = self.text()
        rest = text[self._end :]
        line = rest.split("\n", 1)[0]
        if line.strip():
            return REJECT
        if "\n" not in rest and not final:
            return PENDING
        return self._decide(text[: self._end], self._end)

    def _decide(self, obj_text: str, end: int) -> Verdict:
        try:
            obj = json.loads(obj_text)
        except ValueError:
            return REJECT
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return REJECT
        key = "arguments" if "arguments" in obj else "parameters"
        if key not in obj:
            return REJECT
        args = json_arguments(obj[key])
        if args is None:
            return REJECT
        return Verdict("calls", end, (self.make(obj["name"], args),))


def _unescape(text: str) -> str:
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        return text
    return value if isinstance(value, str) else text


def degraded_block(parser: Any, marker: str) -> Block | None:
    """The degraded-form block for ``marker``, or ``None`` when it does not apply.

    ``parser`` is a :class:`~mlxcore.parsers.tool_stream.StreamingToolParser`; a
    request without tools never recognises degraded forms, and the bare JSON
    form must start a line.
    """
    names: set[str] = parser._names
    if not names:
        return None
    if marker == CALLING_TOOL:
        return CallingToolBlock(marker, names, parser.make_call)
    if marker in JSON_LINE_MARKERS and parser.at_line_start:
        return JsonLineBlock(marker, names, parser.make_call)
    return None
