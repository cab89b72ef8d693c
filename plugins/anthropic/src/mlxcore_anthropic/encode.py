"""Anthropic response shapes: the message object, stream events, errors."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from mlxcore.engine.events import Usage
from mlxcore.output import OutputDelta, OutputPipeline
from mlxcore.output.calls import CallStream
from mlxcore.parsers.base import ToolCall
from mlxcore.server.errors import APIError
from mlxcore_anthropic.convert import tool_input

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def new_message_id() -> str:
    """An Anthropic-style message id."""
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id(call: ToolCall) -> str:
    """Anthropic-style id for a tool call (``toolu_...``)."""
    return anthropic_id(call.id)


def anthropic_id(call_id: str) -> str:
    """A tool call id in Anthropic's style (``toolu_...``)."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish: str | None, pipeline: OutputPipeline) -> tuple[str, str | None]:
    """Anthropic ``stop_reason`` and ``stop_sequence`` for a finished generation."""
    if pipeline.stops.matched is not None:
        return "stop_sequence", pipeline.stops.matched
    return STOP_REASONS.get(finish or "stop", "end_turn"), None


def usage_body(usage: Usage) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` excludes the tokens read from the prefix cache."""
    body = {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }
    body.update(usage.extra)
    return body


def error_body(err: APIError) -> tuple[int, dict[str, Any]]:
    """Status and Anthropic error body (an overloaded server answers 529).

    Anthropic's error has no ``param`` field, so the field at fault is named in the
    message (``... (at messages[0].content[1].source.data)``).
    """
    status = 529 if err.status == 503 else err.status
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = err.message
    if err.param and err.param not in message:
        message = f"{message} (at {err.param})"
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def content_blocks(out: OutputDelta, *, show_thinking: bool) -> list[dict[str, Any]]:
    """The ``content`` list of a complete message."""
    blocks: list[dict[str, Any]] = []
    if out.reasoning and show_thinking:
        blocks.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
    if out.content:
        blocks.append({"type": "text", "text": out.content})
    for call in out.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call),
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    return blocks


def event(kind: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event in Anthropic's framing."""
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


class EventWriter:
    """Turns output deltas into Anthropic stream events, opening and closing
    content blocks as the kind of output changes."""

    def __init__(self, *, show_thinking: bool) -> None:
        self.show_thinking = show_thinking
        self.index = -1
        self.open_kind: str | None = None
        self.calls = CallStream()

    def _close(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        out.append(event("content_block_start", start))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return event("content_block_delta", body)

    def write(self, d: OutputDelta) -> list[bytes]:
        """Events for one delta."""
        out: list[bytes] = []
        if d.reasoning and self.show_thinking:
            if self.open_kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning}))
        if d.content:
            if self.open_kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": d.content}))
        for call in self.calls.events(d):
            if call.kind == "open":
                block = {"type": "tool_use", "id": anthropic_id(call.id), "name": call.name,
                         "input": {}}  # fmt: skip
                out += self._open("tool_use", block)
            elif call.kind == "arguments":
                out.append(self._delta({"type": "input_json_delta", "partial_json": call.text}))
            else:  # closed, or aborted (its text follows as a text block)
                out += self._close()
        return out

    def close(self) -> list[bytes]:
        """Events that end the last open block."""
        if self.open_kind == "thinking":
            sig = self._delta({"type": "signature_delta", "signature": ""})
            return [sig, *self._close()]
        return self._close()


def error_event(err: APIError) -> bytes:
    """An error after the stream started, as Anthropic's ``error`` event."""
    _, body = error_body(err)
    return event("error", body)
