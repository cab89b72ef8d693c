"""Shared cases for checking constrained tool calls on random-weight test models.

Used by ``scripts/tool_call_grammar.py`` (100 requests per parser family) and the test
suite (a few): one test model per tool-call format, three tools with nested schemas,
and a check that every call in a response names an offered tool with arguments valid
for its schema.

The schemas bound every string, number and array: a random-weight model at
temperature 1.0 picks among ~150K tokens inside a string, so an unbounded string would
only end at ``max_tokens``; a trained model ends it itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema


@dataclass(frozen=True)
class Family:
    """One tool-call format and the test model that writes it."""

    parser: str
    arch: str
    plugins: tuple[str, ...]
    opener: str
    """The call opener (one special token in each of these tokenizers)."""


FAMILIES: dict[str, Family] = {
    f.parser: f
    for f in (
        Family("hermes", "qwen3", (), "<tool_call>"),
        Family("qwen3_coder", "qwen3_5", (), "<tool_call>"),
        Family("gemma4", "gemma4_text", ("gemma4",), "<|tool_call>"),
        Family("minimax_m2", "minimax", ("minimax",), "<minimax:tool_call>"),
    )
}
"""Every built-in and bundled tool parser with a call grammar, by parser name."""


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS: list[dict[str, Any]] = [
    _function(
        "get_weather",
        "The weather in a city",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit"],
        },
    ),
    _function(
        "search_files",
        "Search the workspace",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 16},
                "paths": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 10},
                    "maxItems": 3,
                },
                "options": {
                    "type": "object",
                    "properties": {
                        "case_sensitive": {"type": "boolean"},
                        "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
                    },
                    "required": ["case_sensitive"],
                },
            },
            "required": ["query", "options"],
        },
    ),
    _function(
        "create_event",
        "Create a calendar event",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 20},
                "attendees": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 10},
                            "role": {"enum": ["host", "guest"]},
                        },
                        "required": ["name", "role"],
                    },
                },
                "priority": {"type": "string", "enum": ["low", "high"]},
            },
            "required": ["title", "attendees", "priority"],
        },
    ),
]
"""Three tools with enums, arrays, a nested object and required fields."""

MESSAGES = [{"role": "user", "content": "Plan my trip: weather in Paris, then a meeting."}]


@dataclass
class CallCheck:
    """What one response's tool calls were."""

    whole: int = 0
    """Calls that named an offered tool with arguments valid for its schema."""
    invalid: list[str] | None = None
    """Why each other call failed (empty when all were valid)."""


def check_calls(
    calls: Sequence[tuple[str, str]], tools: Sequence[Mapping[str, Any]] = TOOLS
) -> CallCheck:
    """Check ``(name, arguments JSON)`` pairs against ``tools``."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    out = CallCheck(invalid=[])
    assert out.invalid is not None
    for name, arguments in calls:
        if name not in schemas:
            out.invalid.append(f"unknown function {name!r}")
            continue
        try:
            value = json.loads(arguments)
            jsonschema.validate(value, schemas[name])
        except (ValueError, jsonschema.ValidationError) as exc:
            out.invalid.append(f"{name}({arguments}): {str(exc).splitlines()[0]}")
            continue
        out.whole += 1
    return out
