"""Model work besides generation (an embedding forward pass, and the scoring and speech
jobs to come), run by the engine on its own thread between two steps of the batch.

A front end never calls the model itself: it hands the engine a :class:`ModelJob` (what
to run, and the bytes it may hold while it runs) and awaits its future. The engine takes
one job per iteration when its bytes fit the memory budget beside the admitted requests'
caches, counts them as reserved while it runs (``/metrics``, ``/health``, and the other
models' admission see them), and its watchdog covers the job like any step: a job that
hangs fails, the engine restarts, the waiting jobs run after the restart. A job that
raises fails alone (its future holds the exception); the batch goes on.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable
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
        run: the work; it runs inside the engine's MLX stream.
        cost: the bytes it may hold while it runs (activations, results).
        future: where its result or exception goes; cancel it to drop a waiting job.
    """

    kind: str
    run: Callable[[], Any]
    cost: int
    future: concurrent.futures.Future[Any] = attrs.field(factory=concurrent.futures.Future)
    queued_at: float = attrs.field(factory=time.monotonic)


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
        """The next job to run now, if its bytes ``fits``; cancelled jobs leave the queue,
        and jobs that waited more than ``max_wait`` seconds (0: no limit) fail with
        ``late()``."""
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

    def run(self, job: ModelJob) -> None:
        """Run ``job`` (engine thread); its exception is its own failure."""
        try:
            result = job.run()
        except Exception as exc:
            log.warning("%s job failed: %s: %s", job.kind, type(exc).__name__, exc)
            self._fail(job, exc)
        else:
            if not job.future.done():  # abandoned by the watchdog meanwhile: nobody waits
                job.future.set_result(result)
                self.completed[job.kind] += 1
        finally:
            if self.running is job:
                self.running = None

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
