"""What the OpenAI routes answer, as JSON Schemas for the OpenAPI document.

They describe the bodies built in :mod:`encode`, :mod:`chat`, :mod:`completions` and
:mod:`embeddings`: every field those always write is required, a field written only
sometimes is optional, and other fields are allowed (plugins add to ``usage``).
``tests/e2e/test_openapi_contract.py`` checks real answers against them.
"""

from __future__ import annotations

from mlxcore.server.openapi import (
    ERROR_SCHEMA,
    INTEGER,
    NUMBER,
    STRING,
    array,
    const,
    event_schema,
    nullable,
    obj,
)

FINISH_REASON = {"enum": ["stop", "length", "tool_calls", "cancelled"]}
USAGE = obj(
    {"prompt_tokens": INTEGER, "completion_tokens": INTEGER, "total_tokens": INTEGER},
    {"prompt_tokens_details": obj({"cached_tokens": INTEGER})},
)
TOOL_CALL = obj(
    {
        "index": INTEGER,
        "id": STRING,
        "type": const("function"),
        "function": obj({"name": STRING, "arguments": STRING}),
    }
)
_BYTES = array(INTEGER)
_TOP = obj({"token": STRING, "logprob": NUMBER, "bytes": _BYTES})
CHAT_LOGPROBS = obj(
    {
        "content": array(
            obj({"token": STRING, "logprob": NUMBER, "bytes": _BYTES, "top_logprobs": array(_TOP)})
        )
    }
)
CHAT_COMPLETION = obj(
    {
        "id": STRING,
        "object": const("chat.completion"),
        "created": INTEGER,
        "model": STRING,
        "choices": array(
            obj(
                {
                    "index": INTEGER,
                    "message": obj(
                        {"role": const("assistant"), "content": nullable(STRING)},
                        {"reasoning_content": STRING, "tool_calls": array(TOOL_CALL)},
                    ),
                    "logprobs": nullable(CHAT_LOGPROBS),
                    "finish_reason": FINISH_REASON,
                }
            )
        ),
        "usage": USAGE,
    },
    title="ChatCompletion",
)
"""A chat completion (``stream`` false)."""

COMPLETION_LOGPROBS = obj(
    {
        "tokens": array(STRING),
        "token_logprobs": array(NUMBER),
        "top_logprobs": array({"type": "object", "additionalProperties": NUMBER}),
        "text_offset": array(INTEGER),
    }
)
TEXT_COMPLETION = obj(
    {
        "id": STRING,
        "object": const("text_completion"),
        "created": INTEGER,
        "model": STRING,
        "choices": array(
            obj(
                {
                    "index": INTEGER,
                    "text": STRING,
                    "logprobs": nullable(COMPLETION_LOGPROBS),
                    "finish_reason": FINISH_REASON,
                }
            )
        ),
        "usage": USAGE,
    },
    title="TextCompletion",
)
"""A text completion (``stream`` false)."""

EMBEDDING_LIST = obj(
    {
        "object": const("list"),
        "data": array(
            obj(
                {
                    "object": const("embedding"),
                    "index": INTEGER,
                    # a list of floats, or base64 of little-endian float32 (encoding_format)
                    "embedding": {"anyOf": [array(NUMBER), STRING]},
                }
            )
        ),
        "model": STRING,
        "usage": obj({"prompt_tokens": INTEGER, "total_tokens": INTEGER}),
    },
    title="EmbeddingList",
)
"""What ``/v1/embeddings`` answers."""

_CHUNK_TOOL_CALL = obj(
    {"index": INTEGER},
    {
        "id": STRING,
        "type": const("function"),
        "function": obj({}, {"name": STRING, "arguments": STRING}),
    },
)
CHAT_CHUNK = obj(
    {
        "id": STRING,
        "object": const("chat.completion.chunk"),
        "created": INTEGER,
        "model": STRING,
        "choices": array(
            obj(
                {
                    "index": INTEGER,
                    "delta": obj(
                        {},
                        {
                            "role": const("assistant"),
                            "content": STRING,
                            "reasoning_content": STRING,
                            "tool_calls": array(_CHUNK_TOOL_CALL),
                        },
                    ),
                    "logprobs": nullable(CHAT_LOGPROBS),
                    "finish_reason": nullable(FINISH_REASON),
                }
            )
        ),
    },
    {"usage": USAGE},
)
CHAT_EVENTS = event_schema({"anyOf": [CHAT_CHUNK, ERROR_SCHEMA]}, done="[DONE]")
"""One event of a streamed chat completion: a chunk, an error, or ``[DONE]``."""
TEXT_CHUNK = obj(
    {
        "id": STRING,
        "object": const("text_completion"),
        "created": INTEGER,
        "model": STRING,
        "choices": array(
            obj(
                {
                    "index": INTEGER,
                    "text": STRING,
                    "logprobs": nullable(COMPLETION_LOGPROBS),
                    "finish_reason": nullable(FINISH_REASON),
                }
            )
        ),
    },
    {"usage": USAGE},
)
TEXT_EVENTS = event_schema({"anyOf": [TEXT_CHUNK, ERROR_SCHEMA]}, done="[DONE]")
"""One event of a streamed text completion."""
