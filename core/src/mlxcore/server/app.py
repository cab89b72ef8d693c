"""The Litestar application and ``mlxcore serve``.

Routes come from the ``mlxcore_routes`` hook (the OpenAI routes are a built-in
plugin); the app adds /health, /metrics, /openapi.json and /docs, API-key auth,
CORS, a body size limit, and errors in each API's own shape for everything (a
router's own exception handler also answers the errors raised before routing,
such as a 405, on its paths).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response, Router, get, head
from litestar.config.cors import CORSConfig

from mlxcore import structured
from mlxcore.hooks import PluginHooks
from mlxcore.routes import RouteTable, http_routes
from mlxcore.runtime import Runtime
from mlxcore.server.errors import APIError, api_error_handler
from mlxcore.server.frontend import served_names
from mlxcore.server.metrics import Metrics, engine_gauges, memory_gauges
from mlxcore.server.openapi import docs_page, openapi_document
from mlxcore.server.protocol import header_timeout_protocol
from mlxcore.server.service import GenerationService

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/"})


@get("/health")
async def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Readiness and load: 200 while the engine serves, 503 (with the reason) while it
    restarts after a fault, has failed for good, or shuts down."""
    svc: GenerationService = request.app.state.service
    engine = svc.runtime.engine
    ok, state, reason = engine.health()
    stats = engine.stats()
    mlx = memory_gauges()
    body: dict[str, Any] = {
        "status": "ok" if ok else "unavailable",
        "engine": state,
        "running": int(stats["requests_running"]),
        "waiting": int(stats["requests_waiting"]),
        "restarts": int(stats["engine_restarts"]),
        "memory": {
            "weights_bytes": int(stats["memory_weights_bytes"]),
            "kv_reserved_bytes": int(stats["memory_kv_reserved_bytes"]),
            "prefix_cache_bytes": int(stats["prefix_cache_bytes"]),
            "mlx_active_bytes": int(mlx["memory_active_bytes"]),
            "mlx_cache_bytes": int(mlx["memory_cache_bytes"]),
        },
    }
    if not svc.config.api_key:  # /health is open: name nothing behind the key
        body["model"] = served_names(svc)[0]
    if reason:
        body["reason"] = reason
    return Response(body, status_code=200 if ok else 503)


@head("/health")
async def health_head() -> None:
    """``HEAD /health`` for load balancers and uptime probes: 200, no body."""


@get("/")
async def root(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """``GET /``: what this server is (clients such as Claude Code probe it)."""
    svc: GenerationService = request.app.state.service
    body: dict[str, Any] = {"object": "server", "name": "mlxcore", "status": "ok"}
    if not svc.config.api_key:
        body["model"] = served_names(svc)[0]
    return body


@head("/")
async def root_head() -> None:
    """``HEAD /``: 200, no body (a reachability probe)."""


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus metrics."""
    svc: GenerationService = request.app.state.service
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")


ACCEPT_DRAIN_SECONDS = 1.0
"""After SIGTERM, how long the listening socket keeps accepting (answering 503)."""

EXIT_ENGINE_FAILED = 70
"""``mlxcore serve``'s exit status when the engine failed for good (EX_SOFTWARE)."""


async def _exit_when_engine_fails(app: Litestar, runtime: Runtime) -> None:
    """Stop the server once the engine has failed for good (no restarts left), after a
    short grace period in which /health reports why."""
    while runtime.engine.state != "failed":
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)
    server = getattr(app.state, "server", None)
    if server is not None:
        server.should_exit = True


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


def _error_handlers_by_path(handlers: list[Any]) -> dict[str, Any]:
    """Full path -> the exception handler of the router that serves it."""
    found: dict[str, Any] = {}
    for handler in handlers:
        if isinstance(handler, Router) and Exception in (handler.exception_handlers or {}):
            for _, path, _ in http_routes([handler]):
                found[path] = handler.exception_handlers[Exception]
    return found


def create_app(runtime: Runtime, hooks: PluginHooks) -> Litestar:
    """Build the app around a runtime (the engine is started and stopped with the app)."""
    config = runtime.config
    service = GenerationService(runtime, Metrics(lambda: engine_gauges(runtime.engine)))
    core = RouteTable()
    core.add("mlxcore", [root, root_head, health, health_head, metrics])
    routes = hooks.routes(config, core).handlers
    document = openapi_document(routes)
    page = docs_page(document)

    @get("/openapi.json", media_type="application/json")
    async def openapi_json() -> dict[str, Any]:
        """The server's OpenAPI 3.1 document."""
        return document

    @get("/docs", media_type="text/html")
    async def docs() -> str:
        """A page describing every route and its request schema."""
        return page

    handlers = [*routes, openapi_json, docs]
    by_path = _error_handlers_by_path(handlers)

    def errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        own = by_path.get(request.url.path)
        if own is not None:
            result: Response[Any] = own(request, exc)
            return result
        return api_error_handler(request, exc)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        runtime.engine.start()
        # compile the tokenizer for constrained decoding now, not on the first request
        warm = asyncio.ensure_future(service.prepare(structured.prepare, runtime.tokenizer))
        watch = asyncio.ensure_future(_exit_when_engine_fails(app, runtime))
        try:
            yield
        finally:
            warm.cancel()
            watch.cancel()
            await asyncio.get_running_loop().run_in_executor(None, runtime.engine.shutdown)
            service.close()

    cors = (
        CORSConfig(allow_origins=list(config.allowed_origins)) if config.allowed_origins else None
    )
    app = Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: errors},
        before_request=_auth_hook(config.api_key),
        before_send=[service.metrics.count_response],
        cors_config=cors,
        request_max_body_size=config.max_request_body_bytes,
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.service = service
    return app


def serve(runtime: Runtime, hooks: PluginHooks) -> int:
    """Run the app with uvicorn until interrupted (SIGINT / SIGTERM: stop admitting,
    let running requests finish within ``--shutdown-timeout``). Returns the exit
    status: 0, or 70 when the engine failed for good (so a supervisor restarts it)."""
    import uvicorn

    config = runtime.config
    app = create_app(runtime, hooks)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # SIGTERM / SIGINT: answer the queue now and let running requests finish;
            # keep accepting for a moment so connections already in the listen backlog
            # get a 503 instead of a reset. A second signal stops at once.
            if runtime.engine.state in ("stopping", "stopped") or self.should_exit:
                super().handle_exit(sig, frame)
                return
            runtime.engine.begin_shutdown()
            timer = threading.Timer(ACCEPT_DRAIN_SECONDS, super().handle_exit, (sig, frame))
            timer.daemon = True
            timer.start()

    server = Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level if config.log_level != "trace" else "trace",
            log_config=None,
            timeout_graceful_shutdown=int(config.shutdown_timeout) + 5,
            http=header_timeout_protocol(config.header_timeout),
        )
    )
    app.state.server = server
    log.info("serving %s at http://%s:%d/v1", runtime.info.source, config.host, config.port)
    server.run()
    if runtime.engine.state == "failed":
        log.critical("exiting: %s", runtime.engine.reason)
        return EXIT_ENGINE_FAILED
    return 0
