"""What the Responses API routes answer, as JSON Schemas for the OpenAPI document (the
bodies built by ``routes.base_response`` / ``routes._final`` and the output writer)."""

from __future__ import annotations

from mlxcore.server.openapi import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    array,
    const,
    event_schema,
    nullable,
    obj,
)

_TEXT = obj({"type": const("output_text"), "text": STRING}, {"annotations": array(OBJECT)})
_REASONING_TEXT = obj({"type": const("reasoning_text"), "text": STRING})
OUTPUT_ITEM = {
    "anyOf": [
        obj(
            {
                "type": const("message"),
                "id": STRING,
                "status": STRING,
                "role": const("assistant"),
                "content": array(_TEXT),
            }
        ),
        obj(
            {
                "type": const("function_call"),
                "id": STRING,
                "call_id": STRING,
                "name": STRING,
                "arguments": STRING,
                "status": STRING,
            },
            {"namespace": STRING},
        ),
        obj(
            {"type": const("reasoning"), "id": STRING, "summary": array(OBJECT)},
            {"content": array(_REASONING_TEXT), "encrypted_content": STRING},
        ),
    ]
}
"""One item of a response's ``output``."""
USAGE = obj(
    {
        "input_tokens": INTEGER,
        "input_tokens_details": obj({"cached_tokens": INTEGER}),
        "output_tokens": INTEGER,
        "output_tokens_details": obj({"reasoning_tokens": INTEGER}),
        "total_tokens": INTEGER,
    }
)
RESPONSE = obj(
    {
        "id": STRING,
        "object": const("response"),
        "created_at": INTEGER,
        "status": {"enum": ["in_progress", "completed", "incomplete", "cancelled", "failed"]},
        "background": BOOLEAN,
        "error": nullable(OBJECT),
        "incomplete_details": nullable(obj({"reason": STRING})),
        "instructions": nullable(STRING),
        "max_output_tokens": nullable(INTEGER),
        "model": STRING,
        "output": array(OUTPUT_ITEM),
        "parallel_tool_calls": BOOLEAN,
        "previous_response_id": nullable(STRING),
        "reasoning": obj({"effort": nullable(STRING), "summary": nullable(STRING)}),
        "store": BOOLEAN,
        "temperature": NUMBER,
        "text": obj({"format": OBJECT}),
        "tool_choice": {"anyOf": [STRING, OBJECT]},
        "tools": array(OBJECT),
        "top_p": NUMBER,
        "truncation": STRING,
        "usage": nullable(USAGE),
        "metadata": OBJECT,
        "user": nullable(STRING),
        "prompt_cache_key": nullable(STRING),
    },
    {"completed_at": INTEGER},
    title="Response",
)
"""A response object (created, read back, or cancelled)."""
DELETED = obj(
    {"id": STRING, "object": const("response.deleted"), "deleted": const(True)},
    title="ResponseDeleted",
)
STORED_OR_DELETED = {"anyOf": [RESPONSE, DELETED], "title": "ResponseOrDeleted"}
"""``GET`` answers the response, ``DELETE`` the deletion (one handler serves both)."""
INPUT_ITEMS = obj(
    {
        "object": const("list"),
        "data": array(obj({"type": STRING, "id": STRING})),
        "first_id": nullable(STRING),
        "last_id": nullable(STRING),
        "has_more": BOOLEAN,
    },
    title="InputItemList",
)
"""A page of a stored response's input items."""

LIFECYCLE = [
    "response.created",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.cancelled",
    "response.failed",
]
"""The events that carry the whole response object."""
ITEM_EVENTS = [
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
]
"""The events about one output item (or one part of it)."""
RESPONSE_EVENTS = event_schema(
    {
        "anyOf": [
            obj({"type": {"enum": LIFECYCLE}, "response": RESPONSE, "sequence_number": INTEGER}),
            obj(
                {"type": {"enum": ITEM_EVENTS}, "output_index": INTEGER, "sequence_number": INTEGER}
            ),
            obj(
                {"type": const("error"), "message": STRING, "sequence_number": INTEGER},
                {"code": nullable(STRING), "param": nullable(STRING)},
            ),
        ]
    },
    names=[*LIFECYCLE, *ITEM_EVENTS, "error"],
)
"""One event of a streamed response."""
