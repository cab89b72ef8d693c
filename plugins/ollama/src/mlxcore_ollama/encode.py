"""Ollama's response shapes: timestamps, the timings of the final object, tool calls,
NDJSON lines and errors (``{"error": "..."}`` with the HTTP status)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from mlxcore.parsers.base import ToolCall
from mlxcore.request_builder import Generation
from mlxcore.server.errors import APIError

DONE_REASONS = {"length": "length"}
"""Ollama's ``done_reason`` for each finish reason (anything else, tool calls
included, is ``"stop"``)."""


def created_at() -> str:
    """The current time as Ollama writes it (RFC 3339, UTC, nanosecond digits)."""
    now = time.time_ns()
    stamp = datetime.fromtimestamp(now // 1_000_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{now % 1_000_000_000:09d}Z"


def line(body: dict[str, Any]) -> bytes:
    """One NDJSON line."""
    return msgspec.json.encode(body) + b"\n"


def done_reason(finish: str | None) -> str:
    """Ollama's ``done_reason`` for a generation's finish reason."""
    return DONE_REASONS.get(finish or "stop", "stop")


def timings(gen: Generation) -> dict[str, int]:
    """The final object's counts and durations (nanoseconds), as Ollama reports them:
    the prompt's evaluation up to the first token, then the generation."""
    end = time.perf_counter()
    first = gen.first_token_at if gen.first_token_at is not None else end
    return {
        "total_duration": int((end - gen.created_at) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": gen.usage.prompt_tokens,
        "prompt_eval_duration": int((first - gen.created_at) * 1e9),
        "eval_count": gen.usage.completion_tokens,
        "eval_duration": int((end - first) * 1e9),
    }


def tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Tool calls in Ollama's shape: the arguments as an object, not JSON text."""
    out = []
    for call in calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {}
        if not isinstance(arguments, dict):
            arguments = {}
        out.append({"function": {"name": call.name, "arguments": arguments}})
    return out


def error_body(err: APIError) -> dict[str, str]:
    """An error in Ollama's shape."""
    return {"error": err.message}


def error_line(err: APIError) -> bytes:
    """An error after a stream started: one more line, which Ollama's clients raise."""
    return line(error_body(err))
