"""What the ``mlxcore_request_finished`` hook is given: one generation's life, timed.

The service records each step of a generation as it happens (on the event loop, no
work on the engine thread): the HTTP request's arrival, its hand-off to the engine after
rendering and tokenizing, its admission (a slot and its memory), its first token and its
end. Observers (tracing, audit logs, billing) get the whole record once, when it ends.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore.engine.events import EngineStep


@attrs.frozen
class RequestRecord:
    """One finished generation. Times are wall-clock nanoseconds since the epoch
    (``time.time_ns()``), ``None`` for a step it never reached.

    Attributes:
        request_id: the API's id of this generation (``chatcmpl-...``).
        http_request_id: the HTTP request's id (``x-request-id``, echoed to the client).
        method, path: the HTTP request's method and path ("" outside HTTP).
        traceparent, tracestate: the W3C Trace Context headers the client sent.
        model: the served name the request asked for.
        received_ns: the HTTP request arrived.
        submitted_ns: handed to the engine (its prompt rendered and tokenized).
        admitted_ns: the engine took it (a slot, its cache within the budget).
        first_token_ns: its first token was out.
        finished_ns: it ended.
        finish_reason: ``stop``, ``length``, ``cancelled`` or ``error``.
        prompt_tokens, cached_tokens, completion_tokens: its usage.
        extra: the engine's per-request statistics (the cache's explanation under
            ``mlxcore.cache``, a speculative decoder's acceptance...).
        steps: the engine's timed work for it, in order (each prefill chunk, with the
            tokens it computed and those reused from the cache).
    """

    request_id: str
    http_request_id: str
    method: str
    path: str
    traceparent: str | None
    tracestate: str | None
    model: str
    received_ns: int
    submitted_ns: int
    admitted_ns: int | None
    first_token_ns: int | None
    finished_ns: int
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    extra: dict[str, Any] = attrs.field(factory=dict)
    steps: tuple[EngineStep, ...] = ()
