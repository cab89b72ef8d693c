"""Random draws of one piece of audio work kept apart from everything else the engine
samples: mlx-audio's models draw from MLX's global random state, so each recognition or
synthesis runs its pieces on its own key (from its seed) and puts the global key back
after each piece. The same input and seed give the same output, whatever ran between.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx


def global_key() -> int:
    """MLX's global random key as the seed that restores it (``mx.random.key(seed)`` is
    the seed's two 32-bit halves)."""
    key = mx.random.state[0]  # type: ignore[index]
    high, low = (int(v) for v in key.tolist())
    return (high << 32) | low


class OwnRandom:
    """A random stream of its own, starting at ``seed``."""

    def __init__(self, seed: int) -> None:
        self.key = seed & (2**64 - 1)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within: MLX's global random state is this stream's; after: as it was."""
        outside = global_key()
        mx.random.seed(self.key)
        try:
            yield
        finally:
            self.key = global_key()
            mx.random.seed(outside)
