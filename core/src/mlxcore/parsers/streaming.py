"""Shared building blocks for streaming parsers.

Every parser here works the same way: text arrives in pieces, literal markers
(``<tool_call>``, ``</think>``...) switch state, and a piece that *might* be the
start of a marker is held back until the next piece decides it. Work per
``feed`` is proportional to the new text (plus at most one marker length of
held text): nothing re-scans what was already decided.

* :class:`MarkerSet` finds the earliest marker in a piece and measures the
  suffix that must be held back.
* :class:`TailFinder` finds one closing marker in a growing block without
  re-reading the block.
* :class:`BracketScanner` finds where a ``{...}`` / ``[...]`` value closes,
  across pieces, with JSON strings (and optionally Gemma's ``<|"|>`` strings).
* :class:`WhitespaceGate` applies the rule "whitespace touching a markup block
  is dropped" to a released stream without delaying other text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class MarkerSet:
    """A fixed set of literal markers looked for in streamed text.

    Args:
        markers: the literal strings (at least one).
    """

    def __init__(self, markers: Iterable[str]) -> None:
        unique = sorted({m for m in markers if m}, key=len, reverse=True)
        if not unique:
            raise ValueError("MarkerSet needs at least one non-empty marker")
        self.markers: tuple[str, ...] = tuple(unique)
        # Longest first: at one position the regex takes the first alternative that
        # matches, so the longest marker wins a tie.
        self._regex = re.compile("|".join(re.escape(m) for m in unique))
        self._prefixes = frozenset(m[:i] for m in unique for i in range(1, len(m)))
        self._max_partial = max(len(m) for m in unique) - 1

    def find(self, text: str, start: int = 0) -> tuple[int, str]:
        """The earliest full marker in ``text[start:]``: ``(index, marker)``, or ``(-1, "")``."""
        match = self._regex.search(text, start)
        if match is None:
            return -1, ""
        return match.start(), match.group()

    def partial(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a marker.

        That suffix must be held back: the next piece may complete the marker.
        """
        for k in range(min(len(text), self._max_partial), 0, -1):
            if text[-k:] in self._prefixes:
                return k
        return 0


class TailFinder:
    """Finds ``marker`` in text that arrives in pieces, reading each character once.

    Keeps the pieces (joined only when asked) and a carry of ``len(marker) - 1``
    characters so that a marker split across pieces is still found.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self._parts: list[str] = []
        self._length = 0
        self._carry = ""

    def __len__(self) -> int:
        return self._length

    def add(self, text: str) -> int:
        """Append ``text``; return the offset of the first ``marker`` in everything
        added so far, or ``-1``. Once found, the same offset is returned again."""
        window = self._carry + text
        base = self._length - len(self._carry)
        self._parts.append(text)
        self._length += len(text)
        found = window.find(self.marker)
        keep = len(self.marker) - 1
        self._carry = window[-keep:] if keep else ""
        return base + found if found >= 0 else -1

    def text(self) -> str:
        """Everything added so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


class BracketScanner:
    """Finds where one bracketed value (``{...}`` or ``[...]``) ends, across pieces.

    Understands JSON strings (``"..."`` with backslash escapes) and, when
    ``raw_quote`` is given (Gemma's ``<|"|>``), strings between two of those
    delimiters with no escapes. Call :meth:`add` with each new piece; it returns
    the offset (in everything added so far) just past the closing bracket.

    Args:
        raw_quote: an extra multi-character string delimiter, or ``None``.
    """

    _OPEN = {"{": "}", "[": "]"}

    def __init__(self, raw_quote: str | None = None) -> None:
        self.raw_quote = raw_quote
        self._stack: list[str] = []
        self._in: str | None = None  # '"' or raw_quote while inside a string
        self._escape = False
        self._held = ""  # the start of a possible raw_quote cut by a piece boundary
        self._offset = 0  # characters consumed before ``_held``
        self.started = False
        self.failed = False

    def add(self, text: str) -> int:
        """Consume ``text``; the end offset of the value once it closed, else ``-1``.

        Sets :attr:`failed` when the text does not start with a bracket (leading
        whitespace allowed) or a closing bracket does not match.
        """
        buf = self._held + text
        base = self._offset
        self._held = ""
        i = 0
        quote = self.raw_quote
        while i < len(buf):
            ch = buf[i]
            if self._in == '"':
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in = None
            elif quote and ch == quote[0]:
                rest = buf[i : i + len(quote)]
                if rest == quote:
                    self._in = None if self._in == quote else quote
                    i += len(quote)
                    continue
                if quote.startswith(rest):  # cut by the piece boundary: wait
                    self._held = rest
                    break
            elif self._in is not None:
                pass
            elif ch == '"':
                self._in = '"'
            elif ch in self._OPEN:
                self._stack.append(self._OPEN[ch])
                self.started = True
            elif ch in "}]":
                if not self._stack or self._stack.pop() != ch:
                    self.failed = True
                    return -1
                if not self._stack:
                    return base + i + 1
            elif not self.started and not ch.isspace():
                self.failed = True
                return -1
            i += 1
        self._offset = base + len(buf) - len(self._held)
        return -1


class WhitespaceGate:
    """Releases one output stream, dropping whitespace that touches a markup block.

    Trailing whitespace is held until more text shows it is not the last thing
    before a block; whitespace after a block is held until real text comes, and
    kept only when text was released before the block (so ``"ok\n<call>\nbye"``
    gives ``"ok\nbye"``, never ``"okbye"``). Text without blocks passes through
    unchanged (held whitespace is released by :meth:`flush`).
    """

    def __init__(self, *, after_block: bool = False) -> None:
        self.after_block = after_block
        self._held = ""
        self._released = False

    def push(self, text: str) -> str:
        """Take ``text``; return what may be released now."""
        if not text:
            return ""
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        if self.after_block:
            lead = self._held + text[: len(text) - len(text.lstrip())]
            self._held = lead if self._released else ""
            body = body.lstrip()
            self.after_block = False
        out = self._held + body
        self._held = text[len(text.rstrip()) :]
        self._released = True
        return out

    def block(self) -> None:
        """A block starts here: drop the held whitespace and hold what follows."""
        self._held = ""
        self.after_block = True

    def flush(self) -> str:
        """End of stream: release held whitespace, unless it follows a block."""
        out = "" if self.after_block else self._held
        self._held = ""
        return out
