"""The Litestar application and ``mlxcore serve``.

Routes come from the ``mlxcore_routes`` hook (the OpenAI routes are a built-in
plugin); the app adds /health, /metrics, /openapi.json and /docs, API-key auth
(:mod:`mlxcore.server.auth`),
CORS, a body size limit, and errors in each API's own shape for everything (a
router's own exception handler also answers the errors raised before routing,
such as a 405, on its paths).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response, Router, get, head
from litestar.config.cors import CORSConfig
from litestar.response import Redirect

from mlxcore import structured
from mlxcore.config import ServerConfig
from mlxcore.embeddings import EmbeddingError, hidden_size
from mlxcore.hooks import PluginHooks
from mlxcore.routes import BROWSER_HOME_OPTION, RouteTable, http_routes
from mlxcore.server import request_ids
from mlxcore.server.auth import AUTH_ROUTES, before_request, watch_sighup
from mlxcore.server.errors import api_error_handler
from mlxcore.server.internal import new_token
from mlxcore.server.keys import KeyCollector, KeyTable
from mlxcore.server.metrics import Metrics
from mlxcore.server.metrics_routes import metrics, metrics_history, metrics_json
from mlxcore.server.model_routes import model_routes
from mlxcore.server.openapi import (
    INTEGER,
    REPLIES_OPTION,
    STRING,
    ModelLimits,
    const,
    docs_page,
    obj,
    openapi_document,
    reply,
)
from mlxcore.server.protocol import header_timeout_protocol
from mlxcore.server.router import ModelRouter, ModelSlot

log = logging.getLogger(__name__)


def _keyed(config: ServerConfig) -> bool:
    """Whether API keys guard the server (then the open routes name no model)."""
    return bool(config.api_key or config.api_keys_file)


_BYTES = [
    "weights_bytes",
    "kv_reserved_bytes",
    "prefix_cache_bytes",
    "prefix_cache_budget_bytes",
    "mlx_active_bytes",
    "mlx_cache_bytes",
]
HEALTH = obj(
    {
        "status": {"enum": ["ok", "unavailable"]},
        "engine": STRING,
        "running": INTEGER,
        "waiting": INTEGER,
        "restarts": INTEGER,
        "jobs": obj({"running": INTEGER, "waiting": INTEGER}),
        "memory": obj(dict.fromkeys(_BYTES, INTEGER)),
    },
    {
        "model": STRING,
        "models": {"type": "object", "additionalProperties": STRING},
        "reason": STRING,
    },
    title="Health",
)
"""What ``/health`` answers (200 or 503)."""
SERVER = obj({"object": const("server"), "name": STRING, "status": STRING}, {"model": STRING})


@get(
    "/health",
    opt={
        REPLIES_OPTION: {
            200: reply("serving", HEALTH),
            503: reply("an engine restarts, has failed, or the server shuts down", HEALTH),
        }
    },
)
async def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Readiness and load: 200 while the loaded engines serve, 503 (with the reason) while
    one restarts after a fault, has failed for good, or shuts down. Load and memory are
    summed over the loaded models; with several models, ``models`` gives each one's state."""
    router: ModelRouter = request.app.state.router
    config: ServerConfig = request.app.state.config
    ok, state, reasons = True, "running", []
    for slot in router.loaded():
        assert slot.service is not None
        good, engine_state, reason = slot.service.runtime.engine.health()
        if not good:
            ok, state = False, engine_state
            reasons.append(reason if router.single else f"{slot.spec.name}: {reason}")
    stats = router.gauges()
    body: dict[str, Any] = {
        "status": "ok" if ok else "unavailable",
        "engine": state,
        "running": int(stats.get("requests_running", 0)),
        "waiting": int(stats.get("requests_waiting", 0)),
        "restarts": int(stats.get("engine_restarts", 0)),
        "jobs": {  # embeddings the engines run between steps
            "running": int(stats.get("jobs_running", 0)),
            "waiting": int(stats.get("jobs_waiting", 0)),
        },
        "memory": {
            "weights_bytes": int(stats.get("memory_weights_bytes", 0)),
            "kv_reserved_bytes": int(stats.get("memory_kv_reserved_bytes", 0)),
            "prefix_cache_bytes": int(stats.get("prefix_cache_bytes", 0)),
            # what the prefix caches may hold (--prefix-cache-size; auto: from memory)
            "prefix_cache_budget_bytes": int(stats.get("memory_prefix_cache_budget_bytes", 0)),
            "mlx_active_bytes": int(stats["memory_active_bytes"]),
            "mlx_cache_bytes": int(stats["memory_cache_bytes"]),
        },
    }
    if "expert_cache_capacity_bytes" in stats:  # a model streams its experts from disk
        body["expert_cache"] = {
            key: int(stats.get(f"expert_cache_{key}", 0))
            for key in ("bytes", "capacity_bytes", "hits", "misses", "read_bytes")
        }
    if not _keyed(config):  # /health is open: name nothing behind a key
        body["model"] = router.default.spec.name
        if not router.single:
            body["models"] = {slot.spec.name: slot.state for slot in router.slots}
    if reasons:
        body["reason"] = "; ".join(reasons)
    return Response(body, status_code=200 if ok else 503)


