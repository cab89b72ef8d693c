"""Admission: which waiting requests and jobs an engine takes next (a slot free, their
cache within the memory budget), and how waiting ones end (cancelled, past
``--max-queue-wait``, a fault, shutdown).

:class:`Admission` is an object the :class:`~mlxcore.engine.engine.Engine` owns and
calls under its lock.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from mlxcore.config import ServerConfig
from mlxcore.engine.adapters import missing as adapter_missing
from mlxcore.engine.events import OVERLOADED, UNAVAILABLE, FinishEvent, RequestHandle, Usage, send
from mlxcore.engine.jobs import JobQueue, ModelJob
from mlxcore.engine.loop import BatchLoop
from mlxcore.engine.memory import MemoryBudget
from mlxcore.engine.prefix_pool import PoolSeat
from mlxcore.engine.turns import take_turns
from mlxcore.errors import MlxcoreError

log = logging.getLogger("mlxcore.engine.engine")


class EngineOverloaded(MlxcoreError):
    """The waiting queue is full; the caller should retry later (HTTP 503 / 429 / 529)."""


class EngineUnavailable(MlxcoreError):
    """The engine is restarting after a fault, has failed for good, or is shutting down."""


GATHER_CAP = 5
"""The longest a request reaching an idle engine waits for others, in ``--burst-gather``s."""


def admission_order(
    waiting: Sequence[RequestHandle], now: float, aging: float
) -> list[RequestHandle]:
    """The waiting requests in the order they may start: lower ``priority`` first
    (vLLM's convention), each ``aging`` seconds waited counting as one level better (so
    no priority starves; 0: strict); within a priority, round-robin across tenants (each
    API key's first waiting request, then each one's second, ...), so a key that queued
    hundreds does not push another key's one request to the back. Arrival order when
    every request has the same priority and tenant.

    Fairness does not change how a priority ages: the arrival times of a priority's
    requests are handed out, oldest first, to its requests in round-robin order, and a
    request ranks by the time it was handed."""
    if not waiting:
        return []
    first = waiting[0].request
    if all(
        h.request.priority == first.priority and h.request.tenant == first.tenant for h in waiting
    ):
        return list(waiting)
    classes: dict[int, list[RequestHandle]] = {}
    for handle in waiting:
        classes.setdefault(handle.request.priority or 0, []).append(handle)
    ranked: list[tuple[float, float, int, RequestHandle]] = []
    for level, members in classes.items():
        times = sorted(h.queued_at for h in members)
        for n, (at, handle) in enumerate(zip(times, round_robin(members), strict=True)):
            rank = level - (now - at) / aging if aging > 0 else float(level)
            ranked.append((rank, at, n, handle))
    ranked.sort(key=lambda item: item[:3])
    return [item[3] for item in ranked]


def round_robin(handles: Sequence[RequestHandle]) -> list[RequestHandle]:
    """``handles`` (in arrival order) taken in turns across tenants
    (:func:`~mlxcore.engine.turns.take_turns`)."""
    return take_turns(handles, lambda handle: handle.request.tenant)


@attrs.define(eq=False)
class Admission:
    """The engine's waiting requests and jobs, and the rules that admit them.

    The engine owns one and calls it under its lock (``Engine._wake``) from the engine
    thread, except :meth:`waiting_ended` (any thread) and what the engine's caller side
    does under the same lock (queueing, ending the queue at shutdown).
    """

    model: Any
    config: ServerConfig
    memory: MemoryBudget
    pool_seat: PoolSeat
    jobs: JobQueue
    waiting: collections.deque[RequestHandle] = attrs.field(factory=collections.deque)
    """Requests queued, in arrival order."""
    expired: int = 0
    """Requests ended for waiting longer than ``--max-queue-wait``."""
    peak_reserved: int = 0
    """The most cache bytes admitted requests could hold at once, so far."""
    stopping: bool = False
    """The engine drains for shutdown: nothing is admitted, nothing is paused."""
    _interactive_at: float = float("-inf")
    """When an interactive (not background) request was last seen waiting or running."""
    _pausing: bool = False
    """Background requests are held back this round (:meth:`background_pause`)."""
    _waiting_cancels: bool = False
    """A request was ended early while it waited (set by its handle): the next look at
    the queue drops it (a scan per cancellation, not per step)."""

    def waiting_ended(self, handle: RequestHandle) -> None:
        """A handle's ``on_end`` until it is admitted (any thread)."""
        self._waiting_cancels = True

    def drop_cancelled(self) -> None:
        """Requests cancelled while queued leave the queue at once."""
        if not self._waiting_cancels:
            return
        self._waiting_cancels = False
        keep: collections.deque[RequestHandle] = collections.deque()
        for handle in self.waiting:
            if handle.cancel_reason is None:
                keep.append(handle)
            else:
                end(handle, handle.cancel_reason)
        self.waiting = keep

    def expire(self) -> None:
        """Requests that waited longer than ``--max-queue-wait`` end as overloaded."""
        limit = self.config.max_queue_wait
        if limit <= 0 or not self.waiting:
            return
        oldest = time.monotonic() - limit
        while self.waiting and self.waiting[0].queued_at < oldest:
            handle = self.waiting.popleft()
            self.expired += 1
            end(handle, "error", OVERLOADED, f"waited more than {limit:g} s in the queue")

    def end_all(self, code: str, error: str) -> None:
        """End every waiting request and job with ``error``."""
        while self.waiting:
            end(self.waiting.popleft(), "error", code, error)
        self.jobs.fail_waiting(EngineUnavailable(error))

    def reserved(self, loop: BatchLoop) -> int:
        """Cache bytes the admitted requests may grow to (prompt + max_tokens each), and
        the bytes of the running job."""
        return self.jobs.reserved + self.cost([live.handle for live in list(loop.live.values())])

    def cost(self, handles: Sequence[RequestHandle]) -> int:
        """Cache bytes ``handles`` may grow to (prompt + max_tokens each)."""
        return sum(self.need(h) for h in handles)

    def need(self, handle: RequestHandle) -> int:
        """Cache bytes one request may grow to: its prompt and its whole budget."""
        return self.memory.cost(len(handle.request.prompt_tokens) + handle.request.max_tokens)

    def take_job(self, loop: BatchLoop) -> ModelJob | None:
        """Start the next job after this step, if its bytes fit beside the admitted
        requests (nothing is computed while no job waits: this runs every iteration)."""
        if not self.jobs.waiting:
            return None
        reserved = self.reserved(loop)
        limit = self.config.max_queue_wait

        def fits(need: int) -> bool:
            return not loop.live or self._fits(loop, reserved + need)

        def late() -> Exception:  # one error per job: a future's exception is its own
            return EngineOverloaded(f"server busy: the job waited more than {limit:g} s")

        return self.jobs.take(fits, limit, late)

    def take_waiting(self, loop: BatchLoop) -> list[RequestHandle]:
        """Pop the requests that may start now, in :func:`admission_order`: a free slot
        each (or, in a full batch, a tenant's first row: :class:`FirstRow`), and their
        cache fits the budget left (evicting prefix-cache entries first). The first that
        does not fit stops the round (nothing overtakes it for being smaller, so a long
        prompt is not starved)."""
        self.drop_cancelled()
        now = time.monotonic()
        held = self._background_held(loop, now)
        room = self.config.max_num_seqs - len(loop.live)
        fair = FirstRow.of(loop, self.waiting, self.config.max_num_seqs)
        if (room <= 0 and fair is None) or not self.waiting:
            self._pausing = held and all(self._is_background(h) for h in self.waiting)
            return []
        reserved = self.reserved(loop)
        taken: list[RequestHandle] = []
        left: set[int] = set()
        order = admission_order(self.waiting, now, self.config.priority_aging)
        for handle in order:
            if room <= 0 and (fair is None or not fair.may_start(handle, len(taken))):
                if fair is None:
                    break
                continue  # a full batch: a tenant with no row behind may still start
            if held and self._is_background(handle):
                continue  # idle capacity only: it waits, without holding up the others
            gone = adapter_missing(self.model, handle.request)
            if gone is not None:  # its LoRA adapter was unloaded while it waited
                end(handle, "error", UNAVAILABLE, gone)
                left.add(id(handle))
                continue
            need = self.need(handle)
            if (loop.live or taken) and not self._fits(loop, reserved + need):
                break
            taken.append(handle)
            left.add(id(handle))
            reserved += need
            room -= 1
            if fair is not None:
                fair.started(handle)
        if left:
            self.waiting = collections.deque(h for h in self.waiting if id(h) not in left)
        # an interactive request that could not start (no slot, no memory) gets the paused
        # background rows' room back: they run (and end) again
        self._pausing = held and all(self._is_background(h) for h in self.waiting)
        self.peak_reserved = max(self.peak_reserved, reserved)
        return taken

    def _is_background(self, handle: RequestHandle) -> bool:
        return (handle.request.priority or 0) >= self.config.background_priority

    def _background_held(self, loop: BatchLoop, now: float) -> bool:
        """Whether background requests (``--background-priority``) wait this round: an
        interactive request is waiting or running, or was less than
        ``--background-grace`` seconds ago (an agent's next turn comes right after its
        last), so a batch starts no new line in front of it."""
        if any(not self._is_background(h) for h in self.waiting) or any(
            not self._is_background(live.handle) for live in list(loop.live.values())
        ):
            self._interactive_at = now
        return now - self._interactive_at < self.config.background_grace

    def background_pause(self) -> Callable[[RequestHandle], bool] | None:
        """Which running requests sit the next step out (``None``: none): the background
        ones, while :meth:`_background_held` holds and no interactive request waits (the
        decoder holds their caches; they go on where they stopped); none while the engine
        drains for shutdown."""
        return self._is_background if self._pausing and not self.stopping else None

    def held_wait(self, loop: BatchLoop, admitted: list[RequestHandle]) -> float:
        """Seconds to sleep when the only work left is background work held back by
        :meth:`_background_held`, waiting or paused (0: there is work to do)."""
        if not self._pausing or self.stopping or admitted or loop.has_work():
            return 0.0
        if self.jobs.running is not None or self.jobs.waiting:
            return 0.0
        if not (self.waiting or loop.paused):
            return 0.0
        return max(0.005, self._interactive_at + self.config.background_grace - time.monotonic())

    def gather_wait(self, loop: BatchLoop) -> float:
        """Seconds to wait before admitting requests that reach an idle engine in a burst
        (``--burst-gather``; 0: admit now). Clients that send many requests at once reach
        the engine a few milliseconds apart (each is parsed and templated first); started
        one by one, the first ones decode while each later arrival's join stretches their
        steps. So with nothing running, admission waits until no request has arrived for
        the gather time, at most :data:`GATHER_CAP` times it from the first arrival.
        Background requests held in the queue do not count as arrivals: a burst of
        interactive requests behind them is gathered all the same."""
        gather = self.config.burst_gather
        if gather <= 0 or self.stopping or not self.waiting or loop.live:
            return 0.0
        if self.jobs.running is not None or self.jobs.waiting:
            return 0.0
        arrived = [h.queued_at for h in self.waiting if not self._is_background(h)]
        arrived = arrived or [h.queued_at for h in self.waiting]
        now = time.monotonic()
        quiet = max(arrived) + gather - now
        cap = min(arrived) + GATHER_CAP * gather - now
        return max(0.0, min(quiet, cap))

    def _fits(self, loop: BatchLoop, reserved: int) -> bool:
        budget = self.memory.kv_budget(held_bytes(loop))
        if budget is None or reserved <= budget:
            return True
        shortfall = reserved - budget
        try:
            loop.cache.evict(shortfall)
        except Exception:
            log.exception("cache strategy %s failed to evict", loop.cache.name)
        budget = self.memory.kv_budget(held_bytes(loop))
        if budget is not None and reserved > budget:
            try:  # then what the decoder keeps (a draft's prefix store)
                loop.decoder.release(reserved - budget)
            except Exception:
                log.exception("decoder %s failed to release memory", loop.decoder.name)
            budget = self.memory.kv_budget(held_bytes(loop))
        if budget is not None and reserved > budget:  # then the other models' prefix caches
            self.pool_seat.reclaim(reserved - budget)
            budget = self.memory.kv_budget(held_bytes(loop))
        return budget is None or reserved <= budget


