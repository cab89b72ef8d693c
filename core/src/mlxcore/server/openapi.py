"""``GET /openapi.json`` and ``GET /docs``: the server's API, from the routes' own schemas.

Routes decode their bodies with msgspec structs; a route declares its body type in its
handler options (``opt={"body": SomeStruct}``) and the document is generated from
the same structs with ``msgspec.json.schema_components``, so it cannot drift from
what the routes accept. The docs page is self-contained (no script from a CDN): it
lists every route with its request schema.
"""

from __future__ import annotations

import copy
import html
import json
import re
from collections.abc import Iterable
from typing import Any

import attrs
import msgspec

import mlxcore
from mlxcore.routes import ADMIN_OPTION, http_routes

BODY_OPTION = "body"
"""Handler ``opt`` key naming the msgspec struct a route decodes its JSON body into."""
FORM_OPTION = "form"
"""Handler ``opt`` key: the JSON Schema of a ``multipart/form-data`` body (an upload)."""
FORM_MEDIA = "multipart/form-data"
ERRORS_OPTION = "errors"
"""Handler ``opt`` key: the statuses a route answers beyond the common ones
(``{"409": "why"}``)."""
QUERY_OPTION = "query"
"""Handler ``opt`` key: the route's query parameters (``{name: schema}``), all optional."""
REPLIES_OPTION = "replies"
"""Handler ``opt`` key: what a route answers, by status (``{200: reply(...)}``); a named
schema (one with a ``title``) becomes a component."""

STRING: dict[str, Any] = {"type": "string"}
INTEGER: dict[str, Any] = {"type": "integer"}
NUMBER: dict[str, Any] = {"type": "number"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
OBJECT: dict[str, Any] = {"type": "object"}


def given(field: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A rule's condition: ``field`` is present and not null (and matches ``schema``)."""
    value: dict[str, Any] = {"not": {"type": "null"}}
    if schema is not None:
        value = {"allOf": [value, schema]}
    return {"required": [field], "properties": {field: value}}


def implies(condition: dict[str, Any], consequence: dict[str, Any]) -> dict[str, Any]:
    """A rule: a request matching ``condition`` must match ``consequence``."""
    return {"if": condition, "then": consequence}


def exactly_one(*alternatives: dict[str, Any]) -> dict[str, Any]:
    """A rule: exactly one of the ``alternatives`` (conditions such as :func:`given`)."""
    return {"oneOf": list(alternatives)}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or ``null``."""
    return {"anyOf": [schema, {"type": "null"}]}


def const(value: Any) -> dict[str, Any]:
    """Exactly ``value``."""
    return {"const": value}


def array(items: dict[str, Any]) -> dict[str, Any]:
    """A list of ``items``."""
    return {"type": "array", "items": items}


def obj(
    required: dict[str, Any], optional: dict[str, Any] | None = None, *, title: str | None = None
) -> dict[str, Any]:
    """An object schema: ``required`` fields always present, ``optional`` ones sometimes
    (other fields are allowed: plugins add to usage and the like)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
    }
    if title is not None:
        schema["title"] = title
    return schema


def reply(
    description: str,
    schema: dict[str, Any],
    *,
    media_type: str = "application/json",
    events: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A documented answer: ``schema`` as ``media_type``, and server-sent ``events`` (the
    schema of one event, see :func:`event_schema`) when the route streams."""
    content = {media_type: {"schema": schema}}
    if events is not None:
        content["text/event-stream"] = {"schema": events}
    return {"description": description, "content": content}


def event_schema(
    data: dict[str, Any], *, names: list[str] | None = None, done: str | None = None
) -> dict[str, Any]:
    """One server-sent event, as a client parses it (``{"event": ..., "data": ...}``):
    its ``data`` is JSON matching ``data``, or exactly ``done`` (OpenAI's ``[DONE]``);
    ``names``: the event names it may carry (``None``: none, so ``message``)."""
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": data}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "event": {"enum": names} if names else {"const": "message"},
            "data": json_data,
        },
        "required": ["event", "data"],
    }
    if done is not None:
        schema["properties"]["data"] = STRING
        schema["if"] = {"properties": {"data": {"const": done}}}
        schema["else"] = {"properties": {"data": json_data}}
    return schema


BAD_REQUEST = (
    "the request is invalid (the error names the field); or it asks for more than the "
    "served model does, which no JSON Schema can state: code context_length_exceeded (the "
    "prompt's tokens and the generation budget do not fit the context), model_not_supported "
    "(a route for another kind of model), invalid_constraint (a grammar, regular expression "
    "or JSON schema the constraint compiler refuses, or a tool_choice naming a function "
    "that is not in tools); and two rules between numbers: min_tokens above the generation "
    "budget, and /score's text_1 and text_2 lists of different lengths (longer than one)"
)
"""The document's description of a 400, with the refusals that depend on the model."""

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error: OpenAI's shape ({error: {...}}); on Anthropic routes, "
    "Anthropic's ({type: error, error: {...}}); on Ollama routes, Ollama's ({error: message}).",
    "properties": {
        "type": {"type": "string"},
        "error": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                    },
                    "required": ["message", "type"],
                },
                {"type": "string"},
            ]
        },
    },
    "required": ["error"],
}