@head("/health")
async def health_head() -> None:
    """``HEAD /health`` for load balancers and uptime probes: 200, no body."""


@get(
    "/",
    opt={
        REPLIES_OPTION: {
            200: reply("this server", SERVER),
            302: {
                "description": "a browser (Accept: text/html) is sent to the web page",
                "content": {},
                "headers": {"Location": {"schema": STRING}},
            },
        },
    },
)
async def root(request: Request[Any, Any, Any]) -> Response[Any]:
    """``GET /``: what this server is (clients such as Claude Code probe it); a browser is
    sent to the web page when a plugin serves one (the ``ui`` plugin)."""
    home: str | None = request.app.state.browser_home
    if home and request.accept.best_match(["application/json", "text/html"]) == "text/html":
        query = request.url.query
        return Redirect(home + (f"?{query}" if query else ""), status_code=302)
    router: ModelRouter = request.app.state.router
    body: dict[str, Any] = {"object": "server", "name": "mlxcore", "status": "ok"}
    if not _keyed(request.app.state.config):
        body["model"] = router.default.spec.name
    return Response(body)


@head("/")
async def root_head() -> None:
    """``HEAD /``: 200, no body (a reachability probe)."""


ACCEPT_DRAIN_SECONDS = 1.0
"""After SIGTERM, how long the listening socket keeps accepting (answering 503)."""

EXIT_ENGINE_FAILED = 70
"""``mlxcore serve``'s exit status when the engine failed for good (EX_SOFTWARE)."""


async def _exit_when_engine_fails(app: Litestar, router: ModelRouter) -> None:
    """Stop a one-model server once its engine has failed for good (no restarts left),
    after a short grace period in which /health reports why (with several models, the
    router unloads a failed one instead and the next request reloads it)."""
    if not router.single:
        return
    while not any(s.service.runtime.engine.state == "failed" for s in router.loaded() if s.service):
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)
    server = getattr(app.state, "server", None)
    if server is not None:
        server.should_exit = True


def browser_home(handlers: list[Any]) -> str | None:
    """The path of the page a browser asking for ``/`` is sent to, if a plugin serves one
    (a GET route whose ``opt`` holds :data:`~mlxcore.routes.BROWSER_HOME_OPTION`)."""
    for method, path, handler in http_routes(handlers):
        if method == "GET" and handler.opt.get(BROWSER_HOME_OPTION):
            return str(path)
    return None


def _error_handlers_by_path(handlers: list[Any]) -> dict[str, Any]:
    """Full path -> the exception handler of the router that serves it."""
    found: dict[str, Any] = {}
    for handler in handlers:
        if isinstance(handler, Router) and Exception in (handler.exception_handlers or {}):
            for _, path, _ in http_routes([handler]):
                found[path] = handler.exception_handlers[Exception]
    return found


def _limits(router: ModelRouter) -> ModelLimits | None:
    """The default model's bounds for the OpenAPI document (None while it is not loaded)."""
    service = router.default.service
    if service is None:
        return None
    try:
        hidden: int | None = hidden_size(service.runtime.model)
    except EmbeddingError:
        hidden = None
    vocab = service.runtime.engine.limits.vocab_size
    return ModelLimits(
        vocab_size=vocab,
        prompt_vocab=min(vocab, len(service.runtime.tokenizer)),
        context=service.context_length,
        hidden_size=hidden,
    )


