"""Long-lived threads that own MLX streams.

MLX streams belong to the thread that created them, and a thread that created a
stream and then exits can make the process abort at exit ("terminate called
without an active exception"). So generation threads are never allowed to end:
an engine borrows a parked worker (or starts a new one) for as long as it runs,
and the worker goes back to the pool afterwards, keeping its stream, whether the
job returned or raised.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import mlx.core as mx

log = logging.getLogger(__name__)
T = TypeVar("T")

Job = Callable[[Any], None]
"""Runs on a worker thread, given that thread's MLX stream."""


class _Worker(threading.Thread):
    def __init__(self, index: int) -> None:
        super().__init__(name=f"mlxcore-engine-{index}", daemon=True)
        self._job: Job | None = None
        self._done = threading.Event()
        self._ready = threading.Condition()

    def assign(self, job: Job) -> threading.Event:
        """Give this (idle) worker a job; the event is set when the job has finished."""
        with self._ready:
            self._job = job
            self._done = threading.Event()
            self._ready.notify()
            return self._done

    def run(self) -> None:
        stream = mx.new_stream(mx.default_device())
        while True:
            with self._ready:
                while self._job is None:
                    self._ready.wait()
                job, done = self._job, self._done
            try:
                job(stream)
            except BaseException:
                # the worker outlives its job: it goes back to the pool either way
                log.exception("a job on %s raised", self.name)
            del job  # a parked worker must not keep the job's objects (a model) alive
            try:
                mx.synchronize(stream)
            except Exception:
                log.exception("synchronizing %s's stream failed", self.name)
            with self._ready:
                self._job = None
            _release(self)
            done.set()


_lock = threading.Lock()
_idle: list[_Worker] = []
_count = 0


def _release(worker: _Worker) -> None:
    with _lock:
        _idle.append(worker)


def run_job(job: Job) -> threading.Event:
    """Run ``job(stream)`` on a parked MLX worker thread; the returned event is set
    when it has finished."""
    global _count
    with _lock:
        worker = _idle.pop() if _idle else None
        if worker is None:
            _count += 1
            worker = _Worker(_count)
            worker.start()
    return worker.assign(job)


def call_on_worker(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``fn()`` on a parked MLX worker thread, inside that thread's stream (loading a
    model, an embedding forward pass); the future holds its result or exception."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def job(stream: Any) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            with mx.stream(stream):
                result = fn()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    run_job(job)
    return future
