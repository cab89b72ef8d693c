"""OpenAI request bodies as msgspec structs (decoded strictly, unknown fields ignored)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from mlxcore.engine.validation import MAX_STOP_CHARS, MAX_STOPS, MAX_TOP_LOGPROBS
from mlxcore.server.openapi import (
    BUDGET_TITLE,
    PROMPT_TOKEN_ID,
    PROMPT_TOKENS_TITLE,
    given,
    implies,
)


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


TEXT_PART: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"enum": ["text", "input_text", "output_text"]},
        "text": {"type": "string"},
    },
    "required": ["type", "text"],
}
"""A text content part (a media plugin's parts are accepted where the model takes them)."""
NAME: dict[str, Any] = {"type": "string", "minLength": 1}

TOOL_CALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": ["string", "null"]},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": NAME,
                "arguments": {"anyOf": [{"type": "string"}, {"type": "object"}]},
            },
            "required": ["name"],
        },
    },
    "required": ["function"],
}

FUNCTION_TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": NAME,
                "description": {"type": ["string", "null"]},
                "parameters": {"type": ["object", "null"]},
            },
            "required": ["name"],
        },
    },
    "required": ["function"],
}

NAMED_CHOICE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {"type": "object", "properties": {"name": NAME}, "required": ["name"]},
    },
    "required": ["function"],
}
"""A ``tool_choice`` that names its function (which must be one of ``tools``)."""

NEEDS_TOOLS = implies(
    given("tool_choice", {"anyOf": [{"const": "required"}, {"type": "object"}]}),
    given("tools", {"minItems": 1}),
)
"""A rule: ``tool_choice`` ``required`` or a named function needs ``tools``."""

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


def _items(schema: dict[str, Any]) -> msgspec.Meta:
    """Constrain the array members of a field whose type is a union (JSON Schema's
    ``items`` applies to arrays only): msgspec keeps a field's extra schema only at the
    field's own level."""
    return msgspec.Meta(extra_json_schema={"items": schema})


class Message(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Role
    content: Annotated[str | list[dict[str, Any]] | None, _items(TEXT_PART)] = None
    name: str | None = None
    tool_calls: Annotated[list[dict[str, Any]] | None, _items(TOOL_CALL)] = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


def _range(low: float, high: float) -> Any:
    return msgspec.Meta(ge=low, le=high)


MAX_N = 16
"""The most choices (``n``) one request asks for."""

Stop = Annotated[str, msgspec.Meta(max_length=MAX_STOP_CHARS)]
Stops = Stop | Annotated[list[Stop], msgspec.Meta(max_length=MAX_STOPS)]
Tokens = Annotated[int, msgspec.Meta(ge=1, title=BUDGET_TITLE)]
"""A generation budget: at least one token (the model's context bounds it too)."""


MAX_CACHE_SALT = 128
"""The longest ``cache_salt``, in characters."""
CacheSalt = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CACHE_SALT)]
"""vLLM's ``cache_salt``: a non-empty string (see :mod:`mlxcore.engine.cache_partition`)."""

SEED = msgspec.Meta(extra_json_schema={"minimum": -(2**63), "maximum": 2**64 - 1})
"""A seed has 64 bits, signed or not (in the schema only: msgspec's own bounds stop at
int64; the request converter checks it)."""


class SamplerFields(msgspec.Struct, kw_only=True):
    """Sampling fields shared by chat, text completions and the Responses API (the ranges
    the server enforces are part of the schema)."""

    temperature: Annotated[float, _range(0.0, 2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    min_p: Annotated[float, _range(0.0, 1.0)] | None = None
    repetition_penalty: Annotated[float, _range(0.01, 10.0)] | None = None
    presence_penalty: Annotated[float, _range(-2.0, 2.0)] | None = None
    frequency_penalty: Annotated[float, _range(-2.0, 2.0)] | None = None
    logit_bias: dict[str, Annotated[float, _range(-100.0, 100.0)]] | None = None
    seed: Annotated[int, SEED] | None = None
    n: Annotated[int, _range(1, MAX_N)] = 1
    priority: Annotated[int, _range(-(2**31), 2**31 - 1)] | None = None
    """vLLM's: where the request queues (lower starts first; see docs/generation-controls.md)."""
    cache_salt: CacheSalt | None = None
    """vLLM's: the request reuses only cached prefixes computed with the same salt (and,
    on a server with keys, by the same key or cache group)."""


class SamplingFields(SamplerFields, kw_only=True):
    """Fields shared by chat and text completions (with vLLM's generation extras)."""

    model: str | None = None
    min_tokens: Annotated[int, msgspec.Meta(ge=0, title=BUDGET_TITLE)] = 0
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, msgspec.Meta(ge=0, title="token id")]] | None = None
    max_tokens: Tokens | None = None
    stop: Stops | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_logprobs: Annotated[int, _range(0, MAX_TOP_LOGPROBS)] | None = None
    """vLLM's: every prompt token's logprob, with this many alternatives."""
    # vLLM's user grammars (see mlxcore.structured.requested)
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    guided_choice: (
        Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
        | None
    ) = None
    guided_grammar: Annotated[str, msgspec.Meta(min_length=1)] | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    schema_rules: ClassVar[dict[str, Any]] = {
        "allOf": [
            NEEDS_TOOLS,
            implies(given("top_logprobs", {"minimum": 1}), given("logprobs", {"const": True})),
        ]
    }
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_completion_tokens: Tokens | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, _range(0, MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[dict[str, Any]] | None, _items(FUNCTION_TOOL)] = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | dict[str, Any] | None,
        msgspec.Meta(
            extra_json_schema={"allOf": [{"anyOf": [{"type": ["string", "null"]}, NAMED_CHOICE]}]}
        ),
    ] = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # thinking budgets: vLLM's name, Rapid-MLX's, oMLX's; OpenAI's effort (mlxcore.thinking)
    thinking_token_budget: Annotated[int, msgspec.Meta(ge=0)] | None = None
    reasoning_max_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    thinking_budget: Annotated[int, msgspec.Meta(ge=0)] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None


MAX_PROMPTS = 128
"""Most prompts one text completion request may batch."""


class CompletionRequest(SamplingFields, kw_only=True):
    # msgspec allows one array type per union: the element types are checked in
    # completions (token ids, strings, or lists of token ids).
    prompt: Annotated[
        Annotated[str, msgspec.Meta(min_length=1)]
        | Annotated[list[Any], msgspec.Meta(min_length=1)],
        # one prompt's token ids, or prompts as strings or as token-id lists
        msgspec.Meta(extra_json_schema={"allOf": [{"anyOf": [
            {"items": PROMPT_TOKEN_ID, "title": PROMPT_TOKENS_TITLE},
            {"maxItems": MAX_PROMPTS, "items": {"type": "string", "minLength": 1}},
            {"maxItems": MAX_PROMPTS,
             "items": {"type": "array", "minItems": 1, "items": PROMPT_TOKEN_ID,
                       "title": PROMPT_TOKENS_TITLE}},
        ]}]}),
    ]  # fmt: skip
    logprobs: Annotated[int, _range(0, MAX_TOP_LOGPROBS)] | None = None
    echo: bool = False
    suffix: Annotated[str, msgspec.Meta(max_length=0)] | None = None  # not supported
    response_format: dict[str, Any] | None = None
