"""Prometheus metrics for /metrics, on a registry owned by one app (never global)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mlxcore.engine.events import FinishEvent
from mlxcore.engine.stall import StallReport
from mlxcore.server.history import History

PREFIX = "mlxcore"
MODEL_STATES = ("not_loaded", "loading", "loaded", "failed")
RECENT_REQUESTS = 50
"""How many finished requests :meth:`Metrics.as_json` lists (the newest)."""


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted under their own label; any other a client sends counts as ``other``
(a label per made-up method would grow the registry without bound)."""


class _GaugeReader(Collector):
    """Gauges read at scrape time: engine load, memory, cache and decoder stats."""

    def __init__(self, sample: Callable[[], dict[str, float]]) -> None:
        self.sample = sample

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value in sorted(self.sample().items()):
            yield GaugeMetricFamily(f"{PREFIX}_{name}", name.replace("_", " "), value=value)


class _StallReader(Collector):
    """Each model's last stalled step (the watchdog abandoned it), named: one series per
    model, replaced by the next stall."""

    def __init__(self, stalls: Callable[[], list[tuple[str, StallReport]]]) -> None:
        self.stalls = stalls

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{PREFIX}_engine_stall_seconds",
            "seconds the last abandoned engine step ran, with its phase and requests",
            labels=["model", "phase", "requests"],
        )
        for model, stall in self.stalls():
            family.add_metric([model, stall.phase, ",".join(stall.ids)], stall.seconds)
        yield family


class Metrics:
    """Counters and histograms the server updates, plus live gauges."""

    def __init__(self, live: Callable[[], dict[str, float]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "finished requests", ["finish_reason"], registry=r
        )
        self.rejected = Counter(
            f"{PREFIX}_rejected_requests", "refused requests", ["reason"], registry=r
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens", "prompt tokens reused", registry=r
        )
        self.generated_tokens = Counter(
            f"{PREFIX}_generation_tokens", "generated tokens", registry=r
        )
        self.http = Counter(
            f"{PREFIX}_http_responses",
            "HTTP responses by route (the path template; unmatched paths as one) and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.model_loads = Counter(
            f"{PREFIX}_model_loads", "model loads by result", ["model", "result"], registry=r
        )
        self.model_unloads = Counter(
            f"{PREFIX}_model_unloads", "models unloaded (idle, evicted)", ["model"], registry=r
        )
        self.model_load_seconds = Histogram(
            f"{PREFIX}_model_load_seconds", "time to load a model", registry=r
        )
        self._model_state = Gauge(
            f"{PREFIX}_model_state",
            "1 for each model's current state (not_loaded, loading, loaded, failed)",
            ["model", "state"],
            registry=r,
        )
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "TTFT", registry=r)
        self.latency = Histogram(f"{PREFIX}_request_seconds", "request duration", registry=r)
        self._recent: deque[tuple[str | None, dict[str, Any]]] = deque(maxlen=RECENT_REQUESTS)
        self.history = History()
        """The last minutes of aggregate figures, once a second (``/metrics/history``)."""
        self._recent_lock = threading.Lock()
        if live is not None:
            self.watch(live)

    def watch(self, live: Callable[[], dict[str, float]]) -> None:
        """Expose ``live()``'s values as gauges, read at every scrape."""
        self.registry.register(_GaugeReader(live))

    def watch_stalls(self, stalls: Callable[[], list[tuple[str, StallReport]]]) -> None:
        """Expose the engines' last stalled steps (``stalls()``: model and report)."""
        self.registry.register(_StallReader(stalls))

    def model_state(self, model: str, state: str) -> None:
        """Record that ``model`` is now in ``state``."""
        for name in MODEL_STATES:
            self._model_state.labels(model=model, state=name).set(1 if name == state else 0)

    async def count_response(self, message: Any, scope: Any) -> None:
        """A Litestar ``before_send`` hook: count each response as it starts."""
        if message.get("type") == "http.response.start" and scope.get("type") == "http":
            route = scope.get("path_template") or "unmatched"
            status = str(message.get("status", 0))
            method = scope.get("method", "")
            method = method if method in HTTP_METHODS else "other"  # a client names it
            self.http.labels(method=method, route=route, status=status).inc()

    def record_finish(
        self,
        event: FinishEvent,
        seconds: float,
        *,
        ttft: float | None = None,
        model: str = "",
        request_id: str = "",
        tenant: str | None = None,
    ) -> None:
        """Account for one finished request (``ttft``: seconds to its first token, None
        when it produced none) and list it among the recent ones (``tenant``: the API
        key that sent it, who alone sees it there besides admins)."""
        usage = event.usage
        self.requests.labels(finish_reason=event.reason).inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.cached_tokens.inc(usage.cached_tokens)
        self.generated_tokens.inc(usage.completion_tokens)
        self.latency.observe(seconds)
        self.history.finished(usage.prompt_tokens, usage.cached_tokens)
        decode = seconds - ttft if ttft is not None else 0.0
        entry = {
            "id": request_id,
            "model": model,
            "finished_at": time.time(),
            "finish_reason": event.reason,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "completion_tokens": usage.completion_tokens,
            "seconds": round(seconds, 4),
            "ttft_seconds": None if ttft is None else round(ttft, 4),
            # decode speed after the first token (None for one token or none)
            "tokens_per_second": round((usage.completion_tokens - 1) / decode, 2)
            if usage.completion_tokens > 1 and decode > 0
            else None,
        }
        with self._recent_lock:
            self._recent.append((tenant, entry))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def as_json(self, viewer: str | None = None) -> dict[str, Any]:
        """The same metrics as :meth:`render`, as JSON: each sample name -> its labelled
        values (histogram buckets left out: their ``_sum`` and ``_count`` stay), and the
        newest finished requests, newest first: all of them for ``viewer`` ``None`` (an
        admin, or a server without keys), else only that tenant's."""
        samples: dict[str, list[dict[str, Any]]] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                value = sample.value if math.isfinite(sample.value) else None
                samples.setdefault(sample.name, []).append(
                    {"labels": dict(sample.labels), "value": value}
                )
        with self._recent_lock:
            recent = [e for t, e in reversed(self._recent) if viewer is None or t == viewer]
        return {"object": "metrics", "metrics": samples, "recent_requests": recent}


def memory_gauges() -> dict[str, float]:
    """MLX memory in bytes: active, peak and cached."""
    return {
        "memory_active_bytes": float(mx.get_active_memory()),
        "memory_peak_bytes": float(mx.get_peak_memory()),
        "memory_cache_bytes": float(mx.get_cache_memory()),
    }


def engine_gauges(engine: Any) -> dict[str, float]:
    """Engine load and strategy statistics, flattened to gauges."""
    stats = engine.stats()
    out = {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}
    out.update(memory_gauges())
    return out
