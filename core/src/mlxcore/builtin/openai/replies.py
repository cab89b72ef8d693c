"""What the OpenAI routes answer, as JSON Schemas for the OpenAPI document.

They describe the bodies built in :mod:`encode`, :mod:`chat`, :mod:`completions` and
:mod:`embeddings`: every field those always write is required, a field written only
sometimes is optional, and other fields are allowed (plugins add to ``usage``).
``tests/e2e/test_openapi_answers.py`` checks real answers against them.
"""

from __future__ import annotations

from typing import Any

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
    {
        "prompt_tokens_details": obj({"cached_tokens": INTEGER}),
        "completion_tokens_details": obj({"reasoning_tokens": INTEGER}),
    },
)
_FUNCTION = {"name": STRING, "arguments": STRING}
TOOL_CALL = obj(
    {"index": INTEGER, "id": STRING, "type": const("function"), "function": obj(_FUNCTION)}
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
COMPLETION_LOGPROBS = obj(
    {
        "tokens": array(STRING),
        "token_logprobs": array(nullable(NUMBER)),  # null: an echoed prompt's first token
        "top_logprobs": array(nullable({"type": "object", "additionalProperties": NUMBER})),
        "text_offset": array(INTEGER),
    }
)


def _completion(
    kind: str, choice: dict[str, Any], *, chunk: bool, title: str | None = None
) -> dict[str, Any]:
    """A completion of ``kind`` (``object``) with its ``choice`` fields; a streamed chunk
    (``chunk``) has a finish reason only at the end and usage only when asked for."""
    finish = nullable(FINISH_REASON) if chunk else FINISH_REASON
    head = {
        "id": STRING,
        "object": const(kind),
        "created": INTEGER,
        "model": STRING,
        "choices": array(obj({"index": INTEGER, **choice, "finish_reason": finish})),
    }
    if chunk:
        return obj(head, {"usage": USAGE}, title=title)
    return obj({**head, "usage": USAGE}, title=title)


_MESSAGE = obj(
    {"role": const("assistant"), "content": nullable(STRING)},
    {"reasoning_content": STRING, "tool_calls": array(TOOL_CALL)},
)
_DELTA = obj(
    {},
    {
        "role": const("assistant"),
        "content": STRING,
        "reasoning_content": STRING,
        "tool_calls": array(
            obj(
                {"index": INTEGER},
                {"id": STRING, "type": const("function"), "function": obj({}, _FUNCTION)},
            )
        ),
    },
)
_CHAT_LOGPROBS = {"logprobs": nullable(CHAT_LOGPROBS)}
CHAT_COMPLETION = _completion(
    "chat.completion", {"message": _MESSAGE, **_CHAT_LOGPROBS}, chunk=False, title="ChatCompletion"
)
"""A chat completion (``stream`` false)."""
CHAT_EVENTS = event_schema(
    {
        "anyOf": [
            _completion("chat.completion.chunk", {"delta": _DELTA, **_CHAT_LOGPROBS}, chunk=True),
            ERROR_SCHEMA,
        ]
    },
    done="[DONE]",
)
"""One event of a streamed chat completion: a chunk, an error, or ``[DONE]``."""

_TEXT = {"text": STRING, "logprobs": nullable(COMPLETION_LOGPROBS)}
TEXT_COMPLETION = _completion("text_completion", _TEXT, chunk=False, title="TextCompletion")
"""A text completion (``stream`` false)."""
TEXT_EVENTS = event_schema(
    {"anyOf": [_completion("text_completion", _TEXT, chunk=True), ERROR_SCHEMA]}, done="[DONE]"
)
"""One event of a streamed text completion."""

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
