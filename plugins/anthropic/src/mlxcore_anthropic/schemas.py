"""Anthropic Messages request bodies as msgspec structs (unknown fields ignored)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from mlxcore.builtin.openai.schemas import CacheSalt
from mlxcore.server.openapi import given, implies

_TEXT = {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
         "required": ["type", "text"]}  # fmt: skip
_TOOL_USE = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_use"},
        "name": {"type": "string", "minLength": 1},
        "input": {"type": "object"},
    },
    "required": ["type", "name"],
}
_TOOL_RESULT = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string"},
        "content": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT}, {"type": "null"}]
        },
    },
    "required": ["type", "tool_use_id"],
}
_THINKING = {
    "type": "object",
    "properties": {"type": {"enum": ["thinking", "redacted_thinking"]}},
    "required": ["type"],
}


def _turn(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    items = {"anyOf": list(blocks)} if len(blocks) > 1 else blocks[0]
    return {
        "type": "object",
        "properties": {
            "role": {"const": role},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": items}]},
        },
        "required": ["role", "content"],
    }


MESSAGE: dict[str, Any] = {
    "anyOf": [
        _turn("user", _TEXT, _TOOL_RESULT),
        _turn("assistant", _TEXT, _TOOL_USE, _THINKING),
        _turn("system", _TEXT),
    ]
}
"""A message as the server reads it: the blocks each role may hold (a media plugin adds
image blocks to user turns for the models that take them)."""


class Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class Thinking(msgspec.Struct, kw_only=True):
    type: str = "disabled"
    budget_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Held as a thinking budget when thinking is enabled (mlxcore.thinking)."""


_TOOL_CHOICE = {
    "allOf": [{"anyOf": [
        {"type": "null"},
        {
            "properties": {"type": {"const": "tool"}, "name": {"type": "string", "minLength": 1}},
            "required": ["type", "name"],
        },
        {"properties": {"type": {"enum": ["auto", "any", "none"]}}},
        {"not": {"required": ["type"]}},  # auto
    ]}]
}  # fmt: skip
"""A ``tool`` choice names its tool."""


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"] = "auto"
    name: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    disable_parallel_tool_use: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    type: str | None = None


NonEmptyMessages = Annotated[
    list[Annotated[Message, msgspec.Meta(extra_json_schema=MESSAGE)]], msgspec.Meta(min_length=1)
]


System = Annotated[
    str | list[dict[str, Any]] | None, msgspec.Meta(extra_json_schema={"items": _TEXT})
]
"""A system prompt: a string or text blocks."""


class MessagesRequest(msgspec.Struct, kw_only=True):
    schema_rules: ClassVar[dict[str, Any]] = implies(
        given("tool_choice", {"properties": {"type": {"enum": ["any", "tool"]}},
                              "required": ["type"]}),
        given("tools", {"minItems": 1}),
    )  # fmt: skip
    """``tool_choice`` ``any`` or ``tool`` needs ``tools``."""
    model: str | None = None
    messages: NonEmptyMessages
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]  # a cap: beyond the context it is the context
    system: System = None
    stop_sequences: (
        Annotated[list[Annotated[str, msgspec.Meta(max_length=1024)]], msgspec.Meta(max_length=16)]
        | None
    ) = None
    stream: bool = False
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Annotated[ToolChoice | None, msgspec.Meta(extra_json_schema=_TOOL_CHOICE)] = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None
    cache_salt: CacheSalt | None = None
    """vLLM's ``cache_salt`` (mlxcore's extension here): cached prefixes are reused only
    under the same salt."""


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: NonEmptyMessages
    system: System = None
    tools: list[Tool] | None = None
    thinking: Thinking | None = None
