"""Several models in one server: names and aliases, load on demand, one memory budget.

Every front end asks :meth:`ModelRouter.service` for the model a request names and gets
that model's :class:`GenerationService` (its own runtime, engine, parsers, prefix cache
and plugins). A model that is not loaded is loaded then, on an MLX worker thread, while
its requests wait and the other models keep serving; one load runs at a time.

Memory: every loaded model's weights count against ``--models-memory-budget``. Before a
load, the folder's weight files give the estimate; after it, the model's parameters. When
a load would exceed the budget, the least recently used model that is neither pinned nor
busy (see :attr:`GenerationService.busy`, and used in the last :data:`LEASE_SECONDS`) is
unloaded first; if only busy models stand in the way the load waits for one to finish
(up to ``--max-queue-wait``), and if pinned ones alone leave too little it is refused.
Each engine's admission also subtracts what the other models hold from its KV budget:
their weights, the caches their admitted requests may grow to, and their prefix caches.

A failed load (missing folder, broken weights, not enough memory) fails the requests for
that model with a 503 that says why; it is retried after :data:`RETRY_FAILED_SECONDS`
or at once by ``POST /v1/models/{name}/load``. Models idle past their ``idle_unload``
are unloaded; an engine that failed for good is unloaded so the next request reloads it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from mlxcore.engine.adapters import adapters_of
from mlxcore.engine.memory import parameter_bytes, physical_memory, release_memory
from mlxcore.engine.prefix_pool import PrefixPool
from mlxcore.engine.stall import StallReport
from mlxcore.engine.threads import call_on_worker
from mlxcore.models.catalog import ModelSpec
from mlxcore.runtime import Runtime
from mlxcore.server.errors import APIError
from mlxcore.server.metrics import Metrics
from mlxcore.server.service import GenerationService

log = logging.getLogger(__name__)

LEASE_SECONDS = 2.0
"""A model handed to a request this recently counts as busy (the request is between
choosing its model and reaching the engine)."""
RETRY_FAILED_SECONDS = 30.0
"""After a failed load, requests get the same error for this long before it is retried."""
WAIT_STEP = 0.1

NOT_LOADED, LOADING, LOADED, FAILED = "not_loaded", "loading", "loaded", "failed"


@attrs.define(eq=False)
class ModelSlot:
    """One configured model and what the router knows of it."""

    spec: ModelSpec
    state: str = NOT_LOADED
    service: GenerationService | None = None
    error: str = ""
    failed_at: float = 0.0
    last_used: float = 0.0
    footprint: int = 0
    """Bytes of weights: estimated before the first load, measured after."""
    loading: asyncio.Future[GenerationService] | None = None
    loads: int = 0
    unloads: int = 0
    pin: bool | None = None
    """Pinned or not by the admin routes since start-up (``None``: as models.toml says)."""
    added: bool = False
    """Added while serving (:meth:`ModelRouter.add`), not configured at start-up."""

    @property
    def pinned(self) -> bool:
        """Never unloaded for memory or idleness (models.toml's ``pinned``, or the admin
        routes' choice)."""
        return self.spec.entry.pinned if self.pin is None else self.pin

    def idle_for(self, now: float) -> float | None:
        """Seconds since last use when nothing of this model is in flight, else ``None``."""
        if self.service is None or self.service.busy:
            return None
        return now - self.last_used


Build = Callable[[ModelSpec, Callable[[], int]], Runtime]
"""Loads one model: ``build(spec, memory_elsewhere)`` (blocking, on a worker thread)."""


class ModelRouter:
    """Names to loaded models, loading and unloading them under one memory budget."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        build: Build,
        metrics: Metrics,
        *,
        memory_budget: int | None = None,
        idle_unload: float = 0.0,
        accept_any_name: bool = False,
        prefix_pool: PrefixPool | None = None,
    ) -> None:
        if not specs:
            raise ValueError("a router needs at least one model")
        self.slots = [ModelSlot(spec) for spec in specs]
        self._by_name = {name: slot for slot in self.slots for name in slot.spec.names}
        self.build = build
        self.metrics = metrics
        total = physical_memory()
        utilization = specs[0].config.gpu_memory_utilization
        self.memory_budget = memory_budget or (int(total * utilization) if total else None)
        self.idle_unload = idle_unload
        self.accept_any_name = accept_any_name
        self.prefix_pool = prefix_pool
        """The prefix-cache budget the models' engines share (``--prefix-cache-size
        auto``), when the builder gives them one."""
        self.max_wait = specs[0].config.max_queue_wait or 120.0
        self._load_lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        for slot in self.slots:
            slot.footprint = estimate_weights(slot.spec)
        metrics.watch(self.gauges)
        metrics.watch_stalls(self.stalls)

    # -- names --------------------------------------------------------------

    @property
    def single(self) -> bool:
        """True for the classic one-model server."""
        return len(self.slots) == 1

    @property
    def default(self) -> ModelSlot:
        """The model a request without a model name gets (the first configured)."""
        return self.slots[0]

    def names(self) -> list[str]:
        """Every name and alias, models in their configured order, then the LoRA adapters
        the loaded models serve."""
        names = [name for slot in self.slots for name in slot.spec.names]
        return names + [name for _, name in self.adapters()]

    def add(self, spec: ModelSpec) -> ModelSlot:
        """Serve one more model from now on (not loaded until asked for, as the
        configured ones): what a front end's pull adds (Ollama's ``/api/pull``). A name
        already served is a :class:`ValueError`."""
        taken = [name for name in spec.names if name in self._by_name]
        if taken:
            raise ValueError(f"the model name {taken[0]!r} is already served")
        slot = ModelSlot(spec, added=True)
        slot.footprint = estimate_weights(spec)
        self.slots.append(slot)
        for name in spec.names:
            self._by_name[name] = slot
        return slot

    def remove(self, slot: ModelSlot) -> None:
        """Stop serving a model :meth:`add` added (it must not be loaded)."""
        if not slot.added or slot.state == LOADED or slot.loading is not None:
            raise ValueError(f"the model {slot.spec.name!r} cannot be removed now")
        self.slots.remove(slot)
        for name in slot.spec.names:
            self._by_name.pop(name, None)

    def find(self, name: str) -> ModelSlot | None:
        """The model ``name`` (or an alias) names exactly, or ``None``."""
        return self._by_name.get(name)

    def adapters(self) -> list[tuple[ModelSlot, str]]:
        """The LoRA adapters the loaded models serve: (base model, adapter name) pairs;
        a name that is also a model's name is the model's."""
        found = []
        for slot in self.loaded():
            assert slot.service is not None
            adapters = adapters_of(slot.service.runtime.model)
            if adapters is not None:
                found += [(slot, n) for n in adapters.names() if n not in self._by_name]
        return found

    def find_adapter(self, name: str) -> ModelSlot | None:
        """The loaded model that serves the adapter ``name``, or ``None``."""
        return next((slot for slot, n in self.adapters() if n == name), None)

    def slot_for(self, name: str | None) -> ModelSlot:
        """The model ``name`` (or an alias, or an adapter of a loaded model) reaches; a 404
        listing the names otherwise."""
        if not name:
            return self.default
        slot = self._by_name.get(name) or self.find_adapter(name)
        if slot is not None:
            return slot
        if self.accept_any_name:
            return self.default
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {', '.join(self.names())}",
            param="model",
            code="model_not_found",
        )

    def loaded(self) -> list[ModelSlot]:
        """The models loaded now."""
        return [slot for slot in self.slots if slot.state == LOADED and slot.service]

    # -- serving ------------------------------------------------------------------

    async def service(self, name: str | None) -> GenerationService:
        """The service of the model ``name``, loading it first if needed."""
        slot = self.slot_for(name)
        slot.last_used = time.monotonic()
        if slot.state == LOADED and slot.service is not None:
            if name and name not in self._by_name and self.find_adapter(name) is slot:
                return slot.service.with_adapter(name)
            return slot.service
        service = await self.load(slot, retry=False)
        slot.last_used = time.monotonic()
        return service

    async def load(self, slot: ModelSlot, *, retry: bool = True) -> GenerationService:
        """Load ``slot`` (or wait for the load in progress); ``retry=False`` repeats a
        recent failure instead of trying again."""
        if slot.state == LOADED and slot.service is not None:
            return slot.service
        recent = time.monotonic() - slot.failed_at < RETRY_FAILED_SECONDS
        if slot.state == FAILED and recent and not retry:
            raise _load_failed(slot)
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        try:
            return await asyncio.shield(slot.loading)
        finally:
            if slot.loading is not None and slot.loading.done():
                slot.loading = None

    async def unload(self, slot: ModelSlot, reason: str) -> bool:
        """Unload ``slot`` unless it is busy; False when it could not be (busy)."""
        async with self._load_lock:
            if slot.state != LOADED:
                return True
            if slot.idle_for(time.monotonic()) is None:
                return False
            await self._unload(slot, reason)
            return True

    # -- loading ------------------------------------------------------------------

    async def _load(self, slot: ModelSlot) -> GenerationService:
        async with self._load_lock:
            if slot.state == LOADED and slot.service is not None:
                return slot.service
            name = slot.spec.name
            await self._make_room(slot)  # a 503 when there is no room: nothing failed
            try:
                slot.state = LOADING
                self.metrics.model_state(name, LOADING)
                log.info("loading model %s", name)
                started = time.perf_counter()
                runtime = await asyncio.wrap_future(
                    call_on_worker(lambda: self.build(slot.spec, lambda: self._elsewhere(slot)))
                )
                runtime.engine.start()
            except Exception as exc:
                slot.state, slot.error, slot.failed_at = FAILED, _reason(exc), time.monotonic()
                self.metrics.model_state(name, FAILED)
                self.metrics.model_loads.labels(model=name, result="failed").inc()
                log.error("model %s could not be loaded: %s", name, slot.error)
                raise _load_failed(slot) from None
            seconds = time.perf_counter() - started
            entry = slot.spec.entry
            slot.service = GenerationService(
                runtime, self.metrics, entry.names, task_of(entry.task, runtime), entry.pooling
            )
            slot.footprint = parameter_bytes(runtime.model)
            slot.state, slot.error, slot.loads = LOADED, "", slot.loads + 1
            self.metrics.model_state(name, LOADED)
            self.metrics.model_loads.labels(model=name, result="loaded").inc()
            self.metrics.model_load_seconds.observe(seconds)
            log.info("model %s loaded in %.1fs (%.0f MB)", name, seconds, slot.footprint / 2**20)
            return slot.service

    def _held(self, slot: ModelSlot) -> int:
        """Weight bytes of the loaded models other than ``slot``."""
        return sum(s.footprint for s in self.loaded() if s is not slot)

    def _elsewhere(self, slot: ModelSlot) -> int:
        """What the loaded models other than ``slot`` hold: weights, the caches their
        admitted requests may grow to, and their prefix caches (read by ``slot``'s engine
        whenever it admits, so one budget covers every model's KV)."""
        total = self._held(slot)
        for other in self.loaded():
            service = other.service  # read once: an unload may clear it meanwhile
            if other is not slot and service is not None:
                total += service.runtime.engine.memory_held()
        return total

    async def _make_room(self, slot: ModelSlot) -> None:
        """Unload least recently used idle models until ``slot`` fits the budget."""
        budget = self.memory_budget
        if budget is None:
            return
        deadline = time.monotonic() + self.max_wait
        while True:
            held = self._held(slot)
            if held + slot.footprint <= budget:
                return
            if slot.footprint > budget:
                raise _no_memory(slot, budget, held, "it is larger than the whole budget")
            pinned = sum(s.footprint for s in self.loaded() if s.pinned and s is not slot)
            if pinned + slot.footprint > budget:
                raise _no_memory(slot, budget, held, "pinned models hold the rest")
            now = time.monotonic()
            idle = [
                (s.last_used, s)
                for s in self.loaded()
                if s is not slot and not s.pinned and (s.idle_for(now) or 0) > LEASE_SECONDS
            ]
            if idle:
                victim = min(idle, key=lambda item: item[0])[1]
                await self._unload(victim, f"to make room for {slot.spec.name}")
                continue
            if now > deadline:
                raise _no_memory(slot, budget, held, "the other models stayed busy")
            await asyncio.sleep(WAIT_STEP)

    async def _unload(self, slot: ModelSlot, reason: str) -> None:
        service, name = slot.service, slot.spec.name
        slot.service, slot.state = None, NOT_LOADED
        self.metrics.model_state(name, NOT_LOADED)
        if service is None:
            return
        log.info("unloading model %s (%s)", name, reason)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, service.runtime.engine.shutdown)
        service.close()
        del service
        gc.collect()
        release_memory()
        slot.unloads += 1
        self.metrics.model_unloads.labels(model=name).inc()

    # -- lifecycle ----------------------------------------------------------------

    def adopt(self, slot: ModelSlot, runtime: Runtime) -> None:
        """Take a runtime built before the server started (``mlxcore serve MODEL`` loads
        its model first, so a broken model stops start-up); its engine starts with
        :meth:`start`."""
        entry = slot.spec.entry
        slot.service = GenerationService(
            runtime, self.metrics, entry.names, task_of(entry.task, runtime), entry.pooling
        )
        slot.footprint = parameter_bytes(runtime.model)
        slot.state, slot.loads, slot.last_used = LOADED, slot.loads + 1, time.monotonic()
        self.metrics.model_state(slot.spec.name, LOADED)

    async def start(self, preload: Sequence[ModelSlot] = ()) -> None:
        """Load ``preload`` (failures are logged: the others keep serving) and start the
        idle / failed-engine watch."""
        for slot in self.loaded():
            assert slot.service is not None
            slot.service.runtime.engine.start()
        for slot in self.slots:
            if slot.state == NOT_LOADED:
                self.metrics.model_state(slot.spec.name, NOT_LOADED)
        for slot in preload:
            try:
                await self.load(slot)
            except APIError as exc:
                log.error("%s", exc.message)
        self._watch = asyncio.ensure_future(self._watch_loop())

    async def stop(self) -> None:
        """Stop every engine (running requests get ``--shutdown-timeout``)."""
        if self._watch is not None:
            self._watch.cancel()
        loop = asyncio.get_running_loop()
        for slot in self.loaded():
            assert slot.service is not None
            await loop.run_in_executor(None, slot.service.runtime.engine.shutdown)
            slot.service.close()

    def begin_shutdown(self) -> None:
        """Stop admitting on every engine (SIGTERM)."""
        for slot in self.loaded():
            assert slot.service is not None
            slot.service.runtime.engine.begin_shutdown()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._maintain()
            except Exception:
                log.exception("model maintenance failed")

    async def _maintain(self) -> None:
        now = time.monotonic()
        for slot in self.loaded():
            assert slot.service is not None
            engine = slot.service.runtime.engine
            if engine.state == "failed" and not self.single:
                log.error(
                    "model %s: its engine failed (%s); unloading it", slot.spec.name, engine.reason
                )
                async with self._load_lock:
                    await self._unload(slot, "its engine failed")
                continue
            limit = slot.spec.entry.idle_unload
            limit = self.idle_unload if limit is None else limit
            idle = slot.idle_for(now)
            if limit > 0 and not slot.pinned and idle is not None and idle > limit:
                await self.unload(slot, f"idle for {idle:.0f}s")

    # -- reporting ------------------------------------------------------------------

    def describe(self, slot: ModelSlot) -> dict[str, Any]:
        """What ``/v1/models`` says of one model, beside its id."""
        context = None
        if slot.service is not None:
            context = slot.service.context_length
        else:
            context = slot.spec.config.max_model_len or folder_context_length(slot.spec)
        out: dict[str, Any] = {
            "state": slot.state,
            "context_length": context,
            "aliases": list(slot.spec.entry.aliases),
            "task": slot.service.task if slot.service is not None else slot.spec.entry.task,
            "pinned": slot.pinned,
            # the weights' bytes: measured once loaded, estimated from the files before
            "memory_bytes": slot.footprint,
            "added": slot.added,
        }
        if slot.state == FAILED:
            out["error"] = slot.error
        return out

    def stalls(self) -> list[tuple[str, StallReport]]:
        """Each loaded model's last stalled step (the watchdog abandoned it), if any."""
        found = []
        for slot in self.loaded():
            assert slot.service is not None
            stall = slot.service.runtime.engine.last_stall()
            if stall is not None:
                found.append((slot.spec.name, stall))
        return found

    def gauges(self) -> dict[str, float]:
        """Engine gauges summed over the loaded models, plus the router's own."""
        from mlxcore.server.metrics import engine_gauges, memory_gauges

        total: dict[str, float] = {}
        for slot in self.loaded():
            assert slot.service is not None
            for key, value in engine_gauges(slot.service.runtime.engine).items():
                total[key] = total.get(key, 0.0) + value
        total.update(memory_gauges())
        pool = self.prefix_pool
        seated = sum(1 for seat in pool.seats if seat.taken) if pool is not None else 0
        if pool is not None and seated > 1:
            # each engine sized from the pool reports its capacity: count it once
            total["memory_prefix_cache_budget_bytes"] -= (seated - 1) * pool.capacity()
        total["models_loaded"] = float(len(self.loaded()))
        total["models_weights_bytes"] = float(sum(s.footprint for s in self.loaded()))
        if self.memory_budget is not None:
            total["models_memory_budget_bytes"] = float(self.memory_budget)
        return total


