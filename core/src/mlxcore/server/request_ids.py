"""Request ids: ``x-request-id`` honoured and echoed, and carried into every log line.

Each HTTP request gets an id: the client's ``x-request-id`` when it is a sensible token
(1-128 characters of letters, digits and ``._:-``), else a new one. The id is echoed in
the response's ``x-request-id`` header (errors raised before routing included), held in a
context variable while the request is served (so log lines written for it carry it), and
given to the engine with the request (``GenerationRequest.trace_id``) for the lines the
engine thread writes. ``--log-format json`` writes one JSON object per line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from typing import Any

import attrs

HEADER = "x-request-id"
SCOPE_KEY = "mlxcore_request_id"
_VALID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@attrs.frozen
class HttpRequestInfo:
    """What the generation layer may know of the HTTP request it serves (for the
    ``mlxcore_request_finished`` hook: tracing, audit logs)."""

    request_id: str
    method: str
    path: str
    received_ns: int
    """When it arrived (wall clock, nanoseconds since the epoch)."""
    traceparent: str | None = None
    """W3C Trace Context ``traceparent`` header, as sent."""
    tracestate: str | None = None


current_http: contextvars.ContextVar[HttpRequestInfo | None] = contextvars.ContextVar(
    "mlxcore_http_request", default=None
)
"""The HTTP request being served (``None`` outside one)."""


def request_id_for(given: str | None) -> str:
    """The client's id when it is a sensible token, else a new one."""
    if given and _VALID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def _from_scope(scope: dict[str, Any]) -> str:
    """The id of the request ``scope`` describes (assigned on first ask)."""
    found = scope.get(SCOPE_KEY)
    if isinstance(found, str):
        return found
    rid = request_id_for(_header(scope, HEADER.encode()))
    scope[SCOPE_KEY] = rid
    return rid


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def assign(scope: dict[str, Any]) -> str:
    """Give the request its id and make it the current one (a ``before_request`` step)."""
    rid = _from_scope(scope)
    current_http.set(
        HttpRequestInfo(
            rid,
            str(scope.get("method", "")),
            str(scope.get("path", "")),
            time.time_ns(),
            _header(scope, b"traceparent"),
            _header(scope, b"tracestate"),
        )
    )
    return rid


async def echo(message: Any, scope: Any) -> None:
    """A ``before_send`` hook: the id in every HTTP response's ``x-request-id`` header."""
    if message.get("type") == "http.response.start" and scope.get("type") == "http":
        headers = list(message.get("headers") or [])
        if not any(name.lower() == HEADER.encode() for name, _ in headers):
            headers.append((HEADER.encode(), _from_scope(scope).encode()))
            message["headers"] = headers


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (the current request's, or what the caller passed in
    ``extra``) and ``request_tag`` (`` [id]`` or empty, for the text format) to records."""

    def filter(self, record: logging.LogRecord) -> bool:
        http = current_http.get()
        rid = getattr(record, "request_id", None) or (http.request_id if http else None)
        record.request_id = rid
        record.request_tag = f" [{rid}]" if rid else ""
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, and
    request_id and exception when there are."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def log_formatter(kind: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (``text`` or ``json``)."""
    if kind == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT, "%H:%M:%S")
