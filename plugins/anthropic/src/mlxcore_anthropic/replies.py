"""What the Messages routes answer, as JSON Schemas for the OpenAPI document (the bodies
built in :mod:`mlxcore_anthropic.encode` and :mod:`mlxcore_anthropic.routes`)."""

from __future__ import annotations

from mlxcore.server.openapi import (
    ERROR_SCHEMA,
    INTEGER,
    OBJECT,
    STRING,
    array,
    const,
    event_schema,
    nullable,
    obj,
)

STOP_REASON = {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}
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
        "stop_reason": STOP_REASON,
        "stop_sequence": nullable(STRING),
        "usage": USAGE,
    },
    title="AnthropicMessage",
)
"""A complete message (``stream`` false)."""
TOKEN_COUNT = obj({"input_tokens": INTEGER}, title="AnthropicTokenCount")
"""What ``count_tokens`` answers."""

_DELTA = {
    "anyOf": [
        obj({"type": const("text_delta"), "text": STRING}),
        obj({"type": const("thinking_delta"), "thinking": STRING}),
        obj({"type": const("signature_delta"), "signature": STRING}),
        obj({"type": const("input_json_delta"), "partial_json": STRING}),
    ]
}
_START = obj(
    {
        "id": STRING,
        "type": const("message"),
        "role": const("assistant"),
        "model": STRING,
        "content": array(CONTENT_BLOCK),
        "stop_reason": {"type": "null"},
        "stop_sequence": {"type": "null"},
        "usage": USAGE,
    }
)
_EVENT_DATA = [
    obj({"type": const("message_start"), "message": _START}),
    obj({"type": const("ping")}),
    obj({"type": const("content_block_start"), "index": INTEGER, "content_block": CONTENT_BLOCK}),
    obj({"type": const("content_block_delta"), "index": INTEGER, "delta": _DELTA}),
    obj({"type": const("content_block_stop"), "index": INTEGER}),
    obj(
        {
            "type": const("message_delta"),
            "delta": obj({"stop_reason": STOP_REASON, "stop_sequence": nullable(STRING)}),
            "usage": USAGE,
        }
    ),
    obj({"type": const("message_stop")}),
    {**ERROR_SCHEMA, "properties": {**ERROR_SCHEMA["properties"], "type": const("error")}},
]
EVENTS = event_schema(
    {"anyOf": _EVENT_DATA},
    names=[d["properties"]["type"]["const"] for d in _EVENT_DATA],
)
"""One event of a streamed message (each event's name is its data's ``type``)."""
