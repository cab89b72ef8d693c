"""Decoding the Hermes / Qwen JSON call format.

Inside ``<tool_call>...</tool_call>`` (official templates Qwen-Qwen2.5-7B-Instruct
and Qwen-Qwen3-0.6B)::

    {"name": "get_weather", "arguments": {"city": "Paris"}}

Accepted variations: ``arguments`` given as a JSON string, ``parameters`` for
``arguments``, missing arguments (``{}``), an OpenAI-style
``{"function": {...}}`` wrapper, a JSON list of calls, and several objects in a
row inside one block.
"""

from __future__ import annotations

import json
from typing import Any

from mlxcore.parsers.degraded import json_arguments

_DECODER = json.JSONDecoder(strict=False)


def decode_json_calls(body: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls in one block body: ``[(name, arguments)]``, or ``None`` if malformed."""
    values = _json_values(body.strip())
    if not values:
        return None
    calls: list[tuple[str, dict[str, Any]]] = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call = _one_call(item)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def _json_values(text: str) -> list[Any] | None:
    """One JSON value, or several written one after another (spaces, commas between)."""
    values: list[Any] = []
    pos = 0
    while pos < len(text):
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)
        while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
            pos += 1
    return values


def _one_call(item: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict) and "name" not in item:
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    args = json_arguments(item.get("arguments", item.get("parameters")))
    if args is None:
        return None
    return name.strip(), args
