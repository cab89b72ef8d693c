"""Who may call what: authentication, roles, per-key limits, and reading the keys again.

Every request passes :func:`before_request` (a Litestar ``before_request`` hook): its id
is assigned, then on a server with keys

1. the open routes (``/health``, ``/``, a plugin's page files; the metrics routes under
   ``--metrics-access public``) pass;
2. an in-process request (:mod:`mlxcore.server.internal`) passes, as the tenant its
   ``x-mlxcore-on-behalf-of`` header names (a removed key: 401);
3. any other request needs a key (401), an administrative route an admin key (403,
   :data:`~mlxcore.routes.ADMIN_OPTION`), a metrics route an admin key under
   ``--metrics-access admin``; a key over its rate limits gets a 429 with Retry-After;
4. the key becomes the request's tenant (:data:`~mlxcore.server.keys.current_key`) and
   an administrative call is logged with the key's name, never its secret.

The keys file is read again on SIGHUP (:func:`watch_sighup`) and on
``POST /admin/reload-keys``: a removed key is refused from its next request on; running
requests, stored records and the prefix cache are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request, get, post

from mlxcore.errors import UsageError
from mlxcore.routes import ADMIN_OPTION, METRICS_OPTION, PUBLIC_OPTION
from mlxcore.server import request_ids
from mlxcore.server.errors import APIError
from mlxcore.server.internal import is_internal
from mlxcore.server.keys import ApiKey, KeyTable, current_key, retry_after
from mlxcore.server.openapi import (
    ERRORS_OPTION,
    INTEGER,
    REPLIES_OPTION,
    STRING,
    array,
    const,
    nullable,
    obj,
    reply,
)
from mlxcore.server.tenants import ON_BEHALF_HEADER

log = logging.getLogger("mlxcore.server.auth")

OPEN_PATHS = frozenset({"/health", "/"})


def _token(request: Request[Any, Any, Any]) -> str:
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    return token or request.headers.get("x-api-key", "")


def _denied(what: str) -> APIError:
    return APIError(403, f"{what} needs an admin API key", code="permission_denied")


def before_request(
    keys: KeyTable, metrics_access: str
) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """The app's ``before_request`` hook (see the module docstring)."""

    async def check(request: Request[Any, Any, Any]) -> None:
        request_ids.assign(request.scope)  # type: ignore[arg-type]
        if not keys:
            return
        opt = request.route_handler.opt
        if request.url.path in OPEN_PATHS or opt.get(PUBLIC_OPTION):
            return
        metrics = bool(opt.get(METRICS_OPTION))
        if metrics and metrics_access == "public":
            return
        if is_internal(request.headers, request.app.state.internal_token):
            owner = request.headers.get(ON_BEHALF_HEADER)
            if owner is not None:
                key = keys.named(owner)
                if key is None:
                    raise APIError(
                        401, f"the API key {owner!r} was removed", code="invalid_api_key"
                    )
                current_key.set(key)
            return
        key = keys.find(_token(request))
        if key is None:
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")
        admin_route = bool(opt.get(ADMIN_OPTION))
        if admin_route and not key.is_admin:
            raise _denied(f"{request.method} {request.url.path}")
        if metrics and metrics_access == "admin" and not key.is_admin:
            raise _denied("reading the metrics (--metrics-access admin)")
        wait = key.admit(time.monotonic())
        if wait > 0:
            raise APIError(
                429,
                f"API key {key.name!r} is over its limit of requests or tokens per minute; "
                f"retry in {retry_after(wait)} s",
                code="rate_limit_exceeded",
                headers={"Retry-After": retry_after(wait)},
            )
        current_key.set(key)
        if admin_route:
            log.info("admin %s: %s %s", key.name, request.method, request.url.path)

    return check


def reload_keys(keys: KeyTable) -> dict[str, Any]:
    """Read the keys file again (UsageError when there is none or it is bad: the keys in
    force stay); logged."""
    added, removed = keys.reload()
    log.info(
        "API keys read again from %s: %d keys; added %s; removed %s",
        keys.path,
        len(keys.keys),
        ", ".join(added) or "none",
        ", ".join(removed) or "none",
    )
    return {"object": "keys.reload", "keys": len(keys.keys), "added": added, "removed": removed}


@contextlib.contextmanager
def watch_sighup(keys: KeyTable) -> Any:
    """While in the block, SIGHUP reads the keys file again (where the platform has
    SIGHUP and the loop takes signal handlers: the main thread's)."""
    loop = asyncio.get_running_loop()
    installed = False
    if keys.path is not None and hasattr(signal, "SIGHUP"):

        def on_hup() -> None:
            try:
                reload_keys(keys)
            except UsageError as exc:
                log.error("SIGHUP: the keys in force stay: %s", exc)

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, on_hup)
            installed = True
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGHUP)


RELOADED = obj(
    {
        "object": const("keys.reload"),
        "keys": INTEGER,
        "added": array(STRING),
        "removed": array(STRING),
    },
    title="KeysReloaded",
)


@post(
    "/admin/reload-keys",
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        REPLIES_OPTION: {200: reply("the keys in force now", RELOADED)},
        ERRORS_OPTION: {400: "no --api-keys-file, or the file is bad (the keys in force stay)"},
    },
)
async def reload_keys_route(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Read ``--api-keys-file`` again (as SIGHUP does): a removed key is refused from its
    next request; a bad file is a 400 and the keys in force stay."""
    keys: KeyTable = request.app.state.api_keys
    try:
        return reload_keys(keys)
    except UsageError as exc:
        raise APIError(400, str(exc), code="invalid_keys_file") from None


WHOAMI = obj(
    {
        "object": const("api_key"),
        "name": nullable(STRING),
        "role": {"enum": ["admin", "user"]},
        "cache_group": nullable(STRING),
    },
    {"limits": {"type": "object", "additionalProperties": nullable(INTEGER)}},
    title="ApiKeyInfo",
)


def describe(key: ApiKey | None) -> dict[str, Any]:
    """What ``GET /v1/me`` says of ``key`` (``None``: a server without keys, where every
    client may do everything)."""
    if key is None:
        return {"object": "api_key", "name": None, "role": "admin", "cache_group": None}
    limits = {
        field: getattr(key, field)
        for field in (
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
            "max_stored_bytes",
            "max_file_bytes",
        )
    }
    return {
        "object": "api_key",
        "name": key.name,
        "role": key.role,
        "cache_group": key.cache_group,
        "limits": limits,
    }


@get("/v1/me", opt={REPLIES_OPTION: {200: reply("the key this request carries", WHOAMI)}})
async def whoami() -> dict[str, Any]:
    """The API key of this request: its name, role, cache group and limits (never its
    secret); the web page shows admin controls to an admin key only."""
    return describe(current_key.get())


AUTH_ROUTES = [reload_keys_route, whoami]
"""The routes of this module (the core's own)."""
