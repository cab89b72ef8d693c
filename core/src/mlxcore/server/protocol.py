"""uvicorn's HTTP/1.1 protocol with a deadline for the request head.

uvicorn times out idle keep-alive connections, but a client that opens a connection
(or starts a request) and then sends its header bytes slowly, or never finishes them,
holds the connection forever. This subclass, given to uvicorn as its ``http``
protocol class (nothing is patched), closes such a connection once the head has not
arrived ``header_timeout`` seconds after its first byte, or after the connection
opened. Slow bodies are bounded by the routes themselves (``decode_body``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def header_timeout_protocol(header_timeout: float) -> type[H11Protocol]:
    """An :class:`H11Protocol` subclass closing connections whose request head is late."""

    class HeaderTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._arm_head_timer()
            else:
                self._disarm_head_timer()

        def _arm_head_timer(self) -> None:
            if self._head_timer is None and header_timeout > 0:
                self._head_timer = self.loop.call_later(header_timeout, self._head_late)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm_head_timer()  # the keep-alive timer covers the idle time now

        def _head_late(self) -> None:
            self._head_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            late = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if late and idle:
                self.transport.close()

    return HeaderTimeoutProtocol
