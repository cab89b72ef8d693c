"""One memory budget for the prefix caches of every model a process serves.

With ``--prefix-cache-size auto`` (the default) a model's prefix cache is not given a
size of its own: it takes a *seat* in the process's :class:`PrefixPool`, whose capacity
follows the machine::

    room      = memory limit - weights of every loaded model - MLX's buffer cache limit
    headroom  = HEADROOM x memory limit      (a prefill chunk's activations, the allocator)
    running   = min(room / 2, the running batches' worst case: for each model,
                    --max-num-seqs sequences at the full context)
    capacity  = room - headroom - running

The running batches can still take memory from the prefix caches when they need it
(admission evicts entries first, :mod:`mlxcore.engine.admission`); ``running`` is what
the caches leave free so that this is rare. When the caches together hold more than the
capacity (one grew, or a model was loaded and the capacity shrank), the model used least
recently gives up its entries first, the one that grew last (:meth:`PrefixPool.settle`).

Every cache keeps its own lock; the pool takes at most one cache's lock at a time (after
its own), so two engines settling at once cannot deadlock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.engine.memory import MemoryBudget

log = logging.getLogger(__name__)

HEADROOM = 0.10
"""Share of the memory limit no cache may take: a prefill chunk's activations (its
attention scores grow with the context), the allocator's slack."""

RUNNING_SHARE = 0.5
"""The most of the room the running batches' worst case keeps from the caches."""


@attrs.frozen
class PoolFigures:
    """How the pool's capacity was derived (bytes), for the start-up log and /health."""

    limit: int
    weights: int
    buffer_cache: int
    headroom: int
    running: int
    capacity: int

    def describe(self) -> str:
        """One line: the capacity and where it comes from."""
        gib = 2**30
        return (
            f"{self.capacity / gib:.2f} GiB = memory limit {self.limit / gib:.2f} GiB - weights "
            f"{self.weights / gib:.2f} - MLX buffer cache {self.buffer_cache / gib:.2f} - "
            f"headroom {self.headroom / gib:.2f} - running requests {self.running / gib:.2f}"
        )


class PoolSeat:
    """One model's place in the pool: its memory budget, its running worst case and
    (read when needed) its engine's current cache strategy."""

    def __init__(
        self, pool: PrefixPool, memory: MemoryBudget, running: int, cache: Callable[[], Any]
    ) -> None:
        self.pool = pool
        self.memory = memory
        self.running = running
        self.cache = cache
        self.active_at = time.monotonic()
        self.taken = False
        """The engine's cache strategy is sized from the pool (``auto``)."""

    def capacity(self) -> int:
        """Bytes the pool's caches may hold together now."""
        return self.pool.capacity()

    def settle(self) -> None:
        """This seat's cache grew: bring the pool within its capacity (this cache gives
        up its entries last)."""
        self.active_at = time.monotonic()
        self.pool.settle(self)

    def reclaim(self, nbytes: int) -> int:
        """Free ``nbytes`` from the *other* models' caches, idle longest first (this
        seat's engine needs the memory for running requests); returns bytes freed."""
        return self.pool.reclaim(nbytes, self)

    def leave(self) -> None:
        """The engine stops: its cache no longer counts."""
        self.pool.leave(self)

    def offer(self, cache: Any) -> None:
        """Offer this seat to ``cache`` (the engine's cache strategy, at start and after
        a restart) and log what it holds: the pool's capacity, or its own size."""
        self.taken = bool(cache.size_from_pool(self))
        if self.taken:
            figures = self.pool.figures()
            described = figures.describe() if figures is not None else "memory not known: 2 GiB"
            log.info("prefix cache: auto, %s", described)
            return
        capacity = cache.stats().capacity_bytes
        if capacity:
            log.info("prefix cache: %.2f GiB (--prefix-cache-size)", capacity / 2**30)


class PrefixPool:
    """The process's prefix-cache budget (see the module docstring)."""

    def __init__(self, headroom: float = HEADROOM) -> None:
        self.headroom = headroom
        self._seats: list[PoolSeat] = []
        self._lock = threading.RLock()

    def join(self, memory: MemoryBudget, running: int, cache: Callable[[], Any]) -> PoolSeat:
        """A seat for one model (``running``: its running batch's worst case in bytes;
        ``cache``: returns its engine's cache strategy now)."""
        seat = PoolSeat(self, memory, running, cache)
        with self._lock:
            self._seats.append(seat)
        self.settle(None)  # the capacity shrank by this model's weights
        return seat

    def leave(self, seat: PoolSeat) -> None:
        with self._lock:
            if seat in self._seats:
                self._seats.remove(seat)

    @property
    def seats(self) -> list[PoolSeat]:
        """The models in the pool."""
        with self._lock:
            return list(self._seats)

    def figures(self) -> PoolFigures | None:
        """The capacity and its parts (None: no model, or no memory limit known)."""
        seats = self.seats
        if not seats or seats[0].memory.limit is None:
            return None
        first = seats[0].memory
        assert first.limit is not None
        weights = sum(s.memory.weights for s in seats)
        room = max(0, first.limit - weights - first.cache_limit)
        headroom = int(first.limit * self.headroom)
        running = min(int(room * RUNNING_SHARE), sum(s.running for s in seats))
        capacity = max(0, room - headroom - running)
        return PoolFigures(first.limit, weights, first.cache_limit, headroom, running, capacity)

    def capacity(self) -> int:
        """Bytes the caches may hold together (0 when no limit is known: see
        :data:`UNKNOWN_LIMIT_BYTES`)."""
        figures = self.figures()
        return figures.capacity if figures is not None else UNKNOWN_LIMIT_BYTES

    def held(self) -> int:
        """Bytes the caches hold now."""
        return sum(_held(seat) for seat in self.seats)

    def settle(self, grown: PoolSeat | None) -> None:
        """Evict until the caches fit the capacity: the models used least recently
        first, ``grown`` (the one that just stored something) last."""
        with self._lock:
            excess = self.held() - self.capacity()
            if excess <= 0:
                return
            order = sorted(
                self._seats, key=lambda s: (s is grown, s.active_at)
            )  # idle longest first, the grown one last
            for seat in order:
                if excess <= 0:
                    break
                excess -= _evict(seat, excess)

    def reclaim(self, nbytes: int, needy: PoolSeat) -> int:
        """Free up to ``nbytes`` from the caches of seats other than ``needy``, idle
        longest first; returns bytes freed."""
        freed = 0
        with self._lock:
            for seat in sorted(self._seats, key=lambda s: s.active_at):
                if seat is needy or freed >= nbytes:
                    continue
                freed += _evict(seat, nbytes - freed)
        return freed


UNKNOWN_LIMIT_BYTES = 2 * 2**30
"""The capacity when the machine's memory is not known (no limit to derive it from)."""


def _held(seat: PoolSeat) -> int:
    try:
        return int(seat.cache().stats().nbytes)
    except Exception:  # a cache being replaced after a fault
        log.debug("prefix pool: a cache's stats failed", exc_info=True)
        return 0


def _evict(seat: PoolSeat, nbytes: int) -> int:
    """Evict at least ``nbytes`` (if it holds them) from ``seat``'s cache; bytes freed."""
    before = _held(seat)
    if before <= 0:
        return 0
    try:
        seat.cache().evict(min(nbytes, before))
    except Exception:
        log.exception("prefix pool: a cache failed to evict")
        return 0
    return before - _held(seat)
