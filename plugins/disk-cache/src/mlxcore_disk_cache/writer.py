"""Writes entries to disk on a thread of its own, so no engine step waits for a disk.

The engine hands over a compact copy of a cache whose arrays are evaluated and never
mutated afterwards (the in-memory tier keeps the same copy), so writing it reads
finished buffers only. What waits to be written is bounded in bytes: past the bound a
new entry is skipped (and counted) rather than held in memory.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from mlxcore_disk_cache.store import FATAL_ERRNOS, DiskStore

log = logging.getLogger("mlxcore.plugins.disk_cache")

MAX_FAILURES = 3
"""Consecutive failed writes after which the tier turns itself off."""


@attrs.define
class WriterStats:
    """Counters of the writer (read from any thread)."""

    writes: int = 0
    write_seconds: float = 0.0
    written_bytes: int = 0
    skipped_full_queue: int = 0
    evicted: int = 0
    errors: int = 0


@attrs.define
class _Job:
    tokens: Sequence[int]
    cache: list[Any]
    kind: str
    nbytes: int
    start: int = 0
    parent: str | None = None


class DiskWriter:
    """A daemon thread writing queued entries into ``store``.

    ``on_fatal(exc)`` is called (on the writer thread) when the folder cannot take
    entries any more; the writer then drops what is queued and stops.
    """

    def __init__(
        self,
        store: DiskStore,
        max_pending_bytes: int,
        on_fatal: Callable[[OSError], None],
        *,
        trimmable: bool = False,
    ) -> None:
        self.store = store
        self.trimmable = trimmable
        """Entries can be cut back to any prefix: a new entry replaces its prefixes."""
        self.max_pending_bytes = max_pending_bytes
        self.on_fatal = on_fatal
        self.stats = WriterStats()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._pending = 0
        self._busy = False
        self._closed = False
        self._failures = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="mlxcore-disk-cache", daemon=True)
        self._thread.start()

    @property
    def pending_bytes(self) -> int:
        """Bytes of the entries waiting to be written."""
        with self._cond:
            return self._pending

    def submit(
        self,
        tokens: Sequence[int],
        cache: list[Any],
        nbytes: int,
        kind: str,
        start: int = 0,
        parent: str | None = None,
    ) -> bool:
        """Queue an entry (the state of tokens ``[start, len(tokens))`` on top of the
        entry ``parent``, see :meth:`DiskStore.write`); False when it was skipped
        (closed, or the queue is full)."""
        with self._cond:
            if self._closed:
                return False
            if self._pending + nbytes > self.max_pending_bytes and self._jobs:
                self.stats.skipped_full_queue += 1
                return False
            self._jobs.append(_Job(tuple(tokens), cache, kind, nbytes, start, parent))
            self._pending += nbytes
            self._cond.notify()
            return True

    def flush(self, timeout: float) -> bool:
        """Wait until the queue is empty and no write runs; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._jobs or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), then stop the thread."""
        if not self.flush(timeout):
            log.warning("disk-cache: %d entries not written at shutdown", len(self._jobs))
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._pending = 0
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._write(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._pending -= job.nbytes
                    self._cond.notify_all()
                del job

    def _write(self, job: _Job) -> None:
        start = time.perf_counter()
        try:
            entry = self.store.write(job.tokens, job.cache, job.kind, job.start, job.parent)
            if entry is None:
                return
            if self.trimmable:
                self.store.drop_prefixes_of(entry)
            evicted = self.store.enforce_size()
        except OSError as exc:
            self.stats.errors += 1
            self._failures += 1
            if exc.errno in FATAL_ERRNOS or self._failures >= MAX_FAILURES:
                self.on_fatal(exc)
                with self._cond:
                    self._closed = True
                    self._jobs.clear()
            else:
                log.warning("disk-cache: writing an entry failed: %s", exc)
            return
        except Exception:
            self.stats.errors += 1
            self._failures += 1
            log.exception("disk-cache: writing an entry of %d tokens failed", len(job.tokens))
            return
        self._failures = 0
        self.stats.writes += 1
        self.stats.write_seconds += time.perf_counter() - start
        self.stats.written_bytes += entry.nbytes
        self.stats.evicted += evicted
