"""Where the text so far last contained its own ending: the n-gram index prompt lookup
drafts from.

For each n between ``min_n`` and ``max_n`` the index maps every n-gram of the context to
the position where it last ended. The n-grams ending at the newest position are added
only at the next lookup, so a lookup never finds the context's own ending: it finds the
latest earlier occurrence, and what followed it there is the proposal. Adding a token
costs ``max_n - min_n + 1`` dictionary updates; a lookup as many reads.
"""

from __future__ import annotations

from collections.abc import Iterable


class NgramIndex:
    """An incremental index of one sequence's tokens (prompt, then output)."""

    def __init__(self, max_n: int, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n = max_n
        self.min_n = min_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self._indexed = 0
        """Positions whose n-grams are in the index."""

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the context."""
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the context's
        longest indexed ending (longest n first); empty when nothing matches."""
        ctx = self.tokens
        last = len(ctx) - 1
        for end in range(self._indexed, last):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._ends[tuple(ctx[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, last)
        for n in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            found = self._ends.get(tuple(ctx[len(ctx) - n :]))
            if found is not None:
                return ctx[found + 1 : found + 1 + k]
        return []
