"""The engine's restart budget: how many faults it survives, and when it admits again.

An exception the batch loop cannot contain, or a step the watchdog gives up on, costs
one restart; ``--engine-max-restarts`` of them within :data:`RESTART_WINDOW` seconds
and the engine stays failed. After each restart the engine admits nothing for
:data:`RESTART_BACKOFF` seconds (clients get a retryable 503 meanwhile).
"""

from __future__ import annotations

import collections
import time

import attrs

from mlxcore.engine.stall import StallReport

RESTART_WINDOW = 600.0
"""Seconds over which ``--engine-max-restarts`` is counted."""

RESTART_BACKOFF = 2.0
"""Seconds the engine stays unavailable after a fault before it admits again."""


@attrs.define
class Restarts:
    """Faults seen and restarts spent (the engine calls it under its lock)."""

    allowed: int
    """``--engine-max-restarts``."""
    recent: list[float] = attrs.field(factory=list)
    """When the restarts of the last :data:`RESTART_WINDOW` seconds happened."""
    faults: collections.Counter[str] = attrs.field(factory=collections.Counter)
    """Faults by kind (``exception``, ``hang``)."""
    stalls: collections.deque[StallReport] = attrs.field(
        factory=lambda: collections.deque(maxlen=8)
    )
    """The last steps the watchdog abandoned, named (:mod:`mlxcore.engine.stall`)."""
    available_at: float = 0.0
    """Before this (``time.monotonic()``), the engine does not admit."""

    def spend(self) -> bool:
        """Count one restart; False when none is left in the window."""
        now = time.monotonic()
        self.recent = [t for t in self.recent if now - t < RESTART_WINDOW]
        if len(self.recent) >= self.allowed:
            return False
        self.recent.append(now)
        self.available_at = now + RESTART_BACKOFF
        return True

    def backing_off(self) -> bool:
        """Whether the engine waits out the pause after a restart."""
        return time.monotonic() < self.available_at
