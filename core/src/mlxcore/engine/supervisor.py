"""The engine's supervision: a fault or a hung step fails the open requests and
rebuilds the strategies, within the restart budget (:mod:`mlxcore.engine.supervision`).

:class:`Supervisor` is the part of :class:`~mlxcore.engine.engine.Engine` that handles
what goes wrong: :meth:`Supervisor._recover` after an exception escapes a step (on the
generation thread), the watchdog thread that abandons a step stuck past
``--engine-watchdog`` and starts a fresh generation thread, and the rebuild of the batch
loop both end in. Every method runs under, or takes, the engine's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlxcore.config import ServerConfig
from mlxcore.engine.admission import Admission, EngineUnavailable
from mlxcore.engine.events import UNAVAILABLE
from mlxcore.engine.jobs import JobQueue
from mlxcore.engine.loop import BatchLoop
from mlxcore.engine.memory import release_memory
from mlxcore.engine.prefix_pool import PoolSeat
from mlxcore.engine.step_sync import StepSync
from mlxcore.engine.supervision import Restarts
from mlxcore.engine.threads import run_job

log = logging.getLogger("mlxcore.engine.engine")


class Supervisor:
    """Fault recovery and the watchdog (a base of the engine; see the module docstring)."""

    config: ServerConfig
    admission: Admission
    jobs: JobQueue
    restarts: Restarts
    step_sync: StepSync | None
    pool_seat: PoolSeat
    state: str
    reason: str
    _loop: BatchLoop
    _wake: threading.Condition
    _epoch: int
    _busy_since: float | None
    _thread_done: threading.Event | None

    if TYPE_CHECKING:

        def new_loop(self) -> BatchLoop: ...

        def _publish(self, loop: BatchLoop) -> None: ...

        def _run(self, stream: Any, epoch: int, fresh: bool) -> None: ...

    def _recover(self, epoch: int, exc: BaseException) -> bool:
        """An exception escaped the loop: fail everything, rebuild. False: stop the thread."""
        log.error("engine fault: %s: %s", type(exc).__name__, exc, exc_info=exc)
        with self._wake:
            if epoch != self._epoch:
                return False
            self.restarts.faults["exception"] += 1
            reason = f"engine fault ({type(exc).__name__}){self._restart_note(exc)}"
            self._loop.fail_all(reason, UNAVAILABLE)
            self.admission.end_all(UNAVAILABLE, reason)
            self.jobs.fail_running(EngineUnavailable(reason))
            if not self._may_restart(reason):
                return False
        release_memory()
        return self._install_fresh_loop(epoch)

    def _restart_note(self, exc: BaseException | None = None) -> str:
        """How a fault's reason ends: the engine restarts, or (distributed) it cannot."""
        return "; restarting" if self.step_sync is None else self.step_sync.fault_note(exc)

    def _may_restart(self, reason: str) -> bool:
        """Count a restart, or mark the engine failed for good (caller holds the lock)."""
        if self.step_sync is not None:
            # the other ranks cannot rebuild in step with this one
            self.state = "failed"
            self.reason = reason
            log.critical("engine failed for good: %s", self.reason)
            return False
        if not self.restarts.spend():
            self.state = "failed"
            self.reason = f"{reason.removesuffix('; restarting')}; no restarts left"
            log.critical("engine failed for good: %s", self.reason)
            return False
        self.reason = reason
        return True

    def _install_fresh_loop(self, epoch: int) -> bool:
        """Build fresh strategies for ``epoch`` (on the engine thread)."""
        try:
            loop = self.new_loop()
        except Exception as exc:
            log.exception("could not rebuild the engine's strategies")
            with self._wake:
                self.state, self.reason = "failed", f"restart failed: {type(exc).__name__}"
            return False
        self.pool_seat.offer(loop.cache)
        with self._wake:
            if epoch != self._epoch:
                return False
            old, self._loop = self._loop, loop
            self._publish(loop)
            spent = len(self.restarts.recent)
            log.warning("engine restarted with fresh strategies (%d restarts)", spent)
        # the old cache may flush files: not on the engine thread
        threading.Thread(target=close_cache, args=(old,), daemon=True).start()
        return True

    def _abandon_loop(self, reason: str) -> None:
        """Give up on the current loop's thread (caller holds the lock)."""
        old = self._loop
        self._epoch += 1
        old.abandon(reason, UNAVAILABLE)  # marked first: no late token after the finishes
        self.jobs.fail_running(EngineUnavailable(reason))
        self._busy_since = None

    # -- watchdog thread ---------------------------------------------------

    def _watch_period(self) -> float:
        """``--engine-watchdog``, or the distributed deadline when shorter (0: off)."""
        period = self.config.engine_watchdog
        if self.step_sync is not None:
            period = min(period or self.step_sync.deadline, self.step_sync.deadline)
        return period

    def _watch(self) -> None:
        period = self._watch_period()
        while True:
            time.sleep(min(0.25, period / 10))
            with self._wake:
                if self.state in ("stopped", "failed"):
                    return  # let an unloaded engine (and its model) be freed
                since = self._busy_since
                if self.state != "running" or since is None:
                    continue
                stuck = time.monotonic() - since
                if stuck < period:
                    continue
                stall = self._loop.stall_report(stuck)
                self.restarts.stalls.append(stall)
                log.critical("engine step made no progress for %.1f s: %s", stuck, stall.summary())
                self.restarts.faults["hang"] += 1
                reason = f"engine step made no progress for {stuck:.0f} s{self._restart_note()}"
                self._abandon_loop(reason)
                self.admission.end_all(UNAVAILABLE, reason)
                if not self._may_restart(reason):
                    continue
                self._thread_done = run_job(self._fresh_job(self._epoch))

    def _fresh_job(self, epoch: int) -> Callable[[Any], None]:
        """A generation-thread job that builds fresh strategies, then runs ``epoch``."""
        return lambda stream: self._run(stream, epoch, fresh=True)


def close_cache(loop: BatchLoop) -> None:
    """Let a loop's cache strategy release its threads and files."""
    try:
        loop.cache.close()
    except Exception:
        log.exception("cache strategy %s failed to close", loop.cache.name)