TOKEN_ID: dict[str, Any] = {"type": "integer", "minimum": 0, "title": "token id"}
"""A token id in a request schema: the document bounds it by the model's vocabulary."""
PROMPT_TOKEN_ID: dict[str, Any] = {**TOKEN_ID, "title": "prompt token id"}
"""A prompt's token id: bounded by the vocabulary the tokenizer and the model share."""
RULES_ATTRIBUTE = "schema_rules"
"""A body struct's class attribute (a ``ClassVar`` dict of JSON Schema keywords: ``oneOf``
with ``required``, ``if``/``then``, ``allOf`` of those) stating the rules between its
fields that the route enforces; merged into the struct's component, so the document
states every rule the server holds a request to."""

CONTEXT_TOKENS_TITLE = "tokens within the context"
"""The title of a token-id array that must fit the context (an embedding input): the
document bounds its length by the context."""
PROMPT_TOKENS_TITLE = "prompt tokens"
"""The title of a prompt's token-id array: at most the context less one token (one is
left to generate)."""

CONTEXT_TITLE = "context length"
"""The title of a field that asks for a context length (Ollama's ``num_ctx``): the
document bounds it by the served context."""

DIMENSIONS_TITLE = "embedding dimensions"
"""The title of an embedding's ``dimensions`` field: the document bounds it by the
model's hidden size."""

BUDGET_TITLE = "token budget"
"""The title of a generation budget field (``max_tokens`` and the like): the document
bounds it by the context (the prompt takes at least one token of it)."""


@attrs.frozen
class ModelLimits:
    """What the served model bounds: the document's schemas say it too, so a request the
    schema allows is one the server takes (and the reverse)."""

    vocab_size: int | None = None
    prompt_vocab: int | None = None
    context: int | None = None
    hidden_size: int | None = None


def below(n: int) -> str:
    """A regular expression for the decimal numbers 0 .. n-1 (no leading zeros)."""
    digits = str(n - 1)
    alternatives = ["0"] if n > 0 else []
    for width in range(1, len(digits)):  # every number with fewer digits
        alternatives.append("[1-9]" + "[0-9]" * (width - 1))
    for i, digit in enumerate(digits):  # as long as n-1: a smaller digit at position i
        low = "1" if i == 0 else "0"
        if int(digit) > int(low):
            top = int(digit) - 1
            rest = "[0-9]" * (len(digits) - i - 1)
            alternatives.append(digits[:i] + f"[{low}-{top}]" + rest)
    if digits != "0":
        alternatives.append(digits)
    return "^(" + "|".join(dict.fromkeys(alternatives)) + ")$"


def _limit(components: dict[str, Any], limits: ModelLimits) -> None:
    """Put the model's bounds into the request schemas (in place)."""
    vocab, hidden = limits.vocab_size, limits.hidden_size
    tops = {"token id": vocab, "prompt token id": limits.prompt_vocab, BUDGET_TITLE: limits.context}
    maxima = {title: top - 1 for title, top in tops.items() if top}
    if hidden:
        maxima[DIMENSIONS_TITLE] = hidden
    if limits.context:
        maxima[CONTEXT_TITLE] = limits.context
    _bound_marked(components, maxima)
    if limits.context:
        lengths = {CONTEXT_TOKENS_TITLE: limits.context, PROMPT_TOKENS_TITLE: limits.context - 1}
        _bound_lengths(components, lengths)
    for schema in components.values():
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        if vocab and "logit_bias" in props:
            props["logit_bias"]["propertyNames"] = {"pattern": below(vocab)}


def _bound_marked(node: Any, maxima: dict[str, int]) -> None:
    """Give every integer schema under ``node`` whose title is a key of ``maxima`` (the
    :data:`TOKEN_ID`, :data:`PROMPT_TOKEN_ID` and :data:`BUDGET_TITLE` markers) its maximum."""
    if isinstance(node, list):
        for item in node:
            _bound_marked(item, maxima)
    elif isinstance(node, dict):
        title = node.get("title")
        if node.get("type") == "integer" and isinstance(title, str) and title in maxima:
            node["maximum"] = maxima[title]
        for value in node.values():
            _bound_marked(value, maxima)


def _bound_lengths(node: Any, lengths: dict[str, int]) -> None:
    """Give every array schema under ``node`` whose title is a key of ``lengths`` (the
    :data:`CONTEXT_TOKENS_TITLE` and :data:`PROMPT_TOKENS_TITLE` markers) its
    ``maxItems``."""
    if isinstance(node, list):
        for item in node:
            _bound_lengths(item, lengths)
    elif isinstance(node, dict):
        title = node.get("title")
        if isinstance(title, str) and title in lengths and "items" in node:
            node["maxItems"] = lengths[title]
        for value in node.values():
            _bound_lengths(value, lengths)


