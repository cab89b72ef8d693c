"""The page and its assets: ``GET /ui`` and ``GET /ui/{name}``.

Every file under ``static/`` is read once and served with its media type, a
Content-Security-Policy that allows scripts, styles and requests from this origin only
(no inline script, no ``eval``, no other origin), and the headers that keep it from being
framed or sniffed. These routes serve no data, so they are open behind ``--api-key``: the
page asks for the key and sends it with every API request.
"""

from __future__ import annotations

import functools
from importlib import resources

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler

from mlxcore.routes import BROWSER_HOME_OPTION, PUBLIC_OPTION
from mlxcore.server.errors import APIError

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Scripts, styles and requests from this origin only; images also from ``data:`` and
``blob:`` URLs (the previews of images a user attaches)."""

HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

OPEN = {PUBLIC_OPTION: True}


@functools.cache
def assets() -> dict[str, tuple[bytes, str]]:
    """Every file the page is made of: name -> (bytes, media type)."""
    folder = resources.files("mlxcore_ui").joinpath("static")
    found: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in MEDIA_TYPES:
            found[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return found


def page_weight() -> int:
    """Bytes of every asset together (what a first visit downloads, uncompressed)."""
    return sum(len(body) for body, _ in assets().values())


def _asset(name: str) -> Response[bytes]:
    found = assets().get(name)
    if found is None:
        raise APIError(404, f"the page has no file {name!r}", code="not_found")
    body, media_type = found
    return Response(body, media_type=media_type, headers=HEADERS)


@get("/ui", include_in_schema=False, opt={**OPEN, BROWSER_HOME_OPTION: True})
async def page() -> Response[bytes]:
    """The page: chat playground and dashboard."""
    return _asset("index.html")


@get("/ui/{name:str}", include_in_schema=False, opt=OPEN)
async def asset(name: str) -> Response[bytes]:
    """One of the page's scripts or styles."""
    return _asset(name)


def ui_routes() -> list[HTTPRouteHandler]:
    """The route handlers of this module."""
    return [page, asset]
