"""The engine step in lockstep over the ranks: rank 0 leads, the others follow.

Every rank runs the same :class:`~mlxcore.engine.loop.BatchLoop` over its shard of the
model. Before each step, rank 0 sends one :class:`StepMessage` through the
:class:`~mlxcore.distributed.control.ControlChannel` (what its engine admitted, what was
cancelled, how many prefix-cache entries it keeps), and every rank applies it the same
way before running the step; a step with nothing new costs one 4-byte collective.

What would make the ranks' steps differ is kept out of the loop:

* cancellations, set by HTTP threads at any moment, reach the loop only through the
  message: rank 0's loop sees :class:`LockstepHandle` stand-ins whose cancellation is
  applied at a step's start, on every rank at once;
* a sampled request without a seed gets one drawn on rank 0, so every rank's sampler
  draws the same keys;
* admission by memory and queue deadlines are rank 0's decisions (the message carries
  their outcome); the other ranks' prefix caches do not evict by their own byte counts
  (a pipeline stage's bytes differ from rank 0's) but trim to rank 0's entry count.

With every step's message the ranks compare a checksum of the tokens they sampled so
far (it rides in the same collective); a difference, or a broken collective when a rank
was lost, raises :class:`RanksDisagree` on every rank still running.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import time
import zlib
from typing import Any

import attrs

from mlxcore.distributed.control import ControlChannel
from mlxcore.engine.events import Event, EventSink, FinishEvent, RequestHandle, TokenEvent
from mlxcore.engine.loop import BatchLoop
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import MlxcoreError

log = logging.getLogger(__name__)

PAUSE_MIN, PAUSE_MAX = 0.005, 0.05
"""Seconds an idle rank 0 pauses the group for: the first pause after work, doubling up
to the longest. mlx's ring backend waits for a collective by polling (a whole core), so
an idle group does not wait in one: rank 0 announces a pause, every rank sleeps that
long, and they meet again. A request arriving while idle waits at most one pause; a
lost rank is noticed within one."""

PAUSE_MARGIN = 0.002
"""The other ranks wake this much before rank 0, so rank 0 is not the one waiting."""


class RanksDisagree(MlxcoreError):
    """The ranks sampled different tokens: a rank was lost (its collectives returned
    garbage) or the ranks' states diverged."""