ADMIN_EXTENSION = "x-mlxcore-admin"
"""An operation's flag in the document: an administrative route (an admin key's only)."""


def openapi_document(
    handlers: Iterable[Any], title: str = "mlxcore", limits: ModelLimits | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document for ``handlers`` (with the served model's ``limits``)."""
    routes = [
        r
        for r in http_routes(handlers)
        if r[0] != "HEAD" and getattr(r[2], "include_in_schema", True) is not False
    ]
    bodies = {h.opt.get(BODY_OPTION) for _, _, h in routes} - {None}
    order = sorted(bodies, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(
        order, ref_template="#/components/schemas/{name}"
    )
    body_refs = dict(zip(order, schemas, strict=True))
    components = copy.deepcopy(components)  # msgspec shares our constants' dicts
    for body in order:
        rules = getattr(body, RULES_ATTRIBUTE, None)
        if rules and body.__name__ in components:
            components[body.__name__].update(copy.deepcopy(rules))
    if limits is not None:
        _limit(components, limits)
    components["Error"] = ERROR_SCHEMA
    paths: dict[str, dict[str, Any]] = {}
    for method, route_path, handler in routes:
        path, parameters = _path_parameters(route_path)
        operation: dict[str, Any] = {
            "operationId": f"{handler.handler_name}_{method.lower()}",
            "summary": (handler.fn.__doc__ or "").strip().splitlines()[0]
            if handler.fn.__doc__
            else handler.handler_name,
            "responses": {
                "400": _error(BAD_REQUEST),
                "401": _error("missing or wrong API key"),
                "404": _error("unknown model or route"),
                "429": _error("over this API key's limits; retry after Retry-After seconds"),
                "503": _error("overloaded or restarting; retry after Retry-After seconds"),
            },
        }
        if handler.opt.get(ADMIN_OPTION):
            operation[ADMIN_EXTENSION] = True
            operation["responses"]["403"] = _error("an ordinary API key (not an admin one)")
        for status, why in handler.opt.get(ERRORS_OPTION, {}).items():
            operation["responses"][str(status)] = _error(why)
        for status, answer in handler.opt.get(REPLIES_OPTION, {}).items():
            operation["responses"][str(status)] = _named(answer, components)
        if "200" not in operation["responses"]:
            operation["responses"]["200"] = {"description": "OK"}
        operation["responses"] = dict(sorted(operation["responses"].items()))
        for name, schema in handler.opt.get(QUERY_OPTION, {}).items():
            parameters.append({"name": name, "in": "query", "required": False, "schema": schema})
        if parameters:
            operation["parameters"] = parameters
        body = handler.opt.get(BODY_OPTION)
        if body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body_refs[body]}},
            }
            operation["responses"]["408"] = _error("the body did not arrive in time")
            operation["responses"]["413"] = _error("the body is too large")
            operation["responses"]["415"] = _error("the body is not JSON")
        form = handler.opt.get(FORM_OPTION)
        if form is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {FORM_MEDIA: {"schema": form}},
            }
            operation["responses"]["413"] = _error("the body is too large")
            operation["responses"]["415"] = _error(f"the body is not {FORM_MEDIA}")
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


_PARAMETER = re.compile(r"\{(\w+)(?::(\w+))?\}")
_PARAMETER_TYPES = {"str": "string", "int": "integer", "float": "number", "path": "string"}


def _path_parameters(path: str) -> tuple[str, list[dict[str, Any]]]:
    """An OpenAPI path (``{name}``) and its parameters from Litestar's ``{name:type}``."""
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": _PARAMETER_TYPES.get(kind or "str", "string")},
        }
        for name, kind in _PARAMETER.findall(path)
    ]
    return _PARAMETER.sub(lambda m: "{" + m.group(1) + "}", path), parameters


def _named(answer: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """``answer`` with each named schema moved to ``components`` and referred to."""
    content = {}
    for media_type, entry in answer["content"].items():
        schema = entry["schema"]
        name = schema.get("title")
        if name is not None:
            components[name] = schema
            schema = {"$ref": f"#/components/schemas/{name}"}
        content[media_type] = {"schema": schema}
    return {**answer, "content": content}


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
            if body is not None and FORM_MEDIA in body["content"]:
                text = json.dumps(body["content"][FORM_MEDIA]["schema"], indent=2)
                parts.append(f"<p>Form ({FORM_MEDIA})</p><pre>{html.escape(text)}</pre>")
            elif body is not None:
                ref = body["content"]["application/json"]["schema"]["$ref"]
                name = ref.rsplit("/", 1)[-1]
                schema = document["components"]["schemas"][name]
                text = json.dumps(schema, indent=2)
                parts.append(f"<p>Body: <code>{name}</code></p><pre>{html.escape(text)}</pre>")
    parts.append("</body></html>")
    return "".join(parts)
