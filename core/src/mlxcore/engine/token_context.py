"""A sequence's tokens as one MLX array for its logits processors, grown step by step.

Processors follow mlx-lm's signature, ``(tokens, logits) -> logits``, with ``tokens`` the
whole context as an array. Converting a sequence's Python token list into a new array
every step costs time that grows with the context (0.66 ms for 32K tokens on the CPU, a
tenth of a small model's step at that length). :class:`TokenContext` keeps the tokens
already converted as one array and converts only what is new: the tokens since the last
consolidation each step (fewer than :data:`CHUNK`), then the whole tail into the kept
array once it reaches :data:`CHUNK` tokens. Nothing here waits for MLX: the arrays stay
lazy until a processor reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

CHUNK = 256
"""New tokens gathered before they join the kept array (then one concatenation)."""


class TokenContext:
    """The context of one sequence (see the module docstring); tokens are only appended,
    and a list shorter than the one seen (a rollback) starts it over."""

    __slots__ = ("_count", "_kept")

    def __init__(self) -> None:
        self._kept: mx.array | None = None
        self._count = 0
        """How many leading tokens ``_kept`` holds."""

    def array(self, tokens: Sequence[int], extra: Any = None) -> mx.array:
        """``tokens`` (followed by the lazy 1-D array ``extra``, if given) as one array."""
        if len(tokens) < self._count:
            self._kept, self._count = None, 0
        if len(tokens) - self._count >= CHUNK:
            fresh = mx.array(list(tokens[self._count :]))
            self._kept = fresh if self._kept is None else mx.concatenate([self._kept, fresh])
            self._count = len(tokens)
            mx.async_eval(self._kept)
        parts = [] if self._kept is None else [self._kept]
        if len(tokens) > self._count:
            parts.append(mx.array(list(tokens[self._count :])))
        if extra is not None:
            parts.append(extra.astype(mx.int32))
        if not parts:
            return mx.array([], dtype=mx.int32)
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)
