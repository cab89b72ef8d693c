"""Model work besides generation (an embedding forward pass, a reranker's scores, a
transcription or speech synthesis from the audio plugin), run by the engine on its own
thread between two steps of the batch.

A front end never calls the model itself: it hands the engine a :class:`ModelJob` (what
to run, and the bytes it may hold while it runs) and awaits its future. A job's work is
a generator that yields after each piece (one forward pass of an embedding batch) and
returns the result, or a plain function (one piece). The engine runs one job at a time,
one piece per iteration, between two steps of the batch, so a large job never holds up
the running streams for long and the watchdog times each piece like any step: a piece
that hangs fails its job, the engine restarts, the waiting jobs run after the restart.
A job starts when its bytes fit the memory budget beside the admitted requests' caches
and counts as reserved while it runs (``/metrics``, ``/health``, and the other models'
admission see it). A job that raises fails alone (its future holds the exception); a
cancelled one stops at its next piece.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable, Generator
from typing import Any

import attrs

log = logging.getLogger(__name__)

KINDS = ("embedding",)
"""Job kinds whose counters are always reported (others appear once they have run)."""


@attrs.define(eq=False)
class ModelJob:
    """One piece of model work: ``run()`` on the engine thread, its result in ``future``.

    Attributes:
        kind: what it is (``embedding``), for the counters.
        work: called once on the engine thread, inside its MLX stream: a generator (one
            piece per ``next``, the result as its return value) or the result itself.
        cost: the bytes it may hold while it runs (activations, results).
        future: where its result or exception goes.
    """

    kind: str
    work: Callable[[], Any]
    cost: int
    future: concurrent.futures.Future[Any] = attrs.field(factory=concurrent.futures.Future)
    queued_at: float = attrs.field(factory=time.monotonic)
    cancelled: bool = False
    pieces: Generator[Any, None, Any] | None = None

    def cancel(self) -> None:
        """Nobody waits for the result any more: drop the job if it waits, stop it at its
        next piece if it runs."""
        self.cancelled = True
        self.future.cancel()


class JobCancelled(Exception):
    """A running job stopped because its caller went away."""


class JobQueue:
    """The jobs waiting for an engine, the one running, and their counters."""

    def __init__(self) -> None:
        self.waiting: collections.deque[ModelJob] = collections.deque()
        self.running: ModelJob | None = None
        self.completed: collections.Counter[str] = collections.Counter()
        self.failed: collections.Counter[str] = collections.Counter()

    @property
    def reserved(self) -> int:
        """Bytes the running job may hold (0 when none runs)."""
        job = self.running
        return 0 if job is None else job.cost

    def take(
        self, fits: Callable[[int], bool], max_wait: float, late: Callable[[], Exception]
    ) -> ModelJob | None:
        """Start the next job (it becomes :attr:`running`) if its bytes ``fits``;
        cancelled jobs leave the queue, and jobs that waited more than ``max_wait``
        seconds (0: no limit) fail with ``late()``."""
        oldest = time.monotonic() - max_wait
        while self.waiting:
            head = self.waiting[0]
            if head.future.cancelled():
                self.waiting.popleft()
                continue
            if max_wait > 0 and head.queued_at < oldest:
                self.waiting.popleft()
                self._fail(head, late())
                continue
            if not fits(head.cost):
                return None
            self.waiting.popleft()
            if head.future.set_running_or_notify_cancel():
                self.running = head
                return head
        return None

    def step(self) -> None:
        """Run the next piece of the running job (engine thread); a job that ends hands
        its result or its own exception to its future."""
        job = self.running
        if job is None:
            return
        try:
            if job.cancelled:
                raise JobCancelled(f"the {job.kind} job was cancelled")
            if job.pieces is None:
                first = job.work()
                if not isinstance(first, Generator):
                    raise StopIteration(first)
                job.pieces = first
            next(job.pieces)
        except StopIteration as done:
            self.running = None
            if not job.future.done():  # abandoned by the watchdog meanwhile: nobody waits
                job.future.set_result(done.value)
                self.completed[job.kind] += 1
        except Exception as exc:
            self.running = None
            if not isinstance(exc, JobCancelled):
                log.warning("%s job failed: %s: %s", job.kind, type(exc).__name__, exc)
            self._fail(job, exc)
            if job.pieces is not None:
                job.pieces.close()

    def fail_waiting(self, error: Exception) -> None:
        """End every waiting job with ``error`` (a fault, shutdown)."""
        while self.waiting:
            self._fail(self.waiting.popleft(), error)

    def fail_running(self, error: Exception) -> None:
        """End the running job with ``error`` (the watchdog gave up on its step)."""
        job, self.running = self.running, None
        if job is not None:
            self._fail(job, error)

    def _fail(self, job: ModelJob, error: Exception) -> None:
        if job.future.done():
            return
        if job.future.running() or job.future.set_running_or_notify_cancel():
            job.future.set_exception(error)
        self.failed[job.kind] += 1

    def stats(self) -> dict[str, float]:
        """``jobs_waiting``, ``jobs_running`` and per kind ``<kind>_jobs_completed`` /
        ``<kind>_jobs_failed``."""
        out: dict[str, float] = {
            "jobs_waiting": len(self.waiting),
            "jobs_running": 0 if self.running is None else 1,
        }
        for kind in sorted({*KINDS, *self.completed, *self.failed}):
            out[f"{kind}_jobs_completed"] = self.completed[kind]
            out[f"{kind}_jobs_failed"] = self.failed[kind]
        return out
