"""The engine: one generation thread that owns MLX, fed through a bounded queue, supervised.

Every front end submits :class:`~mlxcore.engine.request.GenerationRequest` objects here
and receives events through a sink. The generation thread plans under the engine's lock
(:class:`~mlxcore.engine.admission.Admission` takes waiting requests whose slot and cache
bytes fit the memory budget; nothing to do: it waits there), then steps a
:class:`~mlxcore.engine.loop.BatchLoop` outside it, and publishes an
:class:`~mlxcore.engine.snapshot.EngineSnapshot` for the other threads. Around the loop:
**supervision** (an exception the loop cannot contain, or a step stuck past
``--engine-watchdog``, fails every open request with a retryable error and restarts with
fresh strategies, within :mod:`mlxcore.engine.supervision`'s budget), **model jobs**
(embeddings and the like, between two steps, :mod:`mlxcore.engine.jobs`) and
**shutdown** (stop admitting, answer the waiting requests, give the running ones a
deadline, then end them).
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.config import ServerConfig
from mlxcore.engine.adapters import adapters_of
from mlxcore.engine.admission import Admission, EngineOverloaded, EngineUnavailable
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
from mlxcore.engine.memory import MemoryBudget, fitted_context, release_memory
from mlxcore.engine.parts import EngineParts
from mlxcore.engine.prefill_pacer import StepBudget
from mlxcore.engine.prefix_pool import PrefixPool
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.snapshot import EngineSnapshot
from mlxcore.engine.stall import StallReport
from mlxcore.engine.step_sync import StepSync
from mlxcore.engine.step_times import StepTimes
from mlxcore.engine.strategies import CacheStrategy, Decoder, PrefillStrategy
from mlxcore.engine.supervision import Restarts
from mlxcore.engine.supervisor import Supervisor, close_cache
from mlxcore.engine.threads import run_job
from mlxcore.engine.validation import ModelLimits, RequestRejected, check_request
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo

log = logging.getLogger(__name__)

__all__ = ["Engine", "EngineOverloaded", "EngineParts", "EngineUnavailable", "RequestRejected"]

IDLE_RELEASE_SECONDS = 1.0
"""Idle time after which unused memory is given back to the system."""


LIVE_COUNTERS = ("prompt_tokens_processed", "prefill_shared_prefix_waits", "decode_step_failures")
"""Counters :meth:`Engine.stats` reads as they are, not from the snapshot."""


@attrs.frozen
class StepPlan:
    """What the engine thread does outside its lock (:meth:`Engine._plan`): a step of
    ``loop`` admitting ``admitted`` (``waiting``: the queue, for prefetching), or with
    ``pause``, an idle pause of the distributed ranks in step with ``sync``."""

    loop: BatchLoop
    admitted: list[RequestHandle]
    waiting: list[RequestHandle]
    sync: StepSync | None
    pause: bool = False


class Engine(Supervisor):
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
        if info.reserved_bytes:
            self.memory.add_weights(info.reserved_bytes)  # an expert cache, still empty
        self.counters: collections.Counter[str] = collections.Counter()
        """Totals across loops: ``prompt_tokens_processed``, ``prefill_shared_prefix_waits``."""
        self.budget = StepBudget.of(
            config.prefill_step_size,
            config.prefill_decode_chunk,
            config.prefill_time_share,
            config.step_time_target,
            config.max_batched_tokens,
            fixed=bool(config.distributed),  # ranks plan alike; their clocks differ
        )
        """How much prompt a step prefills (:mod:`mlxcore.engine.prefill_pacer`)."""
        self.step_times = StepTimes(self.budget.target or config.step_time_target)
        """The steps' durations against the target (kept across loops)."""
        self._loop = self.new_loop()
        self.memory.side_per_token = self.decoder.side_cache_bytes_per_token()
        self.max_context: int | None = fitted_context(
            config.max_model_len, info.context_length, self.memory.max_context()
        )
        """The most tokens a sequence may hold: ``--max-model-len``, else the model's own
        context or, when less, what fits in memory (:func:`fitted_context`)."""
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
        self.jobs = JobQueue()
        """Model work besides generation (embeddings), run between steps."""
        self.admission = Admission(model, config, self.memory, self.pool_seat, self.jobs)
        """The waiting requests and jobs, and the rules that admit them (under the lock)."""
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
        self._drain_deadline = 0.0
        self.restarts = Restarts(config.engine_max_restarts)
        """Faults seen and restarts spent."""
        self._idle_cleared = True
        self._idle_since: float | None = None
        self.step_sync: StepSync | None = None
        """Set on rank 0 of a distributed engine (:mod:`mlxcore.distributed.lockstep`):
        every step is announced to the other ranks first; faults are final."""
        self._published = EngineSnapshot.of(self._loop, self.admission, None)
        self._stepping = False
        """The generation thread is stepping outside the lock (set under it by
        :meth:`_plan`): readers take the published snapshot, else a fresh one."""
        log.info(
            "engine strategies: cache=%s prefill=%s decoder=%s; step budget: %s",
            self.cache.name,
            self.prefill.name,
            self.decoder.name,
            self.budget.describe(),
        )

    def new_loop(self) -> BatchLoop:
        """A batch loop with fresh strategies and this engine's settings."""
        return BatchLoop(
            self.parts,
            self.info.eos_token_ids,
            self.config.prefill_batch_size,
            self.budget,
            self.counters,
            self.step_times,
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
            self.admission.stopping = False
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
            if self.state in ("new", "stopped", "failed") or self.admission.stopping:
                return
            self.admission.stopping = True
            self.state, self.reason = "stopping", "the server is shutting down"
            self._drain_deadline = time.monotonic() + grace
            self.admission.end_all(UNAVAILABLE, "the server is shutting down")
            self._wake.notify_all()

    def shutdown(self, timeout: float | None = None) -> None:
        """:meth:`begin_shutdown`, then wait until the generation thread has ended."""
        grace = self.config.shutdown_timeout if timeout is None else timeout
        self.begin_shutdown(timeout)
        self.pool_seat.leave()
        with self._wake:
            if self.state == "new":
                self.state = "stopped"
                close_cache(self._loop)
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
        close_cache(self._loop)
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
        admission = self.admission
        handle = RequestHandle(
            next(self._uids), request, sink, on_admitted, admission.waiting_ended
        )
        with self._wake:
            if self.state != "running" or self.restarts.backing_off():
                raise EngineUnavailable(self.reason or "the engine is restarting")
            admission.drop_cancelled()
            if len(admission.waiting) >= self.config.max_queue_size:
                raise EngineOverloaded(f"server busy: {len(admission.waiting)} requests waiting")
            admission.waiting.append(handle)
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
            if self.state != "running" or self.restarts.backing_off():
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

    def last_stall(self) -> StallReport | None:
        """The last step the watchdog abandoned, with the requests it was working on."""
        with self._wake:
            return self.restarts.stalls[-1] if self.restarts.stalls else None

    def health(self) -> tuple[bool, str, str]:
        """``(ok, state, reason)``: ok while the engine runs and admits."""
        with self._wake:
            ok = self._up()
            restarting = self.restarts.backing_off()
            state = "restarting" if restarting and self.state == "running" else self.state
            return ok, state, "" if ok else self.reason

    def _up(self) -> bool:
        """Running (or not yet started) and admitting (caller holds the lock)."""
        return self.state in ("running", "new") and not self.restarts.backing_off()

    def live_requests(self) -> list[GenerationRequest]:
        """The requests admitted now (prefilling, waiting for a shared prefix, decoding).
        Call it on the engine thread (from a job's work): the batch changes between steps."""
        return [live.request for live in list(self._loop.live.values())]

    def stats(self) -> dict[str, float]:
        """Load, memory, supervision and strategy counters (any thread), read under the
        lock: while the generation thread steps, the figures it published after its
        latest step (:class:`EngineSnapshot`); while it waits, fresh ones (it cannot
        start a step meanwhile). Never call it holding another engine's lock."""
        with self._wake:
            if self._stepping:
                figures = self._published.figures
            else:
                figures = EngineSnapshot.of(self._loop, self.admission, self.step_sync).figures
            extra = self.info.gauges() if self.info.gauges is not None else {}
            return {
                **figures,
                **extra,
                # totals the engine thread only adds to: current even mid-step, so a
                # request's finish is never newer than the count it changed
                **{name: self.counters[name] for name in LIVE_COUNTERS},
                "requests_waiting": len(self.admission.waiting),
                "requests_expired_in_queue": self.admission.expired,
                "engine_up": 1.0 if self._up() else 0.0,
                "engine_restarts": len(self.restarts.recent),
                "engine_faults": sum(self.restarts.faults.values()),
                "engine_hangs": self.restarts.faults["hang"],
                **self.step_times.figures(),
            }

    def memory_held(self) -> int:
        """Bytes held or promised beside the weights (any thread): what the admitted
        requests' caches may grow to (published by the engine thread each step and at
        each admission) and the prefix cache (its strategy's own count, which the prefix
        pool reads from any thread too)."""
        try:
            prefix = int(self.cache.stats().nbytes)
        except Exception:  # a cache being replaced after a fault
            prefix = 0
        return self._published.reserved + prefix

    def _publish(self, loop: BatchLoop, admitted: Sequence[RequestHandle] = ()) -> None:
        """Replace the snapshot other threads read (engine thread: after each step, and
        at admission with the ``admitted`` requests the next step starts)."""
        self._published = EngineSnapshot.of(loop, self.admission, self.step_sync, admitted)

    def _run(self, stream: Any, epoch: int, fresh: bool) -> None:
        """The generation thread: plan under the lock (waiting there while there is
        nothing to step), then step outside it; once drained, end what is left."""
        with mx.stream(stream):
            if fresh and not self._install_fresh_loop(epoch):
                return
            while True:
                with self._wake:
                    plan = self._plan(epoch)
                if plan is None:  # it waited: look again
                    continue
                if plan == "superseded":  # a hung step was abandoned
                    return
                if plan == "drained":
                    break
                assert isinstance(plan, StepPlan)
                ran = self._pause_ranks(epoch, plan) if plan.pause else self._step(epoch, plan)
                if not ran:
                    return
            with self._wake:
                if epoch == self._epoch:
                    self._loop.fail_all("the server is shutting down", UNAVAILABLE)
                    self.jobs.fail_running(EngineUnavailable("the server is shutting down"))
            self._close_sync()

    def _plan(self, epoch: int) -> StepPlan | str | None:
        """What the thread does next (caller holds the lock): a :class:`StepPlan`,
        ``"superseded"`` or ``"drained"`` (the thread ends), or ``None`` after waiting
        here (idle, a burst gathering, only held-back background work)."""
        self._stepping = False
        if epoch != self._epoch:
            return "superseded"
        loop, sync, admission = self._loop, self.step_sync, self.admission
        if self._idle(loop):
            if sync is not None:  # the other ranks wait in step with this one
                self._stepping = True
                return StepPlan(loop, [], [], sync, pause=True)
            self._wait_idle(loop)
            return None
        if admission.stopping and self._drained(loop):
            return "drained"
        admission.expire()
        gather = admission.gather_wait(loop) if sync is None else 0.0
        if gather:  # a burst is arriving at an idle engine: start it whole
            self._wake.wait(timeout=gather)
            return None
        admitted = [] if admission.stopping else admission.take_waiting(loop)
        job = None
        if self.jobs.running is None and not admission.stopping:
            job = admission.take_job(loop)
        if admitted or job is not None:  # other models' admission sees them at once
            self._publish(loop, admitted)
        held = admission.held_wait(loop, admitted) if sync is None else 0.0
        if held:  # only background work, held back: nothing to step
            self._wake.wait(timeout=held)
            return None
        self._stepping = True
        return StepPlan(loop, admitted, list(admission.waiting), sync)

    def _waiting_tenants(self) -> set[str | None]:
        """The tenants of the requests waiting now, read by the engine thread mid-step
        without the lock (a copy of the queue: a hint for ending an opening prefill)."""
        try:
            return {handle.request.tenant for handle in list(self.admission.waiting)}
        except RuntimeError:  # the queue changed while it was copied
            return set()

    def _step(self, epoch: int, plan: StepPlan) -> bool:
        """Run one step of ``plan`` (outside the lock). False: the thread stops."""
        loop, admitted, sync = plan.loop, plan.admitted, plan.sync
        self._busy_since = time.monotonic()
        try:
            if sync is not None:
                admitted = sync.lead(loop, admitted)
            pause = self.admission.background_pause() if sync is None else None
            waiting = self._waiting_tenants if sync is None else None  # ranks plan alike
            with step_batch():  # the step's events reach each event loop together
                loop.iterate(admitted, pause, waiting)
            self.jobs.step()
            loop.prefetch(plan.waiting)
        except Exception as exc:
            self._busy_since = None
            if self._recover(epoch, exc):
                return True
            if self.state == "failed":  # followers stop now, not at a deadline
                self._close_sync()
            return False
        self._busy_since = None
        self._idle_cleared = False
        self._idle_since = None
        self._publish(loop)
        return True

    def _close_sync(self) -> None:
        """Tell the other ranks of a distributed engine to stop (best effort)."""
        try:
            if self.step_sync is not None:
                self.step_sync.close()
        except Exception as exc:
            log.warning("could not tell the other ranks to stop: %s", exc)

    def _idle(self, loop: BatchLoop) -> bool:
        if self.admission.stopping:
            return False
        waiting = self.admission.waiting
        return not (waiting or loop.live or self.jobs.waiting or self.jobs.running)

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

    def _pause_ranks(self, epoch: int, plan: StepPlan) -> bool:
        """Idle with other ranks in step: pause them all, then wait (no longer than the
        pause) for work. False: the pause failed and the engine stops."""
        assert plan.sync is not None
        self._busy_since = time.monotonic()  # a lost rank can hang the pause too
        try:
            seconds = plan.sync.pause()
        except Exception as exc:
            self._busy_since = None
            return self._recover(epoch, exc)
        self._busy_since = None
        with self._wake:
            if self._idle(plan.loop):
                self._wait_idle(plan.loop, seconds)
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
