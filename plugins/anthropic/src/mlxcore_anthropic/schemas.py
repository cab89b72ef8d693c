"""Anthropic Messages request bodies as msgspec structs (unknown fields ignored)."""

from __future__ import annotations

from typing import Any

import msgspec


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]]


class Thinking(msgspec.Struct, kw_only=True):
    type: str = "disabled"
    budget_tokens: int | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: str = "auto"
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    type: str | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: list[Message]
    max_tokens: int
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    messages: list[Message]
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    thinking: Thinking | None = None