def estimate_weights(spec: ModelSpec) -> int:
    """Bytes of the weight files of a local model (0 when not known before loading)."""
    source = spec.config.model
    if source is None:
        return 0
    path = Path(source).expanduser()
    try:
        if path.is_file():
            return path.stat().st_size
        if path.is_dir():
            return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    except OSError:
        return 0
    return 0


def folder_context_length(spec: ModelSpec) -> int | None:
    """The context length a local folder's ``config.json`` declares, if it says."""
    import json

    source = spec.config.model
    if source is None:
        return None
    try:
        config = json.loads((Path(source).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config", config) if isinstance(config, dict) else {}
    value = text.get("max_position_embeddings") if isinstance(text, dict) else None
    return value if isinstance(value, int) else None


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc) or type(exc).__name__
    return text if len(text) <= 400 else text[:400] + "..."


def _load_failed(slot: ModelSlot) -> APIError:
    return APIError(
        503,
        f"the model {slot.spec.name!r} could not be loaded: {slot.error}",
        type="server_error",
        code="model_unavailable",
        param="model",
        headers={"Retry-After": str(int(RETRY_FAILED_SECONDS))},
    )


def _no_memory(slot: ModelSlot, budget: int, held: int, why: str) -> APIError:
    gib = 2**30
    slot.error = (
        f"not enough memory: it needs {slot.footprint / gib:.2f} GiB, the other loaded models "
        f"hold {held / gib:.2f} GiB of the {budget / gib:.2f} GiB budget and {why}"
    )
    return APIError(
        503,
        f"the model {slot.spec.name!r} cannot be loaded now: {slot.error}",
        type="overloaded_error",
        code="overloaded",
        param="model",
        headers={"Retry-After": "5"},
    )


def task_of(configured: str, runtime: Runtime) -> str:
    """The task a loaded model serves: its own when the model says it can do only one
    (a plugin's model class with ``mlxcore_task``, e.g. a cross-encoder: ``rerank``),
    else the one configured for it."""
    own = getattr(runtime.model, "mlxcore_task", None)
    return own if isinstance(own, str) else configured
