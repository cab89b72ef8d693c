"""``GET /openapi.json`` and ``GET /docs``: the server's API, from the routes' own schemas.

Routes decode their bodies with msgspec structs; a route declares its body type in its
handler options (``opt={"body": SomeStruct}``) and the document is generated from
the same structs with ``msgspec.json.schema_components``, so it cannot drift from
what the routes accept. The docs page is self-contained (no script from a CDN): it
lists every route with its request schema.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

import msgspec

import mlxcore
from mlxcore.routes import http_routes

BODY_OPTION = "body"
"""Handler ``opt`` key naming the msgspec struct a route decodes its JSON body into."""

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error: OpenAI's shape ({error: {...}}) or, on Anthropic routes, "
    "Anthropic's ({type: error, error: {...}}).",
    "properties": {
        "type": {"type": "string"},
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        },
    },
    "required": ["error"],
}


def openapi_document(handlers: Iterable[Any], title: str = "mlxcore") -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``handlers``."""
    routes = [r for r in http_routes(handlers) if r[0] != "HEAD"]
    bodies = {h.opt.get(BODY_OPTION) for _, _, h in routes} - {None}
    order = sorted(bodies, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(
        order, ref_template="#/components/schemas/{name}"
    )
    body_refs = dict(zip(order, schemas, strict=True))
    components["Error"] = ERROR_SCHEMA
    paths: dict[str, dict[str, Any]] = {}
    for method, path, handler in routes:
        operation: dict[str, Any] = {
            "operationId": f"{handler.handler_name}_{method.lower()}",
            "summary": (handler.fn.__doc__ or "").strip().splitlines()[0]
            if handler.fn.__doc__
            else handler.handler_name,
            "responses": {
                "200": {"description": "OK (JSON, or text/event-stream when streaming)"},
                "400": _error("the request is invalid"),
                "401": _error("missing or wrong API key"),
                "404": _error("unknown model or route"),
                "503": _error("overloaded or restarting; retry after Retry-After seconds"),
            },
        }
        body = handler.opt.get(BODY_OPTION)
        if body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body_refs[body]}},
            }
            operation["responses"]["413"] = _error("the body is too large")
            operation["responses"]["415"] = _error("the body is not JSON")
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": mlxcore.__version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained HTML page describing every route of ``document``."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(document['info']['title'])} API</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "pre{background:#f4f4f4;padding:1em;overflow:auto}</style></head><body>",
        f"<h1>{html.escape(document['info']['title'])} {document['info']['version']}</h1>",
        "<p>The machine-readable schema is at <a href='/openapi.json'>/openapi.json</a>.</p>",
    ]
    for path, operations in sorted(document["paths"].items()):
        for method, op in operations.items():
            parts.append(f"<h2><code>{method.upper()} {html.escape(path)}</code></h2>")
            parts.append(f"<p>{html.escape(op['summary'])}</p>")
            body = op.get("requestBody")
            if body is not None:
                ref = body["content"]["application/json"]["schema"]["$ref"]
                name = ref.rsplit("/", 1)[-1]
                schema = document["components"]["schemas"][name]
                text = json.dumps(schema, indent=2)
                parts.append(f"<p>Body: <code>{name}</code></p><pre>{html.escape(text)}</pre>")
    parts.append("</body></html>")
    return "".join(parts)
