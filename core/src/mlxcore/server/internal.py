"""Calling the server's own routes in process, for plugins' background work.

A batch runner or a warmer sends its requests through the same routes, validation and
output pipeline as any client, without a socket: an httpx client on the app's ASGI
interface. Such requests carry a secret made at start-up (never leaves the process), so
they pass ``--api-key``, as the tenant they name (:mod:`mlxcore.server.tenants`) or as
none; everything else about them (metrics, request ids, priorities) is as for a
client's.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

INTERNAL_HEADER = "x-mlxcore-internal"


def new_token() -> str:
    """A fresh secret for one app (``app.state.internal_token``)."""
    return secrets.token_hex(16)


def is_internal(headers: Any, token: str | None) -> bool:
    """Whether a request carries this app's in-process secret."""
    given = headers.get(INTERNAL_HEADER)
    return bool(token and given and hmac.compare_digest(str(given), token))


def internal_client(
    app: Any, timeout: float | None = None, headers: dict[str, str] | None = None
) -> Any:
    """An ``httpx.AsyncClient`` that calls ``app``'s routes in process (base URL
    ``http://mlxcore.internal``), past ``--api-key``; ``headers`` added to each request
    (:func:`mlxcore.server.tenants.on_behalf_of_header` makes them a tenant's). Close it
    when done."""
    import httpx

    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://mlxcore.internal",
        headers={**(headers or {}), INTERNAL_HEADER: app.state.internal_token},
        timeout=timeout,
    )
