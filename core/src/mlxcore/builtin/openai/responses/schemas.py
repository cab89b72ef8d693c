"""Responses API request bodies as msgspec structs (unknown fields ignored).

Items inside ``input`` stay plain mappings: their shapes vary by ``type`` and are
checked one by one, each error naming its place (``input[3].call_id``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from mlxcore.builtin.openai.schemas import SamplerFields


class TextConfig(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(SamplerFields, kw_only=True):
    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    truncation: str | None = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    client_metadata: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
