"""A request's work cancelled when its client hangs up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from mlxcore.server.errors import APIError

T = TypeVar("T")


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``; if the client hangs up first, cancel it (which cancels its engine
    requests) instead of generating for nobody. Streams need no such guard: Litestar
    stops a streaming response when the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    raise APIError(499, "the client closed the connection", code="client_closed_request")


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Return when the client hangs up (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