FIRST_ROW_EXTRA = 4
"""A full batch takes at most ``--max-num-seqs // FIRST_ROW_EXTRA`` (at least one) rows
beyond it for tenants' first rows (:class:`FirstRow`)."""


class FirstRow:
    """A tenant's first row in a batch another tenant fills.

    While requests of two or more tenants (API keys) run or wait, a full batch still
    takes the request of a tenant that has no row running, if it is at least as urgent
    as every row running (a lower priority, and background work, waits for free rows):
    one such row per tenant, at most a quarter of ``--max-num-seqs`` beyond it in all,
    within the memory budget as always. So a key that queued hundreds of requests,
    holding every row, does not make another key's request wait for its rows to finish,
    while tenants that all have rows running share the batch by round-robin admission
    alone (:func:`admission_order`) and the batch stays within ``--max-num-seqs``.
    """

    def __init__(
        self, running: collections.Counter[str | None], rows: int, cap: int, level: int
    ) -> None:
        self.running, self.rows, self.cap = running, rows, cap
        self.level = level
        """The best (lowest) priority running."""

    @classmethod
    def of(
        cls, loop: BatchLoop, waiting: Sequence[RequestHandle], max_num_seqs: int
    ) -> FirstRow | None:
        """The rule now, or ``None`` while one tenant (or none) has work."""
        rows = [live.handle.request for live in list(loop.live.values())]
        running: collections.Counter[str | None] = collections.Counter(r.tenant for r in rows)
        tenants = set(running) | {h.request.tenant for h in waiting}
        if len(tenants) < 2:
            return None
        cap = max_num_seqs + max(1, max_num_seqs // FIRST_ROW_EXTRA)
        level = min((r.priority or 0 for r in rows), default=0)
        return cls(running, len(rows), cap, level)

    def may_start(self, handle: RequestHandle, taken: int) -> bool:
        """Whether ``handle`` may start in a full batch (``taken``: started this round)."""
        request = handle.request
        return (
            self.rows + taken < self.cap
            and self.running[request.tenant] == 0
            and (request.priority or 0) <= self.level
        )

    def started(self, handle: RequestHandle) -> None:
        """Count ``handle`` as running."""
        self.running[handle.request.tenant] += 1


def end(handle: RequestHandle, reason: str, code: str | None = None, error: str = "") -> None:
    """End a request that never started (its usage: the prompt only)."""
    usage = Usage(len(handle.request.prompt_tokens))
    send(handle, FinishEvent(reason, usage, error or None, code))


def held_bytes(loop: BatchLoop) -> int:
    """Bytes kept beyond the running requests: the prefix cache's entries and what the
    decoder keeps (a draft model's prefix store)."""
    return loop.cache.stats().nbytes + loop.decoder.held_bytes()
