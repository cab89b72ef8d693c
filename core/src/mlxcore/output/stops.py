"""Stop strings over streamed text, including matches split across tokens."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Finds the first stop string in a stream of text pieces.

    Text that could still be the start of a stop string is held back, so a stop
    string never reaches the client, even when the model produces it over
    several tokens.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add ``text``; return what is safe to release. After a match, returns
        the text before the stop string and then nothing more."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        first = None
        for stop in self.stops:
            at = buf.find(stop)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.matched = first[1]
            self._held = ""
            return buf[: first[0]]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that begins some stop string."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """At the end of generation: the held-back text was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
