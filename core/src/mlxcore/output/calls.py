"""Tool calls as streaming front ends send them: opened, argument fragments, closed.

A tool parser releases a call still being written as :class:`~mlxcore.parsers.base.CallPart`
pieces (id and name first, then argument fragments) and the complete
:class:`~mlxcore.parsers.base.ToolCall` once decoded; a call it could not stream comes
only complete. :class:`CallStream` turns both into one sequence of :class:`CallEvent`
per request, so that every streaming front end (chat completions, Responses, Anthropic
Messages) sends a call the same way: ``open``, then ``arguments`` fragments whose
concatenation is the call's arguments, then ``close`` (or ``abort``, for a call whose
start was streamed but that turned out malformed or was cut short by the token limit).
"""

from __future__ import annotations

from typing import Literal

import attrs

from mlxcore.output.pipeline import OutputDelta
from mlxcore.parsers.base import ToolCall


@attrs.frozen
class CallEvent:
    """One step of a streamed call: ``open`` (``name`` set), ``arguments`` (``text``: the
    next fragment), ``close`` (``call``: the complete call) or ``abort`` (the call will
    not complete: its block was malformed or cut short, and its text follows as
    content)."""

    kind: Literal["open", "arguments", "close", "abort"]
    id: str
    index: int
    """The call's position among the request's calls (0, 1, ...)."""
    name: str = ""
    text: str = ""
    call: ToolCall | None = None


class CallStream:
    """Per request: the call events of each output delta, in order."""

    def __init__(self) -> None:
        self._sent: dict[str, str] = {}  # open calls: id -> arguments sent so far
        self._index: dict[str, int] = {}

    def events(self, delta: OutputDelta) -> list[CallEvent]:
        """What ``delta`` adds to the request's calls."""
        out: list[CallEvent] = []
        for part in delta.call_parts:
            if part.aborted:
                if self._sent.pop(part.id, None) is not None:
                    out.append(CallEvent("abort", part.id, self._index[part.id], part.name))
                continue
            if part.id not in self._sent:
                self._sent[part.id] = ""
                out.append(CallEvent("open", part.id, self._number(part.id), part.name))
            if part.arguments:
                self._sent[part.id] += part.arguments
                out.append(
                    CallEvent("arguments", part.id, self._index[part.id], text=part.arguments)
                )
        for call in delta.tool_calls:
            sent = self._sent.pop(call.id, None)
            if sent is None:
                out.append(CallEvent("open", call.id, self._number(call.id), call.name))
                sent = ""
            index = self._index[call.id]
            rest = call.arguments[len(sent) :]
            if rest:
                out.append(CallEvent("arguments", call.id, index, text=rest))
            out.append(CallEvent("close", call.id, index, call.name, call=call))
        return out

    def _number(self, call_id: str) -> int:
        self._index[call_id] = len(self._index)
        return self._index[call_id]
