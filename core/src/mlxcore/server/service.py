"""The bridge between HTTP front ends and the engine thread.

A front end builds its :class:`~mlxcore.request_builder.Generation` objects with the
model session's request builder on :meth:`GenerationService.prepare` (its errors become
400s here), then starts them with :meth:`GenerationService.start` and iterates the
:class:`~mlxcore.output.OutputDelta` objects it returns. Events cross from the engine
thread to the event loop through its :class:`~mlxcore.engine.handoff.LoopHandoff` (one
wake-up of the loop per engine step for every request); when the consumer
stops early (client gone, stop string), the engine request is cancelled.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
from litestar import Request

from mlxcore.engine.adapters import adapter_request, adapters_of
from mlxcore.engine.engine import EngineOverloaded, EngineUnavailable
from mlxcore.engine.events import (
    OVERLOADED,
    UNAVAILABLE,
    Event,
    FinishEvent,
    RequestHandle,
    TokenEvent,
)
from mlxcore.engine.handoff import handoff_for
from mlxcore.engine.jobs import ModelJob
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.validation import RequestRejected
from mlxcore.errors import MediaError, OptionError
from mlxcore.lifecycle import RequestRecord
from mlxcore.output import OutputDelta
from mlxcore.request_builder import Generation
from mlxcore.runtime import Runtime
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.errors import APIError, from_domain, overloaded
from mlxcore.server.keys import ApiKey, charge_current, current_key, request_priority
from mlxcore.server.metrics import Metrics
from mlxcore.server.request_ids import HttpRequestInfo, current_http

T = TypeVar("T")

log = logging.getLogger(__name__)

__all__ = ["Generation", "GenerationService", "collect", "merge_streams"]


class GenerationService:
    """Shared services for every front end: preparation, validation, running generations."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: Metrics,
        names: Sequence[str] = (),
        task: str = "generate",
        pooling: str = "last",
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.names = tuple(names)
        """The names clients use for this model (the first is reported); empty: from the
        configuration (``--served-model-name`` or the model's own name)."""
        self.task = task
        """``generate`` or ``embed`` (an embedding model serves only /v1/embeddings)."""
        self.pooling = pooling
        """How embeddings are taken from the hidden states: ``last`` or ``mean``."""
        self.adapter: str | None = None
        """The LoRA adapter this service's requests run with (:meth:`with_adapter`)."""
        self._adapters: dict[str, GenerationService] = {}
        workers = runtime.config.prepare_workers
        # A few threads (the tokenizer is safe to share): one slow request (a huge
        # prompt, a slow remote image) does not hold up the requests behind it.
        self._prepare_pool = ThreadPoolExecutor(workers, thread_name_prefix="mlxcore-prepare")
        self._preparing = [0]
        """Requests being prepared (one cell, shared with the adapter services)."""

    def with_adapter(self, name: str) -> GenerationService:
        """This model's service for requests that run with its LoRA adapter ``name``
        (reported under that name; preparation threads and engine shared)."""
        found = self._adapters.get(name)
        if found is None:
            adapters = adapters_of(self.runtime.model)
            served = set(adapters.names()) if adapters is not None else set()
            for gone in [n for n in self._adapters if n not in served]:
                del self._adapters[gone]  # unloaded adapters: bounded by --max-loras
            found = copy.copy(self)
            found.names, found.adapter, found._adapters = (name,), name, {}
            self._adapters[name] = found
        return found

    async def prepare(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the service's preparation pool, off the event loop.

        Front ends build their requests here: rendering the chat template and
        tokenizing a long prompt takes a while, which on the event loop would stall
        every other request and stream (and /health). At most ``--max-queue-size``
        preparations wait at once; past that the request is answered as overloaded.
        """
        if self._preparing[0] >= self.config.max_queue_size:
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise overloaded(f"server busy: {self._preparing[0]} requests being prepared")
        loop = asyncio.get_running_loop()
        self._preparing[0] += 1
        try:
            return await loop.run_in_executor(self._prepare_pool, functools.partial(fn, *args))
        except (RequestRejected, OptionError, MediaError) as exc:
            raise from_domain(exc) from None
        finally:
            self._preparing[0] -= 1

    def submit_job(self, kind: str, work: Callable[[], Any], cost: int) -> ModelJob:
        """Queue model work besides generation (``work()`` on the engine thread between
        two steps, holding up to ``cost`` bytes under the memory budget and the watchdog;
        see :meth:`~mlxcore.engine.engine.Engine.submit_job`). A full queue or an engine
        restarting is a 503 with Retry-After, counted as rejected; a distributed engine's
        refusal a 400."""
        try:
            return self.runtime.engine.submit_job(kind, work, cost)
        except (EngineOverloaded, EngineUnavailable) as exc:
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise overloaded(str(exc)) from None
        except RequestRejected as exc:
            raise from_domain(exc) from None

    async def run_job(
        self,
        request: Request[Any, Any, Any] | None,
        kind: str,
        work: Callable[[], Any],
        cost: int,
    ) -> Any:
        """:meth:`submit_job`, then the job's result. The job is cancelled when the
        client of ``request`` hangs up (a 499); a job that waited past
        ``--max-queue-wait`` or met an engine fault is a 503; the work's own exceptions
        reach the caller. Every plugin that runs a model job goes through here."""
        return await self.job_result(request, self.submit_job(kind, work, cost))

    @staticmethod
    async def job_result(request: Request[Any, Any, Any] | None, job: ModelJob) -> Any:
        """The result of a job from :meth:`submit_job` (a route that streams the job's
        progress submits first, then waits here), with :meth:`run_job`'s answers."""
        result = asyncio.wrap_future(job.future)
        try:
            return await (result if request is None else unless_disconnected(request, result))
        except (EngineOverloaded, EngineUnavailable) as exc:
            raise overloaded(str(exc)) from None
        finally:
            job.cancel()  # a no-op once it ended; stops it when the client went away

    @property
    def busy(self) -> bool:
        """True while any request of this model is being prepared, queued, generated or
        embedded (the router never unloads a busy model)."""
        stats = self.runtime.engine.stats()
        keys = ("requests_running", "requests_waiting", "jobs_running", "jobs_waiting")
        return bool(self._preparing[0] or any(stats.get(key, 0) for key in keys))

    def close(self) -> None:
        """Stop the preparation threads (work already queued still runs)."""
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def config(self) -> Any:
        """The server configuration."""
        return self.runtime.config

    @property
    def context_length(self) -> int | None:
        """The most tokens a sequence may hold (see :attr:`Engine.max_context`)."""
        return self.runtime.engine.max_context

    async def start(self, gen: Generation) -> AsyncIterator[OutputDelta]:
        """Submit ``gen.request`` and wait until the engine starts it; return its output
        deltas as an async iterator.

        Waiting for the start before any response is sent lets a front end answer 503
        (queue full, waited too long, engine restarting) or 400 (cannot be served) with
        a proper status even for a streaming request. If the caller is cancelled (the
        client went away) while waiting, the request leaves the queue.
        """
        loop = asyncio.get_running_loop()
        events = _Inbox(loop)
        admission: asyncio.Future[FinishEvent | None] = loop.create_future()

        timeline = _Timeline(current_http.get())
        model = self.adapter or (self.names[0] if self.names else "")

        running: list[ApiKey | None] = []

        def release() -> None:
            while running:
                entered = running.pop()
                if entered is not None:
                    entered.leave()

        def deliver(event: Event) -> None:
            # Accounted here, not by the consumer: a request whose client went away
            # (cancelled) still counts as finished.
            if isinstance(event, TokenEvent) and timeline.first_token_at is None:
                timeline.first_token_at = time.perf_counter()
                timeline.first_token_ns = time.time_ns()
            if isinstance(event, FinishEvent):
                first = timeline.first_token_at
                self.metrics.record_finish(
                    event,
                    time.perf_counter() - gen.created_at,
                    ttft=None if first is None else first - gen.created_at,
                    model=model,
                    request_id=gen.request.request_id,
                    tenant=gen.request.tenant,
                )
                release()
                self.runtime.hooks.request_finished(timeline.record(gen.request, model, event))
                if not admission.done():
                    admission.set_result(event)
            events.put(event)

        def admitted() -> None:
            timeline.admitted_ns = time.time_ns()
            if not admission.done():
                admission.set_result(None)

        handoff = handoff_for(loop)

        def sink(event: Event) -> None:
            handoff.post(deliver, event)

        def on_admitted() -> None:
            handoff.post(admitted)

        if self.adapter is not None:
            gen.request = self._adapted(gen.request)
        key = current_key.get()
        gen.request = _as_tenants(gen.request, key)
        if key is not None and not key.enter():
            self.metrics.rejected.labels(reason="limited").inc()
            raise APIError(
                429,
                f"API key {key.name!r} already has {key.max_concurrent} requests running "
                "(its max_concurrent); retry when one finishes",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        running.append(key)  # the key's count of running requests, left at the finish
        try:
            handle = self.runtime.engine.submit(gen.request, sink, on_admitted)
        except (EngineOverloaded, EngineUnavailable) as exc:
            release()
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise overloaded(str(exc)) from None
        except RequestRejected as exc:
            release()
            self.metrics.rejected.labels(reason="invalid").inc()
            raise APIError(400, exc.message, param=exc.field, code=exc.code) from None
        gen.handle = handle
        try:
            early = await admission
        except BaseException:
            handle.cancel()
            raise
        if early is not None and early.code in (OVERLOADED, UNAVAILABLE):
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise overloaded(_unavailable_message(early))
        return self._deltas(gen, handle, events)

    def _adapted(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` run with this service's adapter (a 404 once it is unloaded)."""
        adapters = adapters_of(self.runtime.model)
        key = None if adapters is None or self.adapter is None else adapters.key(self.adapter)
        if key is None:
            raise APIError(
                404,
                f"the LoRA adapter {self.adapter!r} is no longer served",
                param="model",
                code="model_not_found",
            )
        return adapter_request(request, key)

    async def start_all(self, gens: Sequence[Generation]) -> list[AsyncIterator[OutputDelta]]:
        """Start several generations (``n`` choices); if one cannot start, cancel the rest.

        More choices than the waiting queue can ever hold is the client's error (400), not
        an overload to retry (503).
        """
        limit = self.config.max_queue_size
        if len(gens) > limit:
            raise APIError(
                400,
                f"n={len(gens)} is more choices than this server queues at once ({limit}, "
                "--max-queue-size)",
                param="n",
            )
        try:
            return list(await asyncio.gather(*(self.start(g) for g in gens)))
        except BaseException:
            for g in gens:
                if g.handle is not None:
                    g.handle.cancel()
            raise

    async def _deltas(
        self, gen: Generation, handle: RequestHandle, events: _Inbox
    ) -> AsyncIterator[OutputDelta]:
        """Yield deltas until the request finishes; the last one has ``finish_reason``
        and ``gen.usage`` is final by then. A failure inside generation is a 500 (503
        when the engine was at fault: a restart, a hang, shutdown) whose message carries
        the request id, never the internal error text (that is in the log)."""
        finished = False
        last = 0.0  # when this request's previous tokens came (for the inter-token gaps)
        try:
            while True:
                event = await events.get()
                if isinstance(event, TokenEvent):
                    if event.prompt_logprobs is not None:
                        gen.prompt_logprobs = event.prompt_logprobs
                        gen.scored.set()
                    gen.generated += len(event.tokens)
                    now = time.perf_counter()
                    if gen.first_token_at is None:
                        gen.first_token_at = now
                        self.metrics.ttft.observe(now - gen.created_at)
                        self.metrics.history.first_token(now - gen.created_at)
                    self.metrics.history.tokens(len(event.tokens), now - last if last else None)
                    last = now
                    delta = gen.pipeline.push(event.tokens)
                    if gen.pipeline.stop_matched:
                        handle.stop()
                    if delta:
                        yield delta
                    continue
                assert isinstance(event, FinishEvent)
                finished = True
                gen.usage = event.usage
                gen.usage.reasoning_tokens = gen.pipeline.reasoning_tokens
                charge_current(event.usage.prompt_tokens + event.usage.completion_tokens)
                _log_finished(gen, event)
                if event.reason == "error":
                    raise _generation_error(gen.request.request_id, event)
                yield gen.pipeline.finish(event.reason)
                return
        finally:
            gen.scored.set()  # the choices sharing its prompt logprobs wait no longer
            if not finished:
                handle.cancel()


class _Inbox:
    """One request's engine events on the event loop, for its one consumer: what an
    ``asyncio.Queue`` does here with less work per token (one waiter, no getter queue).

    Bounded by construction: the engine sends a request at most one event per token it
    generates (``max_tokens``, bounded by the context), one per prefill chunk of its
    prompt and one finish, so a consumer that stops reading holds at most that many; a
    client that goes away cancels the request, which stops the events."""

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: collections.deque[Event] = collections.deque()
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def put(self, event: Event) -> None:
        self._items.append(event)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Event:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        return self._items.popleft()


class _Timeline:
    """A generation's steps as the service sees them (wall-clock ns), made into a
    :class:`~mlxcore.lifecycle.RequestRecord` when it ends."""

    def __init__(self, http: HttpRequestInfo | None) -> None:
        self.http = http
        self.submitted_ns = time.time_ns()
        self.admitted_ns: int | None = None
        self.first_token_ns: int | None = None
        self.first_token_at: float | None = None
        """The first token's ``time.perf_counter()`` (for the TTFT metric)."""

    def record(self, request: GenerationRequest, model: str, event: FinishEvent) -> RequestRecord:
        http = self.http
        usage = event.usage
        return RequestRecord(
            request_id=request.request_id,
            http_request_id=http.request_id if http else request.trace_id,
            method=http.method if http else "",
            path=http.path if http else "",
            traceparent=http.traceparent if http else None,
            tracestate=http.tracestate if http else None,
            model=model,
            received_ns=http.received_ns if http else self.submitted_ns,
            submitted_ns=self.submitted_ns,
            admitted_ns=self.admitted_ns,
            first_token_ns=self.first_token_ns,
            finished_ns=time.time_ns(),
            finish_reason=event.reason,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            extra=dict(usage.extra),
            steps=tuple(usage.steps),
        )


def _as_tenants(request: GenerationRequest, key: ApiKey | None) -> GenerationRequest:
    """``request`` as its API key's: the key's priority level at best, its name for fair
    admission, its cache scope for the prefix cache (:mod:`mlxcore.server.tenants`); and
    the HTTP request's id for the engine's log lines."""
    priority = request_priority(request.priority, key)
    http = current_http.get()
    trace_id = http.request_id if http is not None else ""
    tenant = key.name if key is not None else None
    scope = key.cache_scope if key is not None else None
    changed = (priority, trace_id, tenant, scope) != (
        request.priority,
        request.trace_id,
        request.tenant,
        request.cache_scope,
    )
    if not changed:
        return request
    return attrs.evolve(
        request, priority=priority, trace_id=trace_id, tenant=tenant, cache_scope=scope
    )


def _log_finished(gen: Generation, event: FinishEvent) -> None:
    """One debug line per finished request: its prompt, cache reuse and timing."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    usage = event.usage
    ttft = gen.first_token_at - gen.created_at if gen.first_token_at is not None else None
    log.debug(
        "request %s finished (%s): %d prompt tokens, %d cached, TTFT %s, %d generated",
        gen.request.request_id,
        event.reason,
        usage.prompt_tokens,
        usage.cached_tokens,
        "-" if ttft is None else f"{ttft:.3f} s",
        usage.completion_tokens,
    )


def _unavailable_message(event: FinishEvent) -> str:
    if event.code == OVERLOADED:
        return f"server busy: the request {event.error or 'waited too long'}; retry later"
    return f"the server cannot take requests now ({event.error or 'engine unavailable'})"


def _generation_error(request_id: str, event: FinishEvent) -> APIError:
    if event.code in (OVERLOADED, UNAVAILABLE):
        return overloaded(_unavailable_message(event))
    if event.code is not None:  # the request's own fault: its message is for the client
        message = event.error or "the request cannot be completed"
        return APIError(400, message, type="invalid_request_error", code=event.code)
    return APIError(
        500,
        f"generation failed for request {request_id}; the server log has the details",
        type="server_error",
        code="generation_failed",
    )


async def collect(deltas: AsyncIterator[OutputDelta]) -> OutputDelta:
    """A whole generation as one delta (non-streaming responses)."""
    total = OutputDelta()
    async for delta in deltas:
        total.extend(delta)
    return total


async def merge_streams(
    streams: list[AsyncIterator[OutputDelta]],
) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Interleave several delta streams (the choices of ``n``), tagging each delta with
    its choice index; the first stream to fail ends the merge with its error."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, OutputDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[OutputDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except BaseException as exc:
            await queue.put((index, exc))
            return
        await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            index, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
