"""Several models under one memory budget: each engine's admission counts what the other
models hold (weights, the caches their admitted requests may grow to, their prefix caches),
through the model router's ``_elsewhere``, with real engines on a real model."""

from __future__ import annotations

import queue
from pathlib import Path
from types import SimpleNamespace

from mlxcore.engine.events import Event, FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.server.router import ModelRouter
from mlxcore.testing.runtime import make_runtime, submit_together

PROMPT = tuple(range(10, 30))
MAX_TOKENS = 32


def peak_concurrency(rt, per_request: int, start: int) -> int:
    """Run four requests submitted together; how many ran at once (from the engine's peak
    of reserved cache bytes)."""
    rt.engine.admission.peak_reserved = 0
    requests = [
        GenerationRequest(tuple(range(start + i, start + i + 20)), MAX_TOKENS) for i in range(4)
    ]
    results = submit_together(rt, requests)
    assert all(r.finish is not None and r.finish.reason == "length" for r in results)
    return round(rt.engine.stats()["memory_kv_reserved_peak_bytes"] / per_request)


def test_an_engine_admits_within_what_the_other_models_leave(tiny_llama: Path) -> None:
    here = make_runtime(tiny_llama, prefix_cache_size="64MB")
    other = make_runtime(tiny_llama, prefix_cache_size="64MB")
    try:
        slots = [
            SimpleNamespace(footprint=rt.engine.memory.weights, service=SimpleNamespace(runtime=rt))
            for rt in (here, other)
        ]
        router = SimpleNamespace(loaded=lambda: slots)
        router._held = lambda slot: ModelRouter._held(router, slot)  # type: ignore[arg-type]
        memory = here.engine.memory
        memory.elsewhere = lambda: ModelRouter._elsewhere(router, slots[0])  # type: ignore[arg-type]
        one = memory.cost(len(PROMPT) + MAX_TOKENS)
        base = memory.weights + memory.cache_limit + other.engine.memory.weights
        assert other.engine.memory_held() == 0

        # the other model idle and empty: two requests' caches fit here
        memory.limit = base + 2 * one + one // 2
        assert peak_concurrency(here, one, 100) == 2

        # the other model admits a request: its reservation counts while it runs
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        other.engine.submit(GenerationRequest(PROMPT, MAX_TOKENS), events.put)
        first = events.get(timeout=60)
        assert isinstance(first, TokenEvent)
        assert other.engine.memory_held() >= one
        while not isinstance(events.get(timeout=60), FinishEvent):
            pass

        # finished, it keeps its prefix cache: that counts too
        held = other.engine.memory_held()
        assert held == other.engine.stats()["prefix_cache_bytes"] > one // 2
        assert ModelRouter._elsewhere(router, slots[0]) == slots[1].footprint + held  # type: ignore[arg-type]
        # room for 1.5 requests once the other's cache is counted (2 or more if it were not)
        memory.limit = base + held + one + one // 2
        assert peak_concurrency(here, one, 200) == 1
    finally:
        here.engine.shutdown(timeout=5)
        other.engine.shutdown(timeout=5)