def create_app(
    router: ModelRouter, hooks: PluginHooks, preload: Sequence[ModelSlot] = ()
) -> Litestar:
    """Build the app around a model router (its engines start and stop with the app;
    ``preload``: models to load at start-up)."""
    config = router.default.spec.config
    core = RouteTable()
    core.add(
        "mlxcore",
        [
            root,
            root_head,
            health,
            health_head,
            metrics,
            metrics_json,
            metrics_history,
            *model_routes(),
            *AUTH_ROUTES,
        ],
    )
    routes = hooks.routes(config, core).handlers
    # built at the first ask, once the default model (and its limits) is loaded
    document = functools.cache(lambda: openapi_document(routes, limits=_limits(router)))

    @get("/openapi.json", media_type="application/json")
    async def openapi_json() -> dict[str, Any]:
        """The server's OpenAPI 3.1 document."""
        return document()

    @get("/docs", media_type="text/html")
    async def docs() -> str:
        """A page describing every route and its request schema."""
        return docs_page(document())

    handlers = [*routes, openapi_json, docs]
    by_path = _error_handlers_by_path(handlers)

    def errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        own = by_path.get(request.url.path)
        if own is not None:
            result: Response[Any] = own(request, exc)
            return result
        return api_error_handler(request, exc)

    keys = KeyTable.from_config(config.api_key, config.api_keys_file)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await router.start(preload)
        # compile the tokenizer for constrained decoding now, not on the first request
        warm = [
            asyncio.ensure_future(
                s.service.prepare(structured.prepare, s.service.runtime.tokenizer)
            )
            for s in router.loaded()
            if s.service is not None
        ]
        watch = asyncio.ensure_future(_exit_when_engine_fails(app, router))
        sampler = asyncio.ensure_future(router.metrics.history.run(router.gauges))
        try:
            async with contextlib.AsyncExitStack() as plugins:
                plugins.enter_context(watch_sighup(keys))
                for lifespan_ in hooks.server_lifespans(app):
                    await plugins.enter_async_context(lifespan_)
                yield
        finally:
            for task in [*warm, watch, sampler]:
                task.cancel()
            await router.stop()

    cors = (
        CORSConfig(allow_origins=list(config.allowed_origins)) if config.allowed_origins else None
    )
    if keys:
        router.metrics.registry.register(KeyCollector(keys))
    app = Litestar(
        route_handlers=handlers,
        exception_handlers={Exception: errors},
        before_request=before_request(keys, config.metrics_access),
        before_send=[_on_response_start(router.metrics, config.replica_name)],
        cors_config=cors,
        request_max_body_size=config.max_request_body_bytes,
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.router = router
    app.state.config = config
    app.state.api_keys = keys
    app.state.browser_home = browser_home(routes)
    app.state.internal_token = new_token()
    app.state.metrics = router.metrics
    return app


REPLICA_HEADER = b"x-mlxcore-replica"
"""The response header naming the replica (``--replica-name``)."""


def _on_response_start(
    metrics: Metrics, replica: str | None
) -> Callable[[Any, Any], Awaitable[None]]:
    """One ``before_send`` hook for the response's start (request id and replica
    headers, metrics); a streamed body's chunks go past it with one check each."""
    replica_header = (REPLICA_HEADER, replica.encode()) if replica else None

    async def hook(message: Any, scope: Any) -> None:
        if message["type"] == "http.response.start":
            await request_ids.echo(message, scope)
            if replica_header is not None:
                message["headers"] = [*(message.get("headers") or []), replica_header]
            await metrics.count_response(message, scope)

    return hook


def serve(router: ModelRouter, hooks: PluginHooks, preload: Sequence[ModelSlot] = ()) -> int:
    """Run the app with uvicorn until interrupted (SIGINT / SIGTERM: stop admitting,
    let running requests finish within ``--shutdown-timeout``). Returns the exit
    status: 0, or 70 when a one-model server's engine failed for good (so a supervisor
    restarts it)."""
    import uvicorn

    config = router.default.spec.config
    app = create_app(router, hooks, preload)
    stopping = threading.Event()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # SIGTERM / SIGINT: answer the queue now and let running requests finish;
            # keep accepting for a moment so connections already in the listen backlog
            # get a 503 instead of a reset. A second signal stops at once.
            if stopping.is_set() or self.should_exit:
                super().handle_exit(sig, frame)
                return
            stopping.set()
            router.begin_shutdown()
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
    names = ", ".join(slot.spec.name for slot in router.slots)
    log.info("serving %s at http://%s:%d/v1", names, config.host, config.port)
    if app.state.browser_home:
        log.info("web page at http://%s:%d/", config.host, config.port)
    server.run()
    failed = [s for s in router.slots if s.service and s.service.runtime.engine.state == "failed"]
    if router.single and failed:
        assert failed[0].service is not None
        log.critical("exiting: %s", failed[0].service.runtime.engine.reason)
        return EXIT_ENGINE_FAILED
    return 0
