"""OpenAI request bodies as msgspec structs (decoded strictly, unknown fields ignored)."""

from __future__ import annotations

from typing import Any

import msgspec


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


class Message(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class SamplerFields(msgspec.Struct, kw_only=True):
    """Sampling fields shared by chat, text completions and the Responses API."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    n: int = 1


class SamplingFields(SamplerFields, kw_only=True):
    """Fields shared by chat and text completions (with vLLM's generation extras)."""

    model: str | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    # msgspec allows one array type per union: the element types are checked in
    # completions (one string, or token ids).
    prompt: str | list[str | int]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    response_format: dict[str, Any] | None = None
