"""The SSE response every streaming route uses (mlxcore.server.sse): chunks go out as they
come, a silence is filled with keep-alive comments, a failure mid-stream becomes the API's
error frame, and a client that leaves ends the stream's generator (a real uvicorn server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from litestar import Litestar, get
from litestar.testing import AsyncTestClient

from mlxcore.server.errors import APIError
from mlxcore.server.sse import KEEPALIVE, event_stream

pytestmark = pytest.mark.anyio


def _frame(err: APIError) -> bytes:
    return f"error {err.status} {err.code}\n\n".encode() + b"end\n\n"


def _app(chunks: AsyncIterator[bytes], keepalive: float) -> Litestar:
    @get("/stream")
    async def stream() -> object:
        return event_stream(chunks, _frame, keepalive)

    return Litestar([stream])


async def _paced(pauses: list[float], fail: Exception | None = None) -> AsyncIterator[bytes]:
    for index, pause in enumerate(pauses):
        await asyncio.sleep(pause)
        yield f"data: {index}\n\n".encode()
    if fail is not None:
        raise fail


async def _body(app: Litestar) -> tuple[bytes, str]:
    async with AsyncTestClient(app) as client:
        response = await client.get("/stream")
    return response.content, response.headers["content-type"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_silence_is_filled_with_keepalives_between_the_chunks() -> None:
    body, kind = await _body(_app(_paced([0.0, 0.45, 0.0]), keepalive=0.1))
    assert kind.startswith("text/event-stream")
    before, _, after = body.partition(b"data: 1\n\n")
    assert before.startswith(b"data: 0\n\n")
    assert 2 <= before.count(KEEPALIVE) <= 5  # 0.45 s of silence at one per 0.1 s: 4
    assert after == b"data: 2\n\n"


async def test_chunks_faster_than_the_interval_need_no_keepalive() -> None:
    body, _ = await _body(_app(_paced([0.02] * 10), keepalive=0.1))
    assert KEEPALIVE not in body
    assert body == b"".join(f"data: {i}\n\n".encode() for i in range(10))


@pytest.mark.parametrize(
    ("failure", "frame"),
    [
        (APIError(503, "busy", code="overloaded"), b"error 503 overloaded\n\nend\n\n"),
        (RuntimeError("internal detail"), b"error 500 internal_error\n\nend\n\n"),
    ],
)
async def test_a_failure_after_the_start_ends_with_the_apis_error_frame(
    failure: Exception, frame: bytes
) -> None:
    body, _ = await _body(_app(_paced([0.0, 0.0], fail=failure), keepalive=5.0))
    assert body == b"data: 0\n\ndata: 1\n\n" + frame
    assert b"internal detail" not in body


async def test_a_client_that_leaves_closes_the_streams_generator() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield b"data: x\n\n"
        finally:
            closed.set()

    config = uvicorn.Config(_app(endless(), keepalive=5.0), port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/stream"
        async with httpx.AsyncClient() as client, client.stream("GET", url) as response:
            async for _ in response.aiter_bytes():
                break
        await asyncio.wait_for(closed.wait(), 5.0)
    finally:
        server.should_exit = True
        await serving
