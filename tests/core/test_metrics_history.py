"""The dashboard's history (``/metrics/history``): one point a second, rates and
percentiles over each second, and bounded however long it runs or however many tokens
come in a second."""

from __future__ import annotations

import pickle

import pytest

from mlxcore.server import history as history_module
from mlxcore.server.history import SAMPLES_PER_SECOND, WINDOW_SECONDS, History


def test_a_point_holds_the_seconds_rates_percentiles_and_gauges() -> None:
    h = History()
    for ms in range(1, 101):  # TTFTs of 1..100 ms
        h.first_token(ms / 1000)
    for _ in range(10):
        h.tokens(5, gap=0.05)  # five tokens 50 ms after the previous ones: 10 ms a token
    h.finished(prompt_tokens=300, cached_tokens=240)
    point = h.sample({"requests_running": 3, "memory_active_bytes": 1e9}, now=1000.0)
    assert point["t"] == 1000.0 and point["tokens_per_second"] > 0
    assert point["ttft_p50"] == pytest.approx(0.051) and point["ttft_p95"] == pytest.approx(0.096)
    assert point["itl_p95"] == pytest.approx(0.01)
    assert point["prefix_hit_rate"] == 0.8
    assert point["running"] == 3 and point["memory_active_bytes"] == 1e9
    assert point["waiting"] is None and point["expert_cache_bytes"] is None
    quiet = h.sample({}, now=1001.0)  # a second without traffic: no latency, no hit rate
    assert quiet["tokens_per_second"] == 0 and quiet["ttft_p50"] is None
    assert quiet["prefix_hit_rate"] is None
    assert [p["t"] for p in h.since()] == [1000.0, 1001.0]


def _held_by(history: History) -> int:
    """Bytes this history's points and latency samples take (pickled: what it holds,
    whatever other threads of the test process allocate meanwhile)."""
    kept = (list(history.points), history._ttft.values, history._gaps.values)
    return len(pickle.dumps(kept))


def test_the_window_and_each_seconds_samples_stay_bounded() -> None:
    window = 60  # the real one is WINDOW_SECONDS; the same deque, filled faster
    h = History(window)
    for second in range(window):
        h.tokens(1, gap=0.01)
        h.sample({"requests_running": 1}, now=float(second))
    full = _held_by(h)
    for second in range(window, 3 * window):
        for _ in range(3 * SAMPLES_PER_SECOND):  # more tokens than samples kept
            h.tokens(1, gap=0.001)
        assert len(h._gaps.values) <= SAMPLES_PER_SECOND
        h.sample({"requests_running": 1}, now=float(second))
    later = _held_by(h)
    assert len(h.points) == window
    assert h.points[0]["t"] == 2 * window  # the oldest went first
    assert 0 < later < full * 1.2  # flat: the window replaced its points
    assert History().points.maxlen == WINDOW_SECONDS


def test_the_sampler_keeps_sampling_when_a_gauge_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    monkeypatch.setattr(history_module, "PERIOD_SECONDS", 0.01)
    h = History()
    calls = []

    def gauges() -> dict[str, float]:
        calls.append(1)
        if len(calls) % 2:
            raise RuntimeError("engine restarting")
        return {"requests_running": 2}

    async def run() -> None:
        task = asyncio.ensure_future(h.run(gauges))
        await asyncio.sleep(0.2)
        task.cancel()

    asyncio.run(run())
    assert len(h.points) >= 4
    assert {p["running"] for p in h.points} == {None, 2.0}
