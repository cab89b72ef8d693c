"""The prefix-cache pool (``--prefix-cache-size auto``, the default): its capacity follows
the memory budget, the models' caches share it (the one used least recently gives up
its entries first), another model's engine may take memory back from them, and an engine
built with default flags states and reports the capacity. Real caches of the tiny
dense Qwen3 test model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.config import ServerConfig
from mlxcore.defaults.prefix_cache import LRUPrefixCache, parse_cache_size
from mlxcore.defaults.radix_cache import RadixPrefixCache
from mlxcore.engine.memory import MemoryBudget
from mlxcore.engine.prefix_pool import HEADROOM, PrefixPool
from mlxcore.engine.request import GenerationRequest
from mlxcore.hooks import PluginHooks
from mlxcore.models.loader import load_model
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore.testing.runtime import submit_together

GIB = 2**30


@pytest.fixture(scope="module")
def model(tiny_qwen3: Path) -> Any:
    return load_model(tiny_qwen3).model


def budget(limit: int, weights: int = 0, cache_limit: int = 0) -> MemoryBudget:
    return MemoryBudget(limit, weights, per_token=1, cache_limit=cache_limit)


def store(model: Any, cache: Any, first: int, length: int) -> list[int]:
    """Run ``length`` tokens through the model and offer their cache to ``cache``."""
    tokens = [first, *range(100, 100 + length - 1)]
    layers = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=layers)
    mx.eval([c.state for c in layers])
    cache.store(tokens, layers)
    return tokens


def held(cache: RadixPrefixCache, tokens: list[int]) -> int:
    return cache.longest(tokens)


def test_the_capacity_is_the_room_left_beside_weights_running_requests_and_headroom() -> None:
    pool = PrefixPool()
    limit = 20 * GIB
    pool.join(budget(limit, weights=3 * GIB, cache_limit=GIB // 2), GIB, lambda: None)
    pool.join(budget(limit, weights=1 * GIB, cache_limit=GIB // 2), 2 * GIB, lambda: None)
    figures = pool.figures()
    assert figures is not None
    room = limit - 4 * GIB - GIB // 2
    assert figures.running == 3 * GIB  # the two models' worst cases, under half the room
    assert figures.headroom == int(limit * HEADROOM)
    assert figures.capacity == room - int(limit * HEADROOM) - 3 * GIB == pool.capacity()
    assert "memory limit 20.00 GiB" in figures.describe()
    # a running worst case beyond half the room is capped there
    pool.join(budget(limit), 100 * GIB, lambda: None)
    capped = pool.figures()
    assert capped is not None and capped.running == room // 2


def test_auto_is_a_size_of_its_own_and_the_default() -> None:
    assert parse_cache_size("auto") == (None, None) == parse_cache_size(" AUTO ")
    assert parse_cache_size("512MB") == (None, 512 * 10**6)
    assert ServerConfig().prefix_cache_size == "auto"


def test_the_model_used_least_recently_gives_up_its_entries_first(model: Any) -> None:
    """Two models' caches in one pool that holds about three entries: the model that
    grows last keeps its entries, the one idle longer loses its oldest."""
    per_entry = RadixPrefixCache(model, "1GB")
    store(model, per_entry, 1, 400)
    entry = per_entry.stats().nbytes
    pool = PrefixPool()
    caches = [RadixPrefixCache(model), RadixPrefixCache(model)]
    seats = []
    for cache in caches:
        limit = int((3.5 * entry) / (1 - HEADROOM))
        seats.append(pool.join(budget(limit), 0, lambda cache=cache: cache))
        assert cache.size_from_pool(seats[-1])
    assert pool.capacity() < 4 * entry
    idle, busy = caches
    old = [store(model, idle, n, 400) for n in (1, 2)]
    new = [store(model, busy, n, 400) for n in (3, 4)]
    assert pool.held() <= pool.capacity()
    assert [held(busy, t) for t in new] == [400, 400]
    assert held(idle, old[1]) == 400 and held(idle, old[0]) == 0  # its older entry went
    # the busy model's engine needs memory for running requests: only the other gives
    freed = seats[1].reclaim(entry)
    assert freed >= entry and idle.stats().nbytes == 0
    assert [held(busy, t) for t in new] == [400, 400]


def test_a_cache_with_a_size_of_its_own_keeps_it(model: Any) -> None:
    pool = PrefixPool()
    seat = pool.join(budget(GIB), 0, lambda: None)
    sized = RadixPrefixCache(model, "64MB")
    assert not sized.size_from_pool(seat) and sized.max_bytes == 64 * 10**6
    whole = LRUPrefixCache(model, "64MB")
    assert not whole.size_from_pool(seat)
    auto = LRUPrefixCache(model)
    assert auto.size_from_pool(seat) and auto.stats().capacity_bytes == pool.capacity()
    # an auto cache no engine seated holds 32,768 tokens' worth meanwhile
    assert RadixPrefixCache(model).max_bytes == RadixPrefixCache(model, "32768").max_bytes


def runtime(path: Path, pool: PrefixPool | None = None, **config: Any) -> Runtime:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=False))
    hooks = PluginHooks(pm)
    cfg = ServerConfig(model=str(path), **config)
    hooks.configure(cfg)
    return build_runtime(cfg, hooks, prefix_pool=pool)


def test_an_engine_with_default_flags_sizes_its_cache_from_memory(
    tiny_qwen3: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="mlxcore.engine.prefix_pool"):
        rt = runtime(tiny_qwen3)
    try:
        figures = rt.engine.prefix_pool.figures()
        assert figures is not None and rt.engine.pool_seat.taken
        stats = rt.engine.stats()
        assert stats["memory_prefix_cache_budget_bytes"] == figures.capacity > 0
        old_default = RadixPrefixCache(rt.model, "32768").max_bytes
        assert figures.capacity > 10 * old_default
        assert any("prefix cache: auto, " in r.getMessage() for r in caplog.records)
        (done,) = submit_together(rt, [GenerationRequest(tuple(range(50, 350)), max_tokens=2)])
        assert done.finish is not None
        assert 0 < rt.engine.cache.stats().nbytes <= figures.capacity
    finally:
        rt.engine.shutdown()
    assert rt.engine.pool_seat not in rt.engine.prefix_pool.seats  # left at shutdown


def test_models_of_one_process_share_one_pool(tiny_qwen3: Path, tiny_llama: Path) -> None:
    pool = PrefixPool()
    first = runtime(tiny_qwen3, pool)
    alone = pool.capacity()
    second = runtime(tiny_llama, pool)
    try:
        assert len(pool.seats) == 2 and all(seat.taken for seat in pool.seats)
        assert pool.capacity() < alone  # the second model's weights came out of it
        for rt in (first, second):
            assert rt.engine.stats()["memory_prefix_cache_budget_bytes"] == pool.capacity()
    finally:
        first.engine.shutdown()
        second.engine.shutdown()
    assert pool.seats == []