@attrs.frozen
class StepMessage:
    """What rank 0 tells every rank before one engine step.

    Attributes:
        admit: the requests admitted this step, with the uid rank 0 gave each.
        cancel: requests ended early since the last step, with the reason.
        keep_entries: the number of prefix-cache entries rank 0 keeps (``None``: the
            same as last time).
        stop: rank 0 is shutting down; the other ranks leave their loop.
        pause: nothing to do: sleep this many seconds, run no step.
        cache_settings: rank 0's cache strategy settings
            (:meth:`~mlxcore.engine.strategies.CacheStrategy.shared_settings`), in its
            first step message.
    """

    admit: tuple[tuple[int, GenerationRequest], ...] = ()
    cancel: tuple[tuple[int, str], ...] = ()
    keep_entries: int | None = None
    stop: bool = False
    pause: float = 0.0
    cache_settings: Any = None

    @property
    def empty(self) -> bool:
        """True when the message changes nothing (not sent: the length says 0)."""
        changes = self.admit or self.cancel or self.stop or self.pause
        return not changes and self.keep_entries is None and self.cache_settings is None

    def encode(self) -> bytes:
        """The message as bytes (pickled: it only travels between the ranks of one
        deployment, which run the same code)."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes | None) -> StepMessage:
        """The message rank 0 sent (an empty one for ``None``)."""
        if not data:
            return cls()
        try:
            message = pickle.loads(data)  # rank 0 of the same deployment, same code
        except Exception as exc:
            raise MlxcoreError(f"unreadable step message ({exc}): rank 0 was lost") from exc
        if not isinstance(message, cls):
            raise MlxcoreError(f"rank 0 sent a {type(message).__name__}, not a step message")
        return message


class LockstepHandle(RequestHandle):
    """The loop's view of a request in a distributed engine.

    Its cancellation changes only when a step message applies it (:meth:`apply_end`)
    or when the loop itself ends it (a stop token, ``max_tokens``: the same on every
    rank). On rank 0 it forwards events and the cached-token count to the front end's
    handle (``real``); :meth:`cancel` (a failed sink) asks the real handle, so the
    cancellation travels with the next message.
    """

    def __init__(
        self, uid: int, request: GenerationRequest, sink: EventSink, real: RequestHandle | None
    ) -> None:
        self.real = real
        super().__init__(uid, request, sink, real.on_admitted if real is not None else None)

    @property
    def cached_tokens(self) -> int:
        return self._cached

    @cached_tokens.setter
    def cached_tokens(self, value: int) -> None:
        self._cached = value
        if self.real is not None:
            self.real.cached_tokens = value

    def cancel(self) -> None:
        """Ask for a cancellation at the next step (on every rank)."""
        if self.real is not None:
            self.real.cancel()

    def apply_end(self, reason: str) -> None:
        """End the request now, as the step message says."""
        self.end_early(reason)


class Lockstep:
    """One rank's side of the lockstep (rank 0 leads with :meth:`lead`, the others
    follow with :meth:`follow`).

    Attributes:
        channel: the collectives to the other ranks.
        steps: engine steps run in lockstep so far.
        checks: checksum comparisons passed.
    """

    def __init__(self, channel: ControlChannel, deadline: float = 20.0) -> None:
        self.channel = channel
        self.deadline = deadline
        """Seconds a step or pause may take before a rank counts as lost."""
        self.busy_since: float | None = None
        """When a follower's current exchange or step began (None: between them)."""
        self.steps = 0
        self.checks = 0
        self._digest = 0
        self._handles: dict[int, LockstepHandle] = {}
        self._entries: int | None = None
        self._settings_sent = False
        self._pauses = 0
        self.stopped = False
        self.lost = False
        """An exchange failed or the checksums differed: the group is broken (no
        further exchange is tried)."""
        self.weights_mib: list[int] = []
        """Each rank's share of the weights, in MiB, by rank (set at start-up)."""

    # -- both sides ----------------------------------------------------------

    def _sink(self, uid: int, forward: EventSink | None) -> EventSink:
        """A sink that adds the tokens to the checksum first, then forwards."""

        def sink(event: Event) -> None:
            if isinstance(event, TokenEvent):
                ids = [uid, *(t.token for t in event.tokens)]
                self._digest = zlib.crc32(repr(ids).encode(), self._digest)
            elif isinstance(event, FinishEvent):
                self._handles.pop(uid, None)
            if forward is not None:
                forward(event)

        return sink

    def _apply(self, loop: BatchLoop, message: StepMessage) -> None:
        """Apply ``message`` to ``loop`` before its step: trim the cache, end the
        cancelled requests (admissions are passed to the step itself)."""
        if message.cache_settings is not None:
            loop.cache.adopt_settings(message.cache_settings)
        if message.keep_entries is not None:
            loop.cache.trim_entries(message.keep_entries)
        for uid, reason in message.cancel:
            handle = self._handles.get(uid)
            if handle is not None:
                handle.apply_end(reason)
        self.steps += 1

    def _exchange(self, data: bytes | None) -> StepMessage:
        """One exchange with the other ranks; checks that they sampled the same tokens."""
        try:
            payload, checksums = self.channel.exchange(data, self._digest)
        except MlxcoreError as exc:
            self.lost = True
            raise RanksDisagree(str(exc)) from exc
        if len(set(checksums)) > 1:
            self.lost = True
            raise RanksDisagree(
                f"the ranks sampled different tokens (checksums {checksums} after "
                f"{self.steps} steps): a rank was lost, or their shards or flags differ"
            )
        self.checks += 1
        return StepMessage.decode(payload)

    def stats(self) -> dict[str, float]:
        """Gauges for ``/metrics`` (``distributed_`` prefixed by the engine)."""
        return {
            "ranks": self.channel.size,
            "steps": self.steps,
            "messages": self.channel.messages,
            "collective_seconds": self.channel.seconds,
            "checks": self.checks,
            **{f"rank{r}_weights_bytes": mib * 2**20 for r, mib in enumerate(self.weights_mib)},
        }

    def fault_note(self, exc: BaseException | None) -> str:
        """How the reason of an engine fault ends (``exc``: what escaped the step, or
        ``None`` for a step that made no progress): a distributed engine does not restart."""
        if self.lost or exc is None:
            return "; a rank of the distributed group was lost or diverged (see the server logs)"
        return "; a distributed engine does not restart: the group stops"

    # -- rank 0 ------------------------------------------------------------------

    def pause(self) -> float:
        """Rank 0 has nothing to do: pause every rank; returns the pause in seconds (no
        step runs, the checksum cadence is unchanged)."""
        seconds = min(PAUSE_MAX, PAUSE_MIN * 2**self._pauses)
        self._pauses += 1
        self._exchange(StepMessage(pause=seconds).encode())
        return seconds

    def lead(self, loop: BatchLoop, admitted: list[RequestHandle]) -> list[RequestHandle]:
        """Rank 0, before a step: send the step's message, apply it, and return the
        stand-ins of ``admitted`` for the loop."""
        self._pauses = 0
        admit: list[tuple[int, GenerationRequest]] = []
        handles: list[LockstepHandle] = []
        for real in admitted:
            request = with_seed(real.request)
            handle = LockstepHandle(real.uid, request, self._sink(real.uid, real.sink), real)
            admit.append((real.uid, request))
            handles.append(handle)
        cancel = tuple(
            (uid, reason)
            for uid, handle in self._handles.items()
            if handle.cancel_reason is None
            and handle.real is not None
            and (reason := handle.real.cancel_reason) is not None
        )
        entries = loop.cache.stats().entries
        keep = entries if entries != self._entries else None
        self._entries = entries
        settings = None
        if not self._settings_sent:
            settings, self._settings_sent = loop.cache.shared_settings(), True
        message = StepMessage(tuple(admit), cancel, keep, cache_settings=settings)
        self._exchange(None if message.empty else message.encode())
        for handle in handles:
            self._handles[handle.uid] = handle
        self._apply(loop, attrs.evolve(message, keep_entries=None, cache_settings=None))
        return list(handles)

    def close(self) -> None:
        """Rank 0 is stopping (or its engine failed): tell the other ranks to leave their
        loop, unless the group is already broken."""
        if self.stopped or self.lost:
            return
        self.stopped = True
        self._exchange(StepMessage(stop=True).encode())

    # -- ranks 1.. -----------------------------------------------------------------

    def follow(self, loop: BatchLoop) -> None:
        """A rank other than 0: run rank 0's steps until it stops (raises when a rank is
        lost or the checksums differ)."""
        loop.cache.follow_evictions()
        while True:
            self.busy_since = time.monotonic()
            message = self._exchange(None)
            self.busy_since = None
            if message.stop:
                self.stopped = True
                return
            if message.pause:
                time.sleep(max(0.0, message.pause - PAUSE_MARGIN))
                continue
            admitted: list[RequestHandle] = []
            for uid, request in message.admit:
                handle = LockstepHandle(uid, request, self._sink(uid, None), None)
                self._handles[uid] = handle
                admitted.append(handle)
            self.busy_since = time.monotonic()
            self._apply(loop, message)
            loop.iterate(admitted)
            self.busy_since = None


def with_seed(request: GenerationRequest) -> GenerationRequest:
    """``request`` with a seed of rank 0's drawing when it samples without one."""
    sampling = request.sampling
    if sampling.greedy or sampling.seed is not None:
        return request
    return attrs.evolve(request, sampling=attrs.evolve(sampling, seed=secrets.randbits(62)))
