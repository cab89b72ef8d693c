"""What the Messages routes answer, as JSON Schemas for the OpenAPI document (the bodies
built in :mod:`mlxcore_anthropic.encode` and :mod:`mlxcore_anthropic.routes`)."""

from __future__ import annotations

from mlxcore.server.openapi import INTEGER, OBJECT, STRING, array, const, nullable, obj

CONTENT_BLOCK = {
    "anyOf": [
        obj({"type": const("text"), "text": STRING}),
        obj({"type": const("thinking"), "thinking": STRING, "signature": STRING}),
        obj({"type": const("tool_use"), "id": STRING, "name": STRING, "input": OBJECT}),
    ]
}
"""One block of a message's ``content``."""
USAGE = obj(
    {
        "input_tokens": INTEGER,
        "output_tokens": INTEGER,
        "cache_read_input_tokens": INTEGER,
        "cache_creation_input_tokens": INTEGER,
    }
)
MESSAGE = obj(
    {
        "id": STRING,
        "type": const("message"),
        "role": const("assistant"),
        "model": STRING,
        "content": array(CONTENT_BLOCK),
        "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
        "stop_sequence": nullable(STRING),
        "usage": USAGE,
    },
    title="AnthropicMessage",
)
"""A complete message (``stream`` false)."""
TOKEN_COUNT = obj({"input_tokens": INTEGER}, title="AnthropicTokenCount")
"""What ``count_tokens`` answers."""
