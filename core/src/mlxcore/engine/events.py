"""What the engine reports back for one request, and the handle to steer it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import StepToken

log = logging.getLogger(__name__)


@attrs.define
class Usage:
    """Token accounting for one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    """Of the completion tokens, those written inside the think block (set by the front
    end's output pipeline)."""
    extra: dict[str, Any] = attrs.field(factory=dict)
    steps: list[EngineStep] = attrs.field(factory=list)
    """The engine's timed work for this request (each prefill chunk), for observers
    (:class:`~mlxcore.lifecycle.RequestRecord`); not part of the API's usage."""


@attrs.frozen
class EngineStep:
    """One piece of engine work done for a request, timed in wall-clock nanoseconds
    (``time.time_ns()``): ``name`` (``prefill_chunk``), its start and end, and figures
    such as ``tokens`` (computed) and ``cached_tokens`` (reused before it)."""

    name: str
    start_ns: int
    end_ns: int
    figures: dict[str, int] = attrs.field(factory=dict)


@attrs.define
class TokenEvent:
    """New tokens for the request (one or more, from one engine step)."""

    tokens: list[StepToken]
    prompt_logprobs: list[StepToken] | None = None
    """With a request's first tokens, when it asked for them: every prompt token's
    logprob after the first (``sampling.prompt_logprobs``)."""


OVERLOADED = "overloaded"
"""``FinishEvent.code`` of a request that waited longer than ``--max-queue-wait``."""

UNAVAILABLE = "unavailable"
"""``FinishEvent.code`` of a request ended by an engine fault, hang or shutdown."""


@attrs.define
class FinishEvent:
    """The request is over. ``reason`` is ``stop``, ``length``, ``cancelled`` or ``error``.

    ``error`` is the detail for the log (never shown to clients as is); ``code`` says
    why a request failed without being at fault itself: :data:`OVERLOADED` or
    :data:`UNAVAILABLE` (front ends answer those like overload, with Retry-After). Any
    other code is a :class:`~mlxcore.errors.RequestFault`'s: the request was at fault,
    ``error`` is then its message for the client and ``code`` the API error code.
    """

    reason: str
    usage: Usage
    error: str | None = None
    code: str | None = None


Event = TokenEvent | FinishEvent
EventSink = Callable[[Event], None]


class RequestHandle:
    """The caller's side of a submitted request: its id, and cancellation.

    Events go to the ``sink`` given at submission, called on the engine thread;
    the sink must not block (hand events over to a queue).
    """

    def __init__(
        self,
        uid: int,
        request: GenerationRequest,
        sink: EventSink,
        on_admitted: Callable[[], None] | None = None,
        on_end: Callable[[RequestHandle], None] | None = None,
    ) -> None:
        self.uid = uid
        self.request = request
        self.sink = sink
        self.on_admitted = on_admitted
        """Called (on the engine thread, must not block) when the request leaves the
        waiting queue and starts; never called for a request that ends while waiting."""
        self.on_end = on_end
        """Called once (on the thread that ends it, must not block) when the request is
        first ended early (:meth:`end_early`): the engine's bookkeeping then costs per
        cancellation, not a scan of every request per step."""
        self.cached_tokens = 0
        """Prompt tokens found in the prefix cache (set when the lookup is done: at
        admission, or after the prefill of a shared prefix this request waited for)."""
        self.queued_at = time.monotonic()
        self._cancel_reason: str | None = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Abandon this request at the engine's next step (thread-safe): the client
        went away, or its front end failed. It finishes as ``cancelled``."""
        self.end_early("cancelled")

    def stop(self) -> None:
        """End this request normally at the engine's next step (thread-safe): the
        output is complete (a stop string matched). It finishes as ``stop``."""
        self.end_early("stop")

    def end_early(self, reason: str) -> None:
        """Mark the request as over with ``reason`` (the first reason given wins);
        the engine finishes it at its next step."""
        with self._lock:
            if self._cancel_reason is not None:
                return
            self._cancel_reason = reason
        if self.on_end is not None:
            self.on_end(self)

    @property
    def cancel_reason(self) -> str | None:
        """Why the request was ended early (:meth:`cancel`, :meth:`stop`,
        :meth:`end_early`), or ``None``."""
        with self._lock:
            return self._cancel_reason


def send(handle: RequestHandle, event: Event) -> None:
    """Deliver ``event`` to the request's sink; a sink that raises (its client's event
    loop is gone) cancels the request instead of stopping the engine."""
    try:
        handle.sink(event)
    except Exception:
        log.exception("event sink of request %s failed; cancelling it", handle.uid)
        handle.cancel()
