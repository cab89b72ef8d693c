"""Blocks: the regions of output a streaming tool parser takes out of the content.

A :class:`~mlxcore.parsers.tool_stream.StreamingToolParser` looks for opening
markers; each one starts a :class:`Block` that is fed the following text until
it gives a :class:`Verdict`:

* ``calls`` - the block is a tool call (or several): they replace its text;
* ``drop`` - control markup that never reaches the client;
* ``raw`` - a complete but malformed (or truncated) block: its text goes out as
  content, verbatim, and is logged;
* ``reject`` - not markup after all (e.g. a degraded form naming an unknown
  tool): its first character goes out as content and the rest is scanned again.

Blocks are fed only new text and remember where they stopped, so a long block
costs time proportional to its length, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import attrs

from mlxcore.parsers.base import ToolCall
from mlxcore.parsers.streaming import BracketScanner, TailFinder


class Progress(Protocol):
    """Follows the call in a pending block (see
    :class:`mlxcore.parsers.call_progress.ProgressReader`)."""

    def feed(self, text: str) -> tuple[str, str] | None:
        """Take the block's next text (the opener first); the call's name and a prefix
        of its final arguments text, or ``None`` when nothing can be streamed yet."""


Decoder = Callable[[str, bool], "list[ToolCall] | None"]
"""Decodes a block's text into tool calls, ``None`` when malformed. The flag is
true when the block was closed by its marker; an unclosed block (the output
ended) must be decoded strictly: only a structurally complete call counts."""

VerdictKind = Literal["pending", "calls", "drop", "raw", "reject"]


@attrs.frozen
class Verdict:
    """What a block decided.

    Attributes:
        kind: see the module docstring (``pending``: needs more text).
        end: how many characters of the block text (opener included) the verdict
            covers; text after it is scanned again as ordinary output.
        calls: the tool calls, for ``calls``.
        reason: why a block is ``raw`` (for the log).
    """

    kind: VerdictKind
    end: int = 0
    calls: tuple[ToolCall, ...] = ()
    reason: str = ""


PENDING = Verdict("pending")
REJECT = Verdict("reject")


class Block:
    """One candidate markup region, from its opening marker on.

    Args:
        opener: the marker that started the block (its text begins the block).
    """

    def __init__(self, opener: str) -> None:
        self.opener = opener
        self._text = TailFinder(self.closer or "\x00")

    closer: str | None = None
    """The marker that ends the block, when it has a fixed one."""
    inline: bool = False
    """A lone token removed without touching the whitespace around it."""
    progress: Progress | None = None
    """Set by a parser whose calls can be streamed while they are written: fed the same
    text as the block."""

    def text(self) -> str:
        """The block's text so far, opener included."""
        return self._text.text()

    def advance(self, new: str, final: bool) -> Verdict:
        """Take the next piece of text; ``final``: no more text will come.

        Must not return ``pending`` when ``final`` is true.
        """
        found = self._text.add(new)
        return self.decide(found, final)

    def decide(self, found: int, final: bool) -> Verdict:
        """Decide from the text so far; ``found``: offset of :attr:`closer` or -1.

        Blocks with a fixed closer implement this; others override :meth:`advance`.
        """
        raise NotImplementedError


class TagBlock(Block):
    """``opener BODY closer``: the body is decoded once the closer arrives.

    Args:
        opener: the opening marker.
        closer: the closing marker.
        decode: (body text, closed) -> tool calls, or ``None`` when malformed.
        accept_unclosed: at the end of the output, decode an unclosed body anyway
            (the closer is sometimes a stop token, or lost to ``max_tokens`` right
            after a complete call); a body that does not decode is still content.
    """

    def __init__(
        self, opener: str, closer: str, decode: Decoder, *, accept_unclosed: bool = True
    ) -> None:
        self.closer = closer
        super().__init__(opener)
        self.decode = decode
        self.accept_unclosed = accept_unclosed

    def decide(self, found: int, final: bool) -> Verdict:
        """Decode the body once the closer is there (or at the end, if allowed)."""
        if found < 0 and not final:
            return PENDING
        text = self.text()
        start = len(self.opener)
        if found >= 0:
            end = found + len(self.closer or "")
            body = text[start:found]
        else:
            end = len(text)
            body = text[start:]
            if not self.accept_unclosed:
                return Verdict("raw", end, reason="unclosed at the end of the output")
        calls = self.decode(body, found >= 0)
        if calls:
            return Verdict("calls", end, tuple(calls))
        # A second opener inside a broken body starts a new block: give back only
        # the broken part so the rest is scanned again.
        again = body.find(self.opener)
        if again >= 0:
            return Verdict("raw", start + again, reason="malformed, followed by a new block")
        why = "malformed" if found >= 0 else "truncated (no closing marker)"
        return Verdict("raw", end, reason=why)


