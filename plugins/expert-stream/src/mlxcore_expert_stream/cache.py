"""Routed experts held in fixed tables, one per layer, least recently used out first.

Each streamed layer owns, per projection array (weight, and scales and biases when
quantized), one preallocated ``[slots, ...]`` table: its share of ``--expert-memory``.
An expert the router chooses is looked up in the layer's slots; a miss reads it from
disk into the slot of the least recently used expert not needed by the same call. The
forward pass then runs on the tables themselves with the router's indices renumbered to
slots, so no per-call copies are made and the memory held is the tables' from the start.
A call that needs more experts than the layer has slots (a long prefill) runs in rounds
of at most that many experts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import attrs
import mlx.core as mx
import numpy as np

Expert = dict[str, tuple[mx.array, ...]]
"""One expert: projection name -> its arrays (weight[, scales, biases])."""


@attrs.define
class CacheStats:
    """Hits, misses and bytes read from disk over every layer; the bytes the tables hold."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    nbytes: int = 0


class ExpertCache:
    """The tables of every streamed layer and their shared figures.

    Args:
        capacity: ``--expert-memory`` in bytes, shared evenly by the layers.
        load: ``load(layer, experts)`` reads those experts of one layer from disk.
        expert_bytes: one expert's bytes in each layer.
        top_k: experts per token (every layer gets at least this many slots).
    """

    def __init__(
        self,
        capacity: int,
        load: Callable[[str, list[int]], list[Expert]],
        expert_bytes: dict[str, int],
        top_k: int,
    ) -> None:
        self.capacity = capacity
        self.load = load
        share = capacity // max(1, len(expert_bytes))
        self.stats = CacheStats()
        self.layers = {
            layer: LayerSlots(self, layer, max(top_k, share // size))
            for layer, size in expert_bytes.items()
        }
        """Each streamed layer's slots (their tables are allocated at the first miss)."""

    def gauges(self) -> dict[str, float]:
        """The figures ``/metrics``, ``/health`` and the dashboard show."""
        stats = self.stats
        return {
            "expert_cache_bytes": float(stats.nbytes),
            "expert_cache_capacity_bytes": float(self.capacity),
            "expert_cache_hits": float(stats.hits),
            "expert_cache_misses": float(stats.misses),
            "expert_cache_read_bytes": float(stats.bytes_read),
        }


class LayerSlots:
    """One layer's tables and which expert each slot holds."""

    def __init__(self, cache: ExpertCache, name: str, slots: int) -> None:
        self.cache = cache
        self.name = name
        self.size = slots
        self.tables: dict[str, list[mx.array]] = {}
        self.held: OrderedDict[int, int] = OrderedDict()
        """Expert -> slot, least recently used first."""

    def place(self, experts: Sequence[int]) -> np.ndarray:
        """Make ``experts`` (at most :attr:`size`, distinct) resident; returns the slot
        of each, in order."""
        stats = self.cache.stats
        wanted = set(experts)
        missing = [e for e in experts if e not in self.held]
        stats.hits += len(experts) - len(missing)
        if missing:
            free = iter(sorted(set(range(self.size)) - set(self.held.values())))
            victims = iter([e for e in self.held if e not in wanted])
            for expert, arrays in zip(missing, self.cache.load(self.name, missing), strict=True):
                slot = next(free, None)
                if slot is None:
                    slot = self.held.pop(next(victims))
                self._write(slot, arrays)
                self.held[expert] = slot
                stats.misses += 1
            mx.eval([t for tables in self.tables.values() for t in tables])
        for expert in experts:
            self.held.move_to_end(expert)
        return np.array([self.held[e] for e in experts], dtype=np.uint32)

    def _write(self, slot: int, expert: dict[str, tuple[mx.array, ...]]) -> None:
        if not self.tables:
            for name, arrays in expert.items():
                self.tables[name] = [mx.zeros((self.size, *a.shape), dtype=a.dtype) for a in arrays]
            nbytes = sum(t.nbytes for tables in self.tables.values() for t in tables)
            self.cache.stats.nbytes += nbytes
        for name, arrays in expert.items():
            tables = self.tables[name]
            for i, array in enumerate(arrays):
                tables[i][slot] = array
                self.cache.stats.bytes_read += array.nbytes
