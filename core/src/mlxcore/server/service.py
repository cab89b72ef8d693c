"""The bridge between HTTP front ends and the engine thread.

A front end builds a :class:`~mlxcore.engine.request.GenerationRequest` and an
:class:`~mlxcore.output.OutputPipeline`, then iterates :meth:`GenerationService.run`
for :class:`~mlxcore.output.OutputDelta` objects. Events cross from the engine
thread to the event loop through ``call_soon_threadsafe``; when the consumer
stops early (client gone, stop string), the engine request is cancelled.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs

from mlxcore.cli.runtime import Runtime
from mlxcore.engine.engine import EngineOverloaded, RequestRejected
from mlxcore.engine.events import Event, FinishEvent, RequestHandle, TokenEvent, Usage
from mlxcore.engine.request import GenerationRequest
from mlxcore.output import OutputDelta, OutputPipeline
from mlxcore.prompts import RenderedPrompt, render_chat
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.metrics import Metrics

T = TypeVar("T")


@attrs.define
class Generation:
    """One running generation as the front end sees it."""

    request: GenerationRequest
    pipeline: OutputPipeline
    usage: Usage = attrs.field(factory=Usage)
    started: float = attrs.field(factory=time.perf_counter)
    first_token_at: float | None = None
    handle: RequestHandle | None = None


class GenerationService:
    """Shared services for every front end: prompts, parsers, running generations."""

    def __init__(self, runtime: Runtime, metrics: Metrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        # One thread: the tokenizer is never used by two preparations at once.
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="mlxcore-prepare")

    async def prepare(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the service's preparation thread, off the event loop.

        Front ends build their requests here: rendering the chat template and
        tokenizing a prompt of megabytes takes seconds, which on the event loop
        would stall every other request and stream (and /health).
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._prepare_pool, functools.partial(fn, *args))

    def close(self) -> None:
        """Stop the preparation thread (work already queued still runs)."""
        self._prepare_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def config(self) -> Any:
        """The server configuration."""
        return self.runtime.config

    @property
    def context_length(self) -> int | None:
        """The most tokens a sequence may hold (see :attr:`Engine.max_context`)."""
        return self.runtime.engine.max_context

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> RenderedPrompt:
        """Render and tokenize a chat prompt; template errors become a 400."""
        try:
            return render_chat(
                self.runtime.tokenizer, messages, tools=tools, **dict(template_kwargs)
            )
        except APIError:
            raise
        except Exception as exc:
            raise invalid(
                f"the chat template could not render these messages: {exc}", "messages"
            ) from None

    def encode(self, text: str) -> list[int]:
        """Tokenize raw text (completions)."""
        ids: list[int] = self.runtime.tokenizer.encode(text)
        return ids

    def pipeline(self, **kwargs: Any) -> OutputPipeline:
        """A fresh output pipeline for one request (see :meth:`Runtime.pipeline`)."""
        return self.runtime.pipeline(**kwargs)

    def start(self, gen: Generation) -> AsyncIterator[OutputDelta]:
        """Submit ``gen.request`` now and return its output deltas as an async iterator.

        Submitting here, before any response is sent, lets a front end answer 503
        (queue full) or 400 (cannot be served) with a proper status even for a
        streaming request. Must be called on the event loop's thread.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def deliver(event: Event) -> None:
            # Accounted here, not by the consumer: a request whose client went away
            # (cancelled) still counts as finished.
            if isinstance(event, FinishEvent):
                self.metrics.record_finish(event, time.perf_counter() - gen.started)
            events.put_nowait(event)

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(deliver, event)

        try:
            handle = self.runtime.engine.submit(gen.request, sink)
        except EngineOverloaded as exc:
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise APIError(503, str(exc), headers={"Retry-After": "1"}) from None
        except RequestRejected as exc:
            self.metrics.rejected.labels(reason="invalid").inc()
            raise APIError(
                400, str(exc), param="messages", code="context_length_exceeded"
            ) from None
        gen.handle = handle
        return self._deltas(gen, handle, events)

    def start_all(self, gens: Sequence[Generation]) -> list[AsyncIterator[OutputDelta]]:
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
            return [self.start(g) for g in gens]
        except BaseException:
            for g in gens:
                if g.handle is not None:
                    g.handle.cancel()
            raise

    async def _deltas(
        self, gen: Generation, handle: RequestHandle, events: asyncio.Queue[Event]
    ) -> AsyncIterator[OutputDelta]:
        """Yield deltas until the request finishes; the last one has ``finish_reason``
        and ``gen.usage`` is final by then. A failure inside generation is a 500."""
        finished = False
        try:
            while True:
                event = await events.get()
                if isinstance(event, TokenEvent):
                    if gen.first_token_at is None:
                        gen.first_token_at = time.perf_counter()
                        self.metrics.ttft.observe(gen.first_token_at - gen.started)
                    delta = gen.pipeline.push(event.tokens)
                    if gen.pipeline.stop_matched:
                        handle.cancel("stop")
                    if delta:
                        yield delta
                    continue
                assert isinstance(event, FinishEvent)
                finished = True
                gen.usage = event.usage
                if event.reason == "error":
                    raise APIError(500, f"generation failed: {event.error}", type="server_error")
                yield gen.pipeline.finish(event.reason)
                return
        finally:
            if not finished:
                handle.cancel("cancelled")


async def collect(deltas: AsyncIterator[OutputDelta]) -> OutputDelta:
    """A whole generation as one delta (non-streaming responses)."""
    total = OutputDelta()
    async for delta in deltas:
        total.extend(delta)
    return total