class JsonTagBlock(TagBlock):
    """A :class:`TagBlock` whose body may be JSON: a closer inside a JSON string is text.

    ``{"arguments": {"code": "print('</tool_call>')"}}`` must not end the block at the
    marker inside the string. When the body starts with ``{`` or ``[``, the closer counts
    only after that JSON value has closed; a body that is not JSON (XML, say) behaves as
    in :class:`TagBlock`. If the value never closes (a string left open by a broken
    call), the end of the output decides from the first closer, as a plain
    :class:`TagBlock` would, so the text after it is still scanned for calls.
    """

    def __init__(
        self, opener: str, closer: str, decode: Decoder, *, accept_unclosed: bool = True
    ) -> None:
        super().__init__(opener, closer, decode, accept_unclosed=accept_unclosed)
        self._scanner = BracketScanner()
        self._seen = 0  # characters of the block text given to the scanner or ``_after``
        self._first = -1  # the first closer anywhere in the block
        self._value_end = -1  # where the body's first JSON value closed
        self._after: TailFinder | None = None  # finds the closer after that value

    def advance(self, new: str, final: bool) -> Verdict:
        """Feed the scanner (while inside the JSON value), then look for the closer."""
        found = self._text.add(new)
        if self._first < 0:
            self._first = found
        start, self._seen = self._seen, self._seen + len(new)
        if self._after is None:
            if not self._scanner.failed:
                skip = max(0, len(self.opener) - start)  # the opener itself is not body
                end = self._scanner.add(new[skip:])
                if end >= 0:
                    self._value_end = len(self.opener) + end
                    self._after = TailFinder(self.closer or "")
                    return self._closer_after(self.text()[self._value_end :], final)
            if self._scanner.failed:  # not JSON: the first closer ends the block
                return self.decide(self._first, final)
            return self.decide(self._first, True) if final else PENDING
        return self._closer_after(new, final)

    def _closer_after(self, text: str, final: bool) -> Verdict:
        assert self._after is not None
        found = self._after.add(text)
        return self.decide(found + self._value_end if found >= 0 else -1, final)


class DropBlock(Block):
    """Control markup removed from the output: the opener alone, or up to ``closer``
    (everything up to the end of the output when the closer never comes).

    ``inline``: a lone token removed without touching the whitespace around it
    (otherwise whitespace touching the dropped markup goes too, as for calls).
    """

    def __init__(self, opener: str, closer: str | None = None, *, inline: bool = False) -> None:
        self.closer = closer
        super().__init__(opener)
        self.inline = inline

    def decide(self, found: int, final: bool) -> Verdict:
        """Drop the opener, or the whole region once closed."""
        if self.closer is None:
            return Verdict("drop", len(self.opener))
        if found >= 0:
            return Verdict("drop", found + len(self.closer))
        if final:
            return Verdict("drop", len(self._text))
        return PENDING


class NamedBlock(Block):
    """A degraded form ``opener NAME sep ... closer`` accepted only for known tools.

    The name runs from the end of ``opener`` to ``name_end``; the block is
    rejected as soon as the name is complete and not one of ``names`` (or is
    longer than ``max_name`` characters), so unrelated text is released early.

    Args:
        opener: e.g. ``<function=``.
        name_end: the character ending the name (``>``).
        closer: e.g. ``</function>``.
        decode: (the whole block text, opener to closer; closed) -> calls, or ``None``.
        names: the request's tool names.
        unquote: strip quotes around the name (``name="x"``).
    """

    def __init__(
        self,
        opener: str,
        name_end: str,
        closer: str,
        decode: Decoder,
        names: set[str],
        *,
        unquote: bool = False,
        max_name: int = 256,
    ) -> None:
        self.closer = closer
        super().__init__(opener)
        self.name_end = name_end
        self.decode = decode
        self.names = names
        self.unquote = unquote
        self.max_name = max_name
        self._named = False

    def decide(self, found: int, final: bool) -> Verdict:
        """Check the name first, then wait for the closer and decode."""
        text = self.text() if not self._named or found >= 0 or final else ""
        if not self._named:
            stop = text.find(self.name_end, len(self.opener))
            if stop < 0:
                too_long = len(text) - len(self.opener) > self.max_name
                return REJECT if final or too_long else PENDING
            name = text[len(self.opener) : stop].strip()
            if self.unquote:
                name = name.strip("\"'")
            if name not in self.names:
                return REJECT
            self._named = True
        if found < 0 and not final:
            return PENDING
        end = found + len(self.closer or "") if found >= 0 else len(text)
        calls = self.decode(text[:end], found >= 0)
        if calls:
            return Verdict("calls", end, tuple(calls))
        return REJECT
