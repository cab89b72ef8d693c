"""The last minutes of the server's figures, sampled once a second: what the dashboard
plots and ``GET /metrics/history`` answers.

The front ends feed it as tokens stream (:meth:`History.tokens`,
:meth:`History.first_token`) and as requests finish (:meth:`History.finished`), all on
the event loop; :meth:`History.run` closes an interval every second and keeps its point
with the gauges of that moment. Everything is bounded: :data:`WINDOW_SECONDS` points,
and at most :data:`SAMPLES_PER_SECOND` latency samples within one interval (a reservoir:
under heavier load each sample stands for more tokens, the percentiles stay fair).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

WINDOW_SECONDS = 900
"""Points kept: 15 minutes at one a second."""
PERIOD_SECONDS = 1.0
SAMPLES_PER_SECOND = 2048
"""Latency samples kept per interval and kind (time to first token, inter-token)."""
GAUGES = {
    "running": "requests_running",
    "waiting": "requests_waiting",
    "memory_active_bytes": "memory_active_bytes",
    "kv_bytes": "memory_kv_reserved_bytes",
    "prefix_cache_bytes": "prefix_cache_bytes",
    "expert_cache_bytes": "expert_cache_bytes",
}
"""Point field -> the router gauge it copies (``None`` in the point when absent)."""


class _Reservoir:
    """At most ``size`` values of one interval, each kept with equal chance."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: list[float] = []
        self.seen = 0

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = random.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value

    def drain(self) -> list[float]:
        values, self.values, self.seen = self.values, [], 0
        return sorted(values)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 6)


class History:
    """The last :data:`WINDOW_SECONDS` seconds of aggregate figures, one point a second."""

    def __init__(self, window: int = WINDOW_SECONDS) -> None:
        self.points: collections.deque[dict[str, Any]] = collections.deque(maxlen=window)
        self._tokens = 0
        self._prompt = 0
        self._cached = 0
        self._ttft = _Reservoir(SAMPLES_PER_SECOND)
        self._gaps = _Reservoir(SAMPLES_PER_SECOND)
        self._since = time.monotonic()

    def tokens(self, count: int, gap: float | None) -> None:
        """``count`` tokens reached a client; ``gap``: seconds since that request's
        previous tokens (``None`` for its first), spread over ``count``."""
        self._tokens += count
        if gap is not None and count > 0:
            self._gaps.add(gap / count)

    def first_token(self, seconds: float) -> None:
        """A request's time to its first token."""
        self._ttft.add(seconds)

    def finished(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request finished with this prompt, so much of it read from the prefix cache."""
        self._prompt += prompt_tokens
        self._cached += cached_tokens

    def sample(self, gauges: dict[str, float], now: float | None = None) -> dict[str, Any]:
        """Close the interval: its point (rates over the interval, gauges as they are)."""
        mono = time.monotonic()
        span = max(mono - self._since, 1e-6)
        ttft, gaps = self._ttft.drain(), self._gaps.drain()
        point: dict[str, Any] = {
            "t": round(time.time() if now is None else now, 3),
            "tokens_per_second": round(self._tokens / span, 2),
            "ttft_p50": _quantile(ttft, 0.5),
            "ttft_p95": _quantile(ttft, 0.95),
            "itl_p95": _quantile(gaps, 0.95),
            "prefix_hit_rate": round(self._cached / self._prompt, 4) if self._prompt else None,
        }
        for field, gauge in GAUGES.items():
            value = gauges.get(gauge)
            point[field] = None if value is None else float(value)
        self._tokens = self._prompt = self._cached = 0
        self._since = mono
        self.points.append(point)
        return point

    def since(self, seconds: float | None = None) -> list[dict[str, Any]]:
        """The points of the last ``seconds`` (all of them when ``None``), oldest first."""
        if seconds is None:
            return list(self.points)
        cut = time.time() - seconds
        return [p for p in self.points if p["t"] >= cut]

    async def run(self, gauges: Callable[[], dict[str, float]]) -> None:
        """Sample every :data:`PERIOD_SECONDS` until cancelled (a failing gauge read
        skips that second's gauges, never the sampling)."""
        while True:
            await asyncio.sleep(PERIOD_SECONDS - (time.monotonic() - self._since) % PERIOD_SECONDS)
            try:
                current = gauges()
            except Exception:
                log.debug("gauges unavailable for the history", exc_info=True)
                current = {}
            self.sample(current)
