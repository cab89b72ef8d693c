"""Typing tool-call arguments from the request's JSON schema.

XML-style formats (Qwen3-Coder, MiniMax-M2) write every argument as text;
JSON-style formats sometimes quote a number or a boolean. The request's tool
definitions say what each parameter is, so:

* :func:`coerce_text` turns the text of one argument into the value its schema
  asks for (``integer``, ``number``, ``boolean``, ``null``, ``object``,
  ``array``, ``string``; ``type`` lists, ``enum``, ``anyOf``/``oneOf``/``allOf``
  are unions). Text that fits none of the types stays a string: nothing is
  lost, and the client sees what the model wrote.
* :func:`conform_arguments` fixes already-parsed arguments: a *string* where the
  schema does not allow a string is converted when it can be; every other value
  is kept as the model wrote it.

Rules that differ from a naive ``json.loads``: ``"null"`` stays a string when
the schema allows only strings; ``"1.0"`` is the integer ``1`` for an integer
parameter but ``"1.5"`` is not an integer; NaN and infinities are never numbers
(they are not JSON); a parameter the schema does not list stays a string.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_INT = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NULL = {"null", "none", "nil"}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
_ALIASES = {
    "int": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "str": "string",
    "text": "string",
    "dict": "object",
    "list": "array",
}
_MISS = object()


def parameters_of(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    """The ``properties`` of tool ``name``'s parameters (empty if unknown)."""
    for tool in tools:
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters")
            if isinstance(params, Mapping) and isinstance(params.get("properties"), Mapping):
                return params["properties"]
            return {}
    return {}


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema allows, in a fixed order (empty: no type information)."""
    found: set[str] = set()
    _collect(schema, found, depth=0)
    return [t for t in _ORDER if t in found]


def _collect(schema: Any, found: set[str], depth: int) -> None:
    if not isinstance(schema, Mapping) or depth > 8:
        return
    kind = schema.get("type")
    for t in kind if isinstance(kind, list) else [kind]:
        if isinstance(t, str):
            t = t.strip().lower()
            found.add(_ALIASES.get(t, t))
    if isinstance(schema.get("enum"), list):
        for value in schema["enum"]:
            found.add(_json_type(value))
    if "const" in schema:
        found.add(_json_type(schema["const"]))
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for sub in schema[key]:
                _collect(sub, found, depth + 1)
    if not kind and "properties" in schema:
        found.add("object")
    if not kind and "items" in schema:
        found.add("array")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def coerce_text(text: str, schema: Any) -> Any:
    """The value of one argument written as ``text``, typed by its ``schema``.

    ``schema`` ``None`` (a parameter the tool does not declare) keeps the text.
    A schema without type information parses JSON objects and arrays only.
    """
    if schema is None:
        return text
    types = schema_types(schema)
    if not types:
        value = _as_container(text.strip(), ("object", "array"))
        return text if value is _MISS else value
    stripped = text.strip()
    if stripped.lower() in _NULL and ("null" in types or "string" not in types):
        return None
    for kind in types:
        value = _convert(stripped, kind)
        if value is not _MISS:
            return value
    return text


def _convert(text: str, kind: str) -> Any:
    if kind == "string":
        return _MISS  # handled by the caller's fallback, which keeps the exact text
    if kind == "boolean":
        low = text.lower()
        return True if low in _TRUE else False if low in _FALSE else _MISS
    if kind == "integer":
        if _INT.fullmatch(text):
            return int(text)
        number = _number(text)
        if isinstance(number, float) and number.is_integer():
            return int(number)
        return _MISS
    if kind == "number":
        if _INT.fullmatch(text):
            return int(text)
        return _number(text)
    if kind in ("object", "array"):
        return _as_container(text, (kind,))
    return _MISS


def _number(text: str) -> Any:
    if not _NUMBER.fullmatch(text):
        return _MISS
    value = float(text)
    return value if math.isfinite(value) else _MISS


def _as_container(text: str, kinds: tuple[str, ...]) -> Any:
    if not text or text[0] not in "[{":
        return _MISS
    try:
        value = json.loads(text, strict=False)
    except ValueError:
        try:  # Python literals: single quotes, True/False/None
            value = ast.literal_eval(text)
            json.dumps(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return _MISS
    if isinstance(value, dict) and "object" in kinds:
        return value
    if isinstance(value, list | tuple) and "array" in kinds:
        return list(value)
    return _MISS


def conform_value(value: Any, schema: Any) -> Any:
    """``value`` (already parsed) made to fit ``schema`` where that is unambiguous.

    Only strings are converted, and only when the schema does not allow a
    string; objects and arrays are walked with ``properties`` / ``items``.
    """
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, str):
        types = schema_types(schema)
        if types and "string" not in types:
            return coerce_text(value, schema)
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, Mapping):
            return conform_arguments(value, props)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [conform_value(v, schema["items"]) for v in value]
    return value


def conform_arguments(arguments: dict[str, Any], properties: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument passed through :func:`conform_value` with its property schema."""
    if not properties:
        return arguments
    return {k: conform_value(v, properties.get(k)) for k, v in arguments.items()}


def coerce_arguments(raw: Mapping[str, str], properties: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments written as text (XML formats), each typed with :func:`coerce_text`."""
    return {k: coerce_text(v, properties.get(k)) for k, v in raw.items()}
