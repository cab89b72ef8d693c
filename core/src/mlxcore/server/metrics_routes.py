"""``/metrics`` (Prometheus), ``/metrics/json`` (the same, and the newest finished
requests) and ``/metrics/history`` (the last 15 minutes, once a second): read from the
app's :class:`~mlxcore.server.metrics.Metrics`, nothing asked of the engine thread."""

from __future__ import annotations

import math
import re
from typing import Any

from litestar import Request, Response, get

from mlxcore.routes import METRICS_OPTION
from mlxcore.server.errors import invalid
from mlxcore.server.history import GAUGES as HISTORY_GAUGES
from mlxcore.server.history import PERIOD_SECONDS as HISTORY_PERIOD
from mlxcore.server.history import WINDOW_SECONDS as HISTORY_WINDOW
from mlxcore.server.keys import current_key
from mlxcore.server.metrics import Metrics
from mlxcore.server.openapi import (
    INTEGER,
    NUMBER,
    QUERY_OPTION,
    REPLIES_OPTION,
    STRING,
    array,
    const,
    nullable,
    obj,
    reply,
)


@get(
    "/metrics",
    media_type="text/plain; version=0.0.4",
    opt={
        METRICS_OPTION: True,
        REPLIES_OPTION: {200: reply("Prometheus text", STRING, media_type="text/plain")},
    },
)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus metrics."""
    metrics_: Metrics = request.app.state.metrics
    return Response(metrics_.render(), media_type="text/plain; version=0.0.4")


_SAMPLE = obj(
    {"labels": {"type": "object", "additionalProperties": STRING}, "value": nullable(NUMBER)}
)
METRICS_JSON = obj(
    {
        "object": const("metrics"),
        "metrics": {"type": "object", "additionalProperties": array(_SAMPLE)},
        "recent_requests": array(
            obj(
                {
                    "id": STRING,
                    "model": STRING,
                    "finished_at": NUMBER,
                    "finish_reason": STRING,
                    "prompt_tokens": INTEGER,
                    "cached_tokens": INTEGER,
                    "completion_tokens": INTEGER,
                    "seconds": NUMBER,
                    "ttft_seconds": nullable(NUMBER),
                    "tokens_per_second": nullable(NUMBER),
                }
            )
        ),
    },
    title="MetricsJSON",
)
"""What ``/metrics/json`` answers."""


@get(
    "/metrics/json",
    opt={METRICS_OPTION: True, REPLIES_OPTION: {200: reply("the metrics as JSON", METRICS_JSON)}},
)
async def metrics_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The same metrics as ``/metrics`` as JSON (histogram buckets left out), with the
    newest finished requests (TTFT, tokens/s, cached share); what the web page's
    dashboard polls; an ordinary API key sees only its own requests among the newest.
    Read from the registry: nothing is asked of the engine thread."""
    metrics_: Metrics = request.app.state.metrics
    key = current_key.get()
    return metrics_.as_json(None if key is None or key.is_admin else key.name)


_POINT = obj(
    {
        "t": NUMBER,
        "tokens_per_second": NUMBER,
        "ttft_p50": nullable(NUMBER),
        "ttft_p95": nullable(NUMBER),
        "itl_p95": nullable(NUMBER),
        "prefix_hit_rate": nullable(NUMBER),
        **{field: nullable(NUMBER) for field in HISTORY_GAUGES},
    }
)
METRICS_HISTORY = obj(
    {
        "object": const("metrics.history"),
        "period_seconds": NUMBER,
        "window_seconds": INTEGER,
        "points": array(_POINT),
    },
    title="MetricsHistory",
)
"""What ``/metrics/history`` answers."""


@get(
    "/metrics/history",
    opt={
        METRICS_OPTION: True,
        REPLIES_OPTION: {200: reply("the recent points", METRICS_HISTORY)},
        QUERY_OPTION: {"seconds": {"type": "number", "minimum": 0}},
    },
)
async def metrics_history(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The last 15 minutes, one point a second (``seconds``: only the newest ones):
    aggregate tokens/s, TTFT p50/p95, inter-token p95, running and waiting requests,
    memory (MLX active, KV reserved, prefix cache, expert cache) and the prefix-cache hit
    rate of the requests that finished in that second. What the dashboard plots."""
    metrics_: Metrics = request.app.state.metrics
    given = request.query_params.getall("seconds", [])
    seconds = _seconds(given[-1]) if given else None
    return {
        "object": "metrics.history",
        "period_seconds": HISTORY_PERIOD,
        "window_seconds": HISTORY_WINDOW,
        "points": metrics_.history.since(seconds),
    }


_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _seconds(text: str) -> float:
    """The ``seconds`` query parameter: a finite number, 0 or more (else a 400)."""
    value = float(text) if _NUMBER.fullmatch(text) else math.nan
    if not (math.isfinite(value) and value >= 0):
        raise invalid("seconds must be a number of seconds, 0 or more", "seconds")
    return value
