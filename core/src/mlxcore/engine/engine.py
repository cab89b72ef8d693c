"""The engine: one generation thread that owns MLX, fed through a bounded queue, supervised.

Every front end (the CLI's ``generate``, the HTTP server) submits
:class:`~mlxcore.engine.request.GenerationRequest` objects here and receives events
through a sink. The generation thread runs a :class:`~mlxcore.engine.loop.BatchLoop`
(continuous batching over the cache, prefill and decoder strategies). Around it the
engine owns what must hold whatever a strategy does:

* **admission**: a request leaves the waiting queue when a batch slot is free
  (``--max-num-seqs``) and its cache (prompt + max_tokens) fits the memory budget left
  by the weights, the prefix cache (evicted first) and, in a multi-model server, what the
  other models hold; requests waiting past ``--max-queue-wait`` end as overloaded;
* **supervision**: an exception the loop cannot contain, or a step that makes no
  progress for ``--engine-watchdog`` seconds, fails every open request (clients get a
  retryable error, never a hang), marks the engine unavailable and restarts it with
  fresh strategies, at most ``--engine-max-restarts`` times in ten minutes; after that
  the engine stays failed (``/health`` 503, ``mlxcore serve`` exits non-zero);
* **model jobs** (embeddings): other work on the model runs here too, between two steps,
  under the same budget and watchdog (:mod:`mlxcore.engine.jobs`);
* **shutdown**: stop admitting, answer the waiting requests, give the running ones a
  deadline, then end them.
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from mlxcore.config import ServerConfig
from mlxcore.engine.adapters import adapters_of
from mlxcore.engine.admission import Admission, EngineOverloaded, EngineUnavailable, held_bytes
from mlxcore.engine.events import (
    UNAVAILABLE,
    Event,
    EventSink,
    FinishEvent,
    RequestHandle,
)
from mlxcore.engine.handoff import step_batch
from mlxcore.engine.jobs import JobQueue, ModelJob
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.loop import BatchLoop
from mlxcore.engine.memory import MemoryBudget, release_memory
from mlxcore.engine.parts import EngineParts
from mlxcore.engine.prefix_pool import PrefixPool
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.step_sync import StepSync
from mlxcore.engine.strategies import CacheStrategy, Decoder, PrefillStrategy
from mlxcore.engine.threads import run_job
from mlxcore.engine.validation import ModelLimits, RequestRejected, check_request
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo

log = logging.getLogger(__name__)

__all__ = ["Engine", "EngineOverloaded", "EngineParts", "EngineUnavailable", "RequestRejected"]

RESTART_WINDOW = 600.0
"""Seconds over which ``--engine-max-restarts`` is counted."""

IDLE_RELEASE_SECONDS = 1.0
"""Idle time after which unused memory is given back to the system."""

RESTART_BACKOFF = 2.0
"""Seconds the engine stays unavailable after a fault before it admits again."""


class Engine(Admission):
    """Continuous-batching generation over one model, supervised.

    Args:
        model: the loaded mlx-lm model.
        info: facts about the model.
        config: server configuration (batch, queue, memory and supervision bounds).
        parts: the strategy factories and the plugins' per-request processors.
        memory_elsewhere: bytes the other models of this process hold, read whenever
            admission checks the budget (the server's model router passes it).
        prefix_pool: the prefix-cache pool shared by the process's models (the router
            passes one; otherwise the engine has its own): an ``auto``-sized cache takes
            its bound from it (:mod:`mlxcore.engine.prefix_pool`).
    """

    def __init__(
        self,
        model: Any,
        info: ModelInfo,
        config: ServerConfig,
        parts: EngineParts,
        memory_elsewhere: Callable[[], int] | None = None,
        prefix_pool: PrefixPool | None = None,
    ) -> None:
        self.model = model
        self.info = info
        self.config = config
        self.parts = parts
        self.kv_quant = KVQuantization.from_config(config)
        """``--kv-cache-dtype``'s quantization (None: the model's dtype)."""
        if self.kv_quant is not None:
            self.kv_quant.check_model(model)
        self.memory = MemoryBudget.for_model(
            model,
            config.gpu_memory_utilization,
            config.mlx_cache_limit,
            memory_elsewhere,
            self.kv_quant,
        )
        self.max_context: int | None = config.max_model_len or info.context_length
        """The most tokens a sequence may hold: ``--max-model-len``, else the model's own."""
        self.counters: collections.Counter[str] = collections.Counter()
        """Totals across loops: ``prompt_tokens_processed``, ``prefill_shared_prefix_waits``."""
        self._loop = self.new_loop()
        self.memory.side_per_token = self.decoder.side_cache_bytes_per_token()
        running = config.max_num_seqs * self.memory.cost(
            self.max_context or self.memory.max_context() or 0
        )
        self.prefix_pool = prefix_pool or PrefixPool()
        self.pool_seat = self.prefix_pool.join(self.memory, running, lambda: self._loop.cache)
        """This model's place in the prefix-cache pool (left at shutdown)."""
        self.pool_seat.offer(self._loop.cache)
        vocab = int(getattr(model.args, "vocab_size", 0) or 0) if hasattr(model, "args") else 0
        self.limits = ModelLimits(
            vocab_size=max(vocab, len(info.vocab), 1),
            context=self.max_context,
            memory_context=self.memory.max_context(),
        )
        if self.kv_quant is not None and not self.decoder.supports_kv_quantization:
            raise UsageError(
                f"--kv-cache-dtype {config.kv_cache_dtype}: the {self.decoder.name!r} decoder "
                "does not keep a quantized KV cache; use --kv-cache-dtype auto or the plain decoder"
            )
        if adapters_of(model) is not None:
            for kind, part in (("decoder", self.decoder), ("prefill strategy", self.prefill)):
                if not part.supports_adapters:
                    raise UsageError(
                        f"LoRA adapters: the {part.name!r} {kind} does not run adapters "
                        "per row; serve adapters with the plain decoder and chunked prefill"
                    )
        self._waiting: collections.deque[RequestHandle] = collections.deque()
        self.jobs = JobQueue()
        """Model work besides generation (embeddings), run between steps."""
        self._wake = threading.Condition()
        self._uids = itertools.count(1)
        self._epoch = 0
        self._thread_done: threading.Event | None = None
        self._watchdog: threading.Thread | None = None
        self.state = "new"
        """``new``, ``running``, ``restarting``, ``failed``, ``stopping`` or ``stopped``."""
        self.reason = ""
        """Why the engine is not running (empty while it is)."""
        self._busy_since: float | None = None
        self._stopping = False
        self._drain_deadline = 0.0
        self._restarts: list[float] = []
        self._available_at = 0.0
        self._idle_cleared = True
        self._idle_since: float | None = None
        self.faults: collections.Counter[str] = collections.Counter()
        self.expired = 0
        self.peak_reserved = 0
        """The most cache bytes admitted requests could hold at once, so far."""
        self.step_sync: StepSync | None = None
        """Set on rank 0 of a distributed engine (:mod:`mlxcore.distributed.lockstep`):
        every step is announced to the other ranks first; faults are final."""
        log.info(
            "engine strategies: cache=%s prefill=%s decoder=%s",
            self.cache.name,
            self.prefill.name,
            self.decoder.name,
        )

    def new_loop(self) -> BatchLoop:
        """A batch loop with fresh strategies and this engine's settings."""
        return BatchLoop(
            self.parts,
            self.info.eos_token_ids,
            self.config.prefill_batch_size,
            self.config.prefill_step_size,
            self.config.prefill_decode_chunk,
            self.counters,
            # ranks must plan identical steps; their clocks differ
            0.0 if self.config.distributed else self.config.prefill_time_share,
        )

    @property
    def cache(self) -> CacheStrategy:
        """The current cache strategy."""
        return self._loop.cache

    @property
    def prefill(self) -> PrefillStrategy:
        """The current prefill strategy."""
        return self._loop.prefill

    @property
    def decoder(self) -> Decoder:
        """The current decoder."""
        return self._loop.decoder

    # -- caller side (any thread) -------------------------------------------

    def start(self) -> None:
        """Start the generation thread (idempotent; restarts a stopped engine)."""
        with self._wake:
            if self.state in ("running", "restarting", "failed", "stopping"):
                return
            self._stopping = False
            self.state, self.reason = "running", ""
            self._epoch += 1
            epoch = self._epoch
            self._thread_done = run_job(lambda stream: self._run(stream, epoch, fresh=False))
            watching = self._watchdog is not None and self._watchdog.is_alive()
            if not watching and self._watch_period() > 0:
                self._watchdog = threading.Thread(
                    target=self._watch, name="mlxcore-watchdog", daemon=True
                )
                self._watchdog.start()

    def begin_shutdown(self, timeout: float | None = None) -> None:
        """Stop admitting and answer the waiting requests now; running ones get
        ``timeout`` seconds (default ``--shutdown-timeout``) to finish. Returns at once
        (idempotent); :meth:`shutdown` waits for the end."""
        grace = self.config.shutdown_timeout if timeout is None else timeout
        with self._wake:
            if self.state in ("new", "stopped", "failed") or self._stopping:
                return
            self._stopping = True
            self.state, self.reason = "stopping", "the server is shutting down"
            self._drain_deadline = time.monotonic() + grace
            self._end_waiting(UNAVAILABLE, "the server is shutting down")
            self._wake.notify_all()

    def shutdown(self, timeout: float | None = None) -> None:
        """:meth:`begin_shutdown`, then wait until the generation thread has ended."""
        grace = self.config.shutdown_timeout if timeout is None else timeout
        self.begin_shutdown(timeout)
        self.pool_seat.leave()
        with self._wake:
            if self.state == "new":
                self.state = "stopped"
                _close_cache(self._loop)
                return
            # a failed engine's thread has ended, or is stuck for good (a hung step)
            done = None if self.state == "failed" else self._thread_done
        if done is not None and not done.wait(timeout=grace + 10):
            log.error("the engine thread did not stop within %.0f s; abandoning it", grace + 10)
            with self._wake:
                self._abandon_loop("the server is shutting down")
        with self._wake:
            if self.state != "failed":
                self.state = "stopped"
            watchdog = self._watchdog
        _close_cache(self._loop)
        if watchdog is not None and watchdog is not threading.current_thread():
            watchdog.join(timeout=2.0)  # it holds the engine (and the model) until it ends

    def submit(
        self,
        request: GenerationRequest,
        sink: EventSink,
        on_admitted: Callable[[], None] | None = None,
    ) -> RequestHandle:
        """Queue ``request``; events go to ``sink`` on the engine thread.

        Raises :class:`RequestRejected` for a request that can never run,
        :class:`EngineOverloaded` when the waiting queue is full and
        :class:`EngineUnavailable` while the engine restarts, has failed or stops.
        """
        check_request(request, self.limits)
        if self.state == "new":
            self.start()
        handle = RequestHandle(next(self._uids), request, sink, on_admitted, self._waiting_ended)
        with self._wake:
            if self.state != "running" or time.monotonic() < self._available_at:
                raise EngineUnavailable(self.reason or "the engine is restarting")
            self._drop_cancelled_waiting()
            if len(self._waiting) >= self.config.max_queue_size:
                raise EngineOverloaded(
                    f"server busy: {len(self._waiting)} requests already waiting"
                )
            self._waiting.append(handle)
            self._wake.notify()
        return handle

    def submit_job(self, kind: str, work: Callable[[], Any], cost: int) -> ModelJob:
        """Queue model work (``work()`` on the engine thread, piece by piece, holding up
        to ``cost`` bytes: :class:`~mlxcore.engine.jobs.ModelJob`); the job's future holds
        its result. Raises :class:`EngineOverloaded` when
        ``--max-queue-size`` jobs wait, :class:`EngineUnavailable` as :meth:`submit` does,
        :class:`RequestRejected` on a distributed engine."""
        if self.state == "new":
            self.start()
        job = ModelJob(kind, work, cost)
        with self._wake:
            if self.state != "running" or time.monotonic() < self._available_at:
                raise EngineUnavailable(self.reason or "the engine is restarting")
            if self.step_sync is not None:  # the other ranks would not run it in step
                raise RequestRejected(f"a distributed engine runs no {kind} jobs", "model")
            if len(self.jobs.waiting) >= self.config.max_queue_size:
                raise EngineOverloaded(f"server busy: {len(self.jobs.waiting)} jobs waiting")
            self.jobs.waiting.append(job)
            self._wake.notify()
        return job

    def stream(self, request: GenerationRequest) -> Iterator[Event]:
        """Submit ``request`` and yield its events in order (blocking; for the CLI)."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        handle = self.submit(request, events.put)
        try:
            while True:
                event = events.get()
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            handle.cancel()

    def health(self) -> tuple[bool, str, str]:
        """``(ok, state, reason)``: ok while the engine runs and admits."""
        with self._wake:
            restarting = time.monotonic() < self._available_at
            ok = self.state in ("running", "new") and not restarting
            state = "restarting" if restarting and self.state == "running" else self.state
            return ok, state, "" if ok else self.reason

    def live_requests(self) -> list[GenerationRequest]:
        """The requests admitted now (prefilling, waiting for a shared prefix, decoding).
        Call it on the engine thread (from a job's work): the batch changes between steps."""
        return [live.request for live in list(self._loop.live.values())]

    def stats(self) -> dict[str, float]:
        """Load, memory, supervision and strategy counters (snapshots, any thread)."""
        loop = self._loop
        cache = loop.cache.stats()
        out: dict[str, float] = {
            "requests_running": len(loop.live),
            "requests_waiting": len(self._waiting),
            "requests_expired_in_queue": self.expired,
            "prompt_tokens_processed": self.counters["prompt_tokens_processed"],
            "prefill_shared_prefix_waits": self.counters["prefill_shared_prefix_waits"],
            "decode_step_failures": self.counters["decode_step_failures"],
            "decode_sequences_isolated": loop.quarantine.isolated,
            "engine_up": 1.0 if self.health()[0] else 0.0,
            "engine_restarts": len(self._restarts),
            "engine_faults": sum(self.faults.values()),
            **self.jobs.stats(),
            **cache.gauges(),
            **self.memory.gauges(held_bytes(loop), self._reserved(loop), self.peak_reserved),
        }
        if self.step_sync is not None:
            out.update({f"distributed_{k}": v for k, v in self.step_sync.stats().items()})
        try:
            out.update({f"decoder_{k}": v for k, v in loop.decoder.stats().items()})
            out.update({f"prefill_{k}": v for k, v in loop.prefill.stats().items()})
        except Exception:
            log.exception("a strategy's stats() failed")
        return out

    def memory_held(self) -> int:
        """Bytes held or promised beside the weights (any thread): what the admitted
        requests' caches may grow to, and the prefix cache."""
        loop = self._loop
        return self._reserved(loop) + loop.cache.stats().nbytes

    # -- engine thread ----------------------------------------------------

    def _run(self, stream: Any, epoch: int, fresh: bool) -> None:
        with mx.stream(stream):
            if fresh and not self._install_fresh_loop(epoch):
                return
            while True:
                with self._wake:
                    if epoch != self._epoch:
                        return  # superseded: a hung step was abandoned
                    loop = self._loop
                    sync = self.step_sync
                    idle = self._idle(loop)
                    if idle and sync is None:
                        self._wait_idle(loop)
                        continue
                    if not idle:
                        if self._stopping and self._drained(loop):
                            break
                        self._expire_waiting()
                        gather = self._gather_wait(loop) if sync is None else 0.0
                        if gather:  # a burst is arriving at an idle engine: start it whole
                            self._wake.wait(timeout=gather)
                            continue
                        admitted = [] if self._stopping else self._take_waiting(loop)
                        if self.jobs.running is None and not self._stopping:
                            self._take_job(loop)
                        held = self._held_wait(loop, admitted) if sync is None else 0.0
                        if held:  # only background work, held back: nothing to step
                            self._wake.wait(timeout=held)
                            continue
                        waiting = list(self._waiting)
                if idle and sync is not None:
                    if not self._pause(epoch, sync, loop):
                        return
                    continue
                self._busy_since = time.monotonic()
                try:
                    if sync is not None:
                        admitted = sync.lead(loop, admitted)
                    with step_batch():  # the step's events reach each event loop together
                        loop.iterate(admitted, self._background_pause() if sync is None else None)
                    self.jobs.step()
                    loop.prefetch(waiting)
                except Exception as exc:
                    self._busy_since = None
                    if not self._recover(epoch, exc):
                        if self.state == "failed":  # followers stop now, not at a deadline
                            self._close_sync()
                        return
                    continue
                self._busy_since = None
                self._idle_cleared = False
                self._idle_since = None
            with self._wake:
                if epoch == self._epoch:
                    self._loop.fail_all("the server is shutting down", UNAVAILABLE)
                    self.jobs.fail_running(EngineUnavailable("the server is shutting down"))
            self._close_sync()

    def _close_sync(self) -> None:
        """Tell the other ranks of a distributed engine to stop (best effort)."""
        try:
            if self.step_sync is not None:
                self.step_sync.close()
        except Exception as exc:
            log.warning("could not tell the other ranks to stop: %s", exc)

    def _idle(self, loop: BatchLoop) -> bool:
        if self._stopping:
            return False
        return not (self._waiting or loop.live or self.jobs.waiting or self.jobs.running)

    def _wait_idle(self, loop: BatchLoop, timeout: float = IDLE_RELEASE_SECONDS / 2) -> None:
        """Nothing to do: sleep until woken (at most ``timeout``); once idle for
        :data:`IDLE_RELEASE_SECONDS`, give MLX's buffer cache and the C heap's free pages
        back (caller holds the lock)."""
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if not self._idle_cleared and now - self._idle_since >= IDLE_RELEASE_SECONDS:
            self._idle_cleared = True
            release_memory()
        self._wake.wait(timeout=timeout)

    def _pause(self, epoch: int, sync: StepSync, loop: BatchLoop) -> bool:
        """Idle with other ranks in step: pause them all, then wait (no longer than the
        pause) for work. False: the pause failed and the engine stops."""
        self._busy_since = time.monotonic()  # a lost rank can hang the pause too
        try:
            seconds = sync.pause()
        except Exception as exc:
            self._busy_since = None
            return self._recover(epoch, exc)
        self._busy_since = None
        with self._wake:
            if self._idle(loop):
                self._wait_idle(loop, seconds)
        return True

    def _drained(self, loop: BatchLoop) -> bool:
        """While stopping: True when no request or job runs, or the drain deadline passed
        (the running ones are then ended)."""
        if not loop.live and self.jobs.running is None:
            return True
        if time.monotonic() < self._drain_deadline:
            return False
        for live in list(loop.live.values()):
            loop.finish(live, "error", "the server is shutting down", UNAVAILABLE)
        self.jobs.fail_running(EngineUnavailable("the server is shutting down"))
        return True

    def _recover(self, epoch: int, exc: BaseException) -> bool:
        """An exception escaped the loop: fail everything, rebuild. False: stop the thread."""
        log.error("engine fault: %s: %s", type(exc).__name__, exc, exc_info=exc)
        with self._wake:
            if epoch != self._epoch:
                return False
            self.faults["exception"] += 1
            reason = f"engine fault ({type(exc).__name__}){self._restart_note(exc)}"
            self._loop.fail_all(reason, UNAVAILABLE)
            self._end_waiting(UNAVAILABLE, reason)
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
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW]
        if self.step_sync is not None:
            # the other ranks cannot rebuild in step with this one
            self.state = "failed"
            self.reason = reason
            log.critical("engine failed for good: %s", self.reason)
            return False
        if len(self._restarts) >= self.config.engine_max_restarts:
            self.state = "failed"
            self.reason = f"{reason.removesuffix('; restarting')}; no restarts left"
            log.critical("engine failed for good: %s", self.reason)
            return False
        self._restarts.append(now)
        self._available_at = now + RESTART_BACKOFF
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
            log.warning("engine restarted with fresh strategies (%d restarts)", len(self._restarts))
        # the old cache may flush files: not on the engine thread
        threading.Thread(target=_close_cache, args=(old,), daemon=True).start()
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
                log.critical("engine step made no progress for %.1f s", stuck)
                self.faults["hang"] += 1
                reason = f"engine step made no progress for {stuck:.0f} s{self._restart_note()}"
                self._abandon_loop(reason)
                self._end_waiting(UNAVAILABLE, reason)
                if not self._may_restart(reason):
                    continue
                self._thread_done = run_job(self._fresh_job(self._epoch))

    def _fresh_job(self, epoch: int) -> Callable[[Any], None]:
        """A generation-thread job that builds fresh strategies, then runs ``epoch``."""
        return lambda stream: self._run(stream, epoch, fresh=True)


def _close_cache(loop: BatchLoop) -> None:
    """Let a loop's cache strategy release its threads and files."""
    try:
        loop.cache.close()
    except Exception:
        log.exception("cache strategy %s failed to close", loop.cache.name)
