"""The streaming engine behind every built-in tool parser.

A :class:`StreamingToolParser` subclass declares its opening markers and, for
each, how to build the :class:`~mlxcore.parsers.blocks.Block` that reads what
follows. This class does the rest, identically for every format:

* text that cannot start a marker is released as content at once; a suffix that
  may be the start of one (``<``, ``<tool_ca``) is held until decided;
* a block's text never reaches the content unless the block turns out to be
  malformed or truncated, in which case it is released verbatim at that point
  (at the latest by ``finish``) and logged on ``mlxcore.parsers.<name>``;
* whitespace touching a call or a dropped markup block is dropped (the
  templates put newlines around calls; they are not part of the answer); a lone
  control token is removed without touching the text around it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from mlxcore.parsers.base import ParsedDelta, ToolCall, ToolParser
from mlxcore.parsers.blocks import Block, Verdict
from mlxcore.parsers.call_progress import CallSender
from mlxcore.parsers.schema_types import conform_arguments, parameters_of
from mlxcore.parsers.streaming import MarkerSet, WhitespaceGate


class StreamingToolParser(ToolParser):
    """Base class: marker scanning, hold-back, block verdicts, whitespace rule.

    Subclasses set :attr:`markers` and implement :meth:`open_block`.
    """

    markers: ClassVar[tuple[str, ...]] = ()
    """Every marker that may open a block (format markup, control tokens, degraded forms)."""

    _marker_sets: ClassVar[dict[tuple[str, ...], MarkerSet]] = {}

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        key = self.markers
        found = StreamingToolParser._marker_sets.get(key)
        if found is None:
            found = StreamingToolParser._marker_sets[key] = MarkerSet(key)
        self._scan = found
        self._names = self.tool_names()
        self._pending = ""
        self._block: Block | None = None
        self._rest = ""  # text after a decided block, still to scan
        self._gate = WhitespaceGate()
        self._line_blank = True
        self._out = ParsedDelta()
        self._sender = CallSender()  # the open block's call, when streamed
        self.log = logging.getLogger(f"mlxcore.parsers.{self.name}")

    # -- for subclasses ------------------------------------------------------

    def open_block(self, marker: str) -> Block | None:
        """The block that reads from ``marker`` on, or ``None`` when the marker is
        plain text here (e.g. a degraded form not at the start of a line)."""
        raise NotImplementedError

    @property
    def at_line_start(self) -> bool:
        """True when the current content line holds only whitespace so far."""
        return self._line_blank

    def make_call(self, name: str, arguments: Mapping[str, Any]) -> ToolCall:
        """A :class:`ToolCall` with ``arguments`` made to fit the tool's JSON schema
        (strings where the schema wants another type are converted)."""
        args = conform_arguments(dict(arguments), parameters_of(self.tools, name))
        return ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))

    # -- the contract --------------------------------------------------------

    def feed(self, text: str) -> ParsedDelta:
        """Release what is decided; hold back a possible marker start or open block."""
        self._run(text, final=False)
        return self._take()

    def finish(self) -> ParsedDelta:
        """Decide everything: open blocks are decoded or released as content."""
        self._run("", final=True)
        self._out.content += self._gate.flush()
        return self._take()

    # -- machinery -----------------------------------------------------------

    def _take(self) -> ParsedDelta:
        out, self._out = self._out, ParsedDelta()
        return out

    def _content(self, text: str) -> None:
        if not text:
            return
        self._out.content += self._gate.push(text)
        nl = text.rfind("\n")
        tail = text[nl + 1 :]
        self._line_blank = (nl >= 0 or self._line_blank) and not tail.strip()

    def _run(self, text: str, *, final: bool) -> None:
        work = text
        while True:
            if self._block is not None:
                if not self._resolve(work, final):
                    self._stream_progress(self._block, work)
                    return
                work = self._rest
                continue
            buf = self._pending + work
            self._pending = work = ""
            index, marker = self._scan.find(buf)
            if index < 0:
                keep = 0 if final else self._scan.partial(buf)
                self._content(buf[: len(buf) - keep])
                self._pending = buf[len(buf) - keep :]
                return
            self._content(buf[:index])
            block = self.open_block(marker)
            if block is None:  # plain text here: release its first character, scan on
                self._content(buf[index])
                work = buf[index + 1 :]
                continue
            self._block = block
            work = buf[index:]

    def _resolve(self, new: str, final: bool) -> bool:
        """Feed the open block; on a verdict apply it and leave the unread rest in
        ``self._rest``. False while the block needs more text."""
        block = self._block
        assert block is not None
        verdict = block.advance(new, final)
        if verdict.kind == "pending":
            return False
        text = block.text()
        self._block = None
        if self._sender.sent is not None:
            verdict = self._end_streamed(verdict)
        if verdict.kind == "reject":
            self._content(text[0])
            self._rest = text[1:]
            return True
        head, self._rest = text[: verdict.end], text[verdict.end :]
        if verdict.kind == "raw":
            self.log.warning(
                "%s tool-call block %s: returned as content (%d chars): %.200r",
                self.name,
                verdict.reason,
                len(head),
                head,
            )
            self._content(head)
            return True
        if block.inline:
            return True  # a lone control token: removed, the text around it is untouched
        self._gate.block()
        self._line_blank = True
        if verdict.kind == "calls":
            self._out.tool_calls.extend(verdict.calls)
        else:
            self.log.debug("dropped control markup %.80r", head)
        return True

    # -- calls streamed while they are written -------------------------------------

    def _stream_progress(self, block: Block, new: str) -> None:
        """Send the open block's call name and new argument text, if it can tell them."""
        if block.progress is not None:
            self._out.call_parts.extend(self._sender.update(block.progress.feed(new)))

    def _end_streamed(self, verdict: Verdict) -> Verdict:
        """The block of a call whose start was streamed is decided. Its first call
        continues what was sent: it keeps the streamed id. Otherwise (a malformed or
        truncated block, or other arguments after all) the streamed call is aborted:
        streaming clients see it end incomplete, and the block is then handled as if
        nothing had been streamed (its text becomes content, as in a non-streamed
        answer)."""
        name = self._sender.sent.name if self._sender.sent else ""
        calls, aborted = self._sender.settle(verdict.calls)
        if aborted is None:
            return attrs.evolve(verdict, calls=tuple(calls))
        self.log.warning(
            "%s tool call %s was streamed but its block ended %s: the streamed call is aborted",
            self.name,
            name,
            verdict.reason or verdict.kind if not calls else "with other arguments",
        )
        self._out.call_parts.append(aborted)
        return verdict
