"""The memory of evicted entries that explains misses stays small however many short
entries are evicted: bounded in entries and in tokens, its total kept as it goes (it
was once re-summed on every eviction and searched whole on every miss, which slowed a
long run of short requests by half)."""

from __future__ import annotations

import numpy as np

from mlxcore.defaults.prefix_cache import EvictionMemory


def test_bounded_in_entries_and_tokens() -> None:
    memory = EvictionMemory(max_tokens=1000, max_entries=8)
    for i in range(100):
        memory.add(np.arange(i, i + 30, dtype=np.int64))
    assert len(memory) == 8 and memory.tokens == 8 * 30
    big = EvictionMemory(max_tokens=100, max_entries=1000)
    for i in range(10):
        big.add(np.arange(0, 40, dtype=np.int64) + i)
    assert len(big) == 2 and big.tokens == 80


def test_the_newest_evictions_explain_a_miss() -> None:
    memory = EvictionMemory(max_entries=4)
    for i in range(10):
        memory.add(np.array([1, 2, 3, 100 + i, 7], dtype=np.int64))
    # a prompt sharing 4 tokens with a recent eviction
    assert memory.closest(np.array([1, 2, 3, 109, 8, 9], dtype=np.int64)) == (5, 4)
    # an old one is forgotten: only the common 3-token start is found
    assert memory.closest(np.array([1, 2, 3, 100, 8], dtype=np.int64)) == (5, 3)
    assert EvictionMemory().closest(np.array([1], dtype=np.int64)) == (0, 0)
