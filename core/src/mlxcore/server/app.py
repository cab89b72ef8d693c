"""The Litestar application and ``mlxcore serve``.

Routes come from the ``mlxcore_routes`` hook (the OpenAI routes are a built-in
plugin); the app adds /health, /metrics, API-key auth, CORS, a body size limit
and OpenAI-shaped errors for everything.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response, get, head
from litestar.config.cors import CORSConfig
from litestar.handlers import HTTPRouteHandler

from mlxcore import structured
from mlxcore.cli.runtime import Runtime
from mlxcore.errors import PluginError
from mlxcore.hooks import PluginHooks
from mlxcore.server.errors import APIError, api_error_handler
from mlxcore.server.metrics import Metrics, engine_gauges
from mlxcore.server.service import GenerationService

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health"})


@get("/health")
async def health(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Liveness and load: always 200 while the server runs."""
    svc: GenerationService = request.app.state.service
    stats = svc.runtime.engine.stats()
    return {
        "status": "ok",
        "model": svc.runtime.info.source,
        "running": int(stats["requests_running"]),
        "waiting": int(stats["requests_waiting"]),
    }


@head("/health")
async def health_head() -> None:
    """``HEAD /health`` for load balancers and uptime probes: 200, no body."""


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus metrics."""
    svc: GenerationService = request.app.state.service
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")


def _auth_hook(api_key: str | None) -> Any:
    if not api_key:
        return None
    expected = api_key.encode()

    async def check(request: Request[Any, Any, Any]) -> None:
        if request.url.path in OPEN_PATHS:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        token = token or request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.encode(), expected):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")

    return check


def _check_unique_paths(handlers: list[Any]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for handler in handlers:
        if not isinstance(handler, HTTPRouteHandler):
            continue
        for path in handler.paths:
            for method in handler.http_methods:
                key = (method, path)
                name = f"{handler.handler_name}"
                if key in seen:
                    raise PluginError(
                        "routes",
                        f"{method} {path} is registered twice: by {seen[key]} and by {name}",
                        hook="mlxcore_routes",
                    )
                seen[key] = name


def create_app(runtime: Runtime, hooks: PluginHooks) -> Litestar:
    """Build the app around a runtime (the engine is started and stopped with the app)."""
    config = runtime.config
    service = GenerationService(runtime, Metrics(lambda: engine_gauges(runtime.engine)))
    handlers = [health, health_head, metrics, *hooks.routes(config)]
    _check_unique_paths(handlers)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        runtime.engine.start()
        # compile the tokenizer for constrained decoding now, not on the first request
        warm = asyncio.ensure_future(service.prepare(structured.prepare, runtime.tokenizer))
        try:
            yield
        finally:
            warm.cancel()
            runtime.engine.shutdown()
            service.close()

    cors = (
        CORSConfig(allow_origins=list(config.allowed_origins)) if config.allowed_origins else None
    )
    app = Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: api_error_handler},
        before_request=_auth_hook(config.api_key),
        cors_config=cors,
        request_max_body_size=config.max_request_body_bytes,
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.service = service
    return app


def serve(runtime: Runtime, hooks: PluginHooks) -> None:
    """Run the app with uvicorn until interrupted."""
    import uvicorn

    config = runtime.config
    app = create_app(runtime, hooks)
    log.info("serving %s at http://%s:%d/v1", runtime.info.source, config.host, config.port)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level if config.log_level != "trace" else "trace",
        log_config=None,
        timeout_graceful_shutdown=5,
    )
