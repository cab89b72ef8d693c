"""Responses API request bodies as msgspec structs (unknown fields ignored).

Items inside ``input`` stay plain mappings: their shapes vary by ``type`` and are
checked one by one, each error naming its place (``input[3].call_id``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from mlxcore.builtin.openai.schemas import NAME, TEXT_PART, SamplerFields, Tokens
from mlxcore.server.openapi import given, implies


class TextConfig(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


INPUT_ITEM: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]},
            },
            "required": ["role", "content"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call"},
                "name": NAME,
                "call_id": NAME,
                "arguments": {"type": "string"},
            },
            "required": ["type", "name", "call_id"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "function_call_output"}, "call_id": NAME},
            "required": ["type", "call_id"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "reasoning"}, "summary": {"type": "array"}},
            "required": ["type"],
        },
    ]
}
"""The input items the server reads (a media plugin adds image parts where it serves)."""
NOT_REASONING: dict[str, Any] = {
    "not": {"type": "object", "properties": {"type": {"const": "reasoning"}}, "required": ["type"]}
}
"""An input item other than a reasoning item: an input needs at least one."""


FUNCTION_TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "name": NAME,
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]},
    },
    "required": ["name"],
}
OTHER_TOOL: dict[str, Any] = {  # other kinds (web search, ...) are skipped with a warning
    "type": "object",
    "properties": {"type": {"type": "string", "not": {"enum": ["function", "namespace"]}}},
    "required": ["type"],
}
TOOL: dict[str, Any] = {
    "anyOf": [
        FUNCTION_TOOL,
        {
            "type": "object",
            "properties": {
                "type": {"const": "namespace"},
                "tools": {"type": "array", "items": {"anyOf": [FUNCTION_TOOL, OTHER_TOOL]}},
            },
            "required": ["type", "tools"],
        },
        OTHER_TOOL,
    ]
}
"""A tool as the server reads it: functions, namespaces of functions, kinds it skips."""


class ResponsesRequest(SamplerFields, kw_only=True):
    schema_rules: ClassVar[dict[str, Any]] = implies(
        given("tool_choice", {"anyOf": [
            {"const": "required"},
            {"properties": {"type": {"const": "function"}}, "required": ["type"]},
            {"properties": {"mode": {"const": "required"}}, "required": ["mode"]},
        ]}),
        given("tools", {"minItems": 1}),
    )  # fmt: skip
    """``tool_choice`` ``required``, a named function or ``allowed_tools`` in ``required``
    mode needs ``tools``."""
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1  # not a Responses field: one output
    model: str | None = None
    input: Annotated[
        Annotated[str, msgspec.Meta(min_length=1)]
        | Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1)],
        msgspec.Meta(extra_json_schema={"items": INPUT_ITEM, "contains": NOT_REASONING}),
    ]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Annotated[
        list[dict[str, Any]] | None, msgspec.Meta(extra_json_schema={"items": TOOL})
    ] = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | dict[str, Any] | None,
        msgspec.Meta(extra_json_schema={"allOf": [{"anyOf": [
            {"type": ["string", "null"]},
            {"type": "object", "properties": {"type": {"const": "function"}, "name": NAME},
             "required": ["type", "name"]},
            {"type": "object", "properties": {"type": {"const": "allowed_tools"},
             "mode": {"enum": ["none", "auto", "required"]}}, "required": ["type"]},
        ]}]}),
    ] = None  # fmt: skip
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Tokens | None = None
    truncation: str | None = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    store: bool = True
    stream: bool = False
    background: Annotated[bool, msgspec.Meta(extra_json_schema={"const": False})] = (
        False  # unsupported
    )
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    client_metadata: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
