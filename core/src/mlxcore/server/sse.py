"""Server-sent event responses shared by every front end.

One helper gives every streaming route the same guarantees: the response is
``Content-Type: text/event-stream``; an error after the stream started becomes the
API's own error frame (and its end marker), never a cut connection; a long silence
(a long prefill, a queue) is filled with SSE comments so proxies and clients keep
the connection open.

The chunks are written as they come, from the response's own task: no task, timer or
wait per chunk (a token's event is one hop from the engine's hand-over to the socket).
The keep-alive is a second task that sleeps until the stream has been silent for
:data:`KEEPALIVE_SECONDS` and only then writes, between two chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar.response import Stream
from litestar.response.streaming import ASGIStreamingResponse
from litestar.types import Send

from mlxcore.server.errors import APIError, internal_error

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
"""Silence after which a comment line is sent."""

KEEPALIVE = b": keep-alive\n\n"

ErrorFrame = Callable[[APIError], bytes]
"""Renders an error in the API's own shape, with any end marker the API uses after it."""


class EventStream(Stream):
    """A streaming ``text/event-stream`` response (Litestar would otherwise take the
    route's default media type, JSON, over the response's own) that turns a failure
    mid-stream into the API's error frame and fills long silences with keep-alives.
    Other line-based streams (Ollama's NDJSON) give their ``media_type`` and no
    keep-alive (``keepalive=None``: their clients parse every line)."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        error_frame: ErrorFrame,
        keepalive: float | None = KEEPALIVE_SECONDS,
        headers: dict[str, str] | None = None,
        media_type: str = "text/event-stream",
    ) -> None:
        super().__init__(chunks, media_type=media_type, headers=headers)
        self.error_frame = error_frame
        self.keepalive = keepalive
        self.stream_type = media_type

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        headers = kwargs.get("headers")
        cookies = kwargs.get("cookies")
        return _EventStreamResponse(
            iterator=self.iterator,
            error_frame=self.error_frame,
            keepalive=self.keepalive,
            background=self.background or kwargs.get("background"),
            content_length=0,
            cookies=self.cookies if cookies is None else itertools.chain(self.cookies, cookies),
            encoded_headers=kwargs.get("encoded_headers"),
            encoding=self.encoding,
            headers={**headers, **self.headers} if headers is not None else self.headers,
            is_head_response=kwargs.get("is_head_response", False),
            media_type=self.stream_type,
            status_code=self.status_code or kwargs.get("status_code"),
        )


def event_stream(
    chunks: AsyncIterator[bytes],
    error_frame: ErrorFrame,
    keepalive: float | None = KEEPALIVE_SECONDS,
    media_type: str = "text/event-stream",
) -> EventStream:
    """An SSE response from ``chunks``; ``error_frame(err)`` renders an error in the API's
    shape (including any end marker the API uses after it). ``media_type`` and
    ``keepalive=None`` make it another line-based stream (see :class:`EventStream`)."""
    return EventStream(
        chunks,
        error_frame,
        keepalive,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        media_type=media_type,
    )


class _EventStreamResponse(ASGIStreamingResponse):
    __slots__ = ("error_frame", "keepalive")

    def __init__(self, *, error_frame: ErrorFrame, keepalive: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error_frame = error_frame
        self.keepalive = keepalive

    async def _stream(self, send: Send) -> None:
        writer = _Writer(send)
        keeper = (
            None
            if self.keepalive is None
            else asyncio.ensure_future(writer.keep_alive(self.keepalive))
        )
        iterator = self.iterator.__aiter__()
        following = iterator.__anext__
        try:
            while True:
                try:
                    chunk = await following()
                except StopAsyncIteration:
                    break
                except APIError as exc:  # an error frame ends the stream
                    await writer.write(self.error_frame(exc))
                    break
                except Exception as exc:
                    await writer.write(
                        self.error_frame(internal_error(exc, "while streaming a response"))
                    )
                    break
                await writer.write(chunk if isinstance(chunk, bytes) else chunk.encode())
        finally:
            if keeper is not None:
                keeper.cancel()
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:  # a stream left early (client gone) ends its generation now
                with contextlib.suppress(Exception):
                    await aclose()
        await writer.send_body(b"", more=False)


class _Writer:
    """Writes a response's body chunks and remembers when it last did. The stream and its
    keep-alive never write at once: a chunk that comes while a keep-alive waits on a slow
    client (flow control) waits for it."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._keeping: asyncio.Future[None] | None = None

    async def write(self, body: bytes) -> None:
        if self._keeping is not None:
            await asyncio.shield(self._keeping)
        await self.send_body(body)

    async def send_body(self, body: bytes, more: bool = True) -> None:
        """Send ``body`` as one ASGI body message (``more=False``: the last one)."""
        await self.send({"type": "http.response.body", "body": body, "more_body": more})
        self._last = self._loop.time()

    async def keep_alive(self, interval: float) -> None:
        """Write :data:`KEEPALIVE` whenever nothing was written for ``interval`` seconds."""
        while True:
            quiet = self._loop.time() - self._last
            if quiet < interval:
                await asyncio.sleep(interval - quiet)
                continue
            self._keeping = self._loop.create_future()
            try:
                await self.send_body(KEEPALIVE)
            except Exception:  # the client is gone: the stream's own write sees it too
                log.debug("keep-alive write failed", exc_info=True)
                return
            finally:
                self._keeping.set_result(None)
                self._keeping = None
