"""Every HTTP route the server serves, keyed by (method, path), with its plugin.

Plugins offer Litestar route handlers, Routers and Controllers through
``mlxcore_routes``. A :class:`RouteTable` flattens each offering to its
``(method, path)`` pairs, the way Litestar itself will mount it, and refuses a pair
that another plugin already serves, naming both plugins.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from litestar import Router

from mlxcore.errors import PluginError

IMPLICIT_METHODS = frozenset({"OPTIONS"})
"""Methods Litestar adds to every path by itself (CORS pre-flight)."""

PUBLIC_OPTION = "public"
"""A route handler's ``opt`` key: reachable without an API key. Only for routes that
serve no data (the browser page's files); everything else stays behind ``--api-key``."""

ADMIN_OPTION = "admin"
"""A route handler's ``opt`` key: an administrative route (it changes what the server
holds for everyone: models, adapters, downloads, the keys). On a server with API keys,
only a key with ``role = "admin"`` may call it; another key gets a 403 in the API's own
error shape. Every call is logged with the key's name."""

METRICS_OPTION = "metrics"
"""A route handler's ``opt`` key: a metrics route, open to whom ``--metrics-access``
says (any key, admin keys, or anyone)."""

BROWSER_HOME_OPTION = "browser_home"
"""A route handler's ``opt`` key: the page a browser asking for ``/`` is sent to (a
plugin's web page); clients asking for JSON still get the server's description."""


def http_routes(handlers: Iterable[Any]) -> Iterator[tuple[str, str, Any]]:
    """``(method, full path, handler)`` for every route in ``handlers`` (plain
    handlers, Routers and Controllers alike), without the implicit OPTIONS."""
    probe = Router(path="/", route_handlers=list(handlers))
    for route in probe.routes:
        for handler in getattr(route, "route_handlers", ()):
            for method in sorted(getattr(handler, "http_methods", ())):
                if method not in IMPLICIT_METHODS:
                    yield method, route.path, handler


class RouteTable:
    """The handlers to mount, in the order offered, and who serves each route."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []
        self._owner: dict[tuple[str, str], str] = {}

    def add(self, plugin: str, handlers: list[Any]) -> None:
        """Mount ``handlers`` for ``plugin``; :class:`PluginError` if a route is taken."""
        claimed: dict[tuple[str, str], str] = {}
        for method, path, _ in http_routes(handlers):
            key = (method, path)
            owner = self._owner.get(key) or claimed.get(key)
            if owner is not None:
                raise PluginError(
                    plugin,
                    f"{method} {path} is already served by plugin {owner!r}; "
                    "disable one of them with --no-plugin",
                    hook="mlxcore_routes",
                )
            claimed[key] = plugin
        self._owner.update(claimed)
        self.handlers.extend(handlers)

    def owner(self, method: str, path: str) -> str | None:
        """The plugin that serves ``method path``, if any."""
        return self._owner.get((method.upper(), path))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.handlers)
