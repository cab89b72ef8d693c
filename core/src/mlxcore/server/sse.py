"""Server-sent event responses shared by every front end.

One helper gives every streaming route the same guarantees: the response is
``Content-Type: text/event-stream``; an error after the stream started becomes the
API's own error frame (and its end marker), never a cut connection; a long silence
(a long prefill, a queue) is filled with SSE comments so proxies and clients keep
the connection open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar.response import Stream

from mlxcore.server.errors import APIError, internal_error

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
"""Silence after which a comment line is sent."""

KEEPALIVE = b": keep-alive\n\n"


class EventStream(Stream):
    """A streaming response that is always ``text/event-stream`` (Litestar would
    otherwise take the route's default media type, JSON, over the response's own)."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = "text/event-stream"
        return super().to_asgi_response(*args, **kwargs)


def event_stream(
    chunks: AsyncIterator[bytes],
    error_frame: Callable[[APIError], bytes],
    keepalive: float = KEEPALIVE_SECONDS,
) -> EventStream:
    """An SSE response from ``chunks``; ``error_frame(err)`` renders an error in the API's
    shape (including any end marker the API uses after it)."""
    return EventStream(
        _guarded(chunks, error_frame, keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _guarded(
    chunks: AsyncIterator[bytes], error_frame: Callable[[APIError], bytes], keepalive: float
) -> AsyncIterator[bytes]:
    iterator = chunks.__aiter__()
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=keepalive)
            if not done:
                yield KEEPALIVE
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield chunk
    except APIError as exc:
        yield error_frame(exc)
    except Exception as exc:
        yield error_frame(internal_error(exc, "while streaming a response"))
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
