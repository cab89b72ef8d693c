"""The disk tier in front of the built-in in-memory prefix cache.

Lookups ask memory first and the disk index second, and take whichever covers more of
the prompt. Every stored entry of at least ``--disk-cache-min-tokens`` (history
checkpoints and finished sequences) is also written to disk, by a writer thread, from
the same compact copy memory keeps; so what memory evicts later is already on disk, and
what a restart loses from memory is found there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxcore.builtin.prefix_cache import LookupCounter, LRUPrefixCache
from mlxcore.engine.cache_explain import CacheExplanation, explain_lookup
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.memory import compact_cache
from mlxcore.engine.strategies import (
    CacheLookup,
    CacheStats,
    CacheStrategy,
    LayerCache,
)
from mlxcore_disk_cache.store import CorruptEntry, DiskEntry, DiskStore, EntryGone, Match
from mlxcore_disk_cache.writer import DiskWriter

log = logging.getLogger("mlxcore.plugins.disk_cache")


def _arrays(cache: LayerCache) -> list[mx.array]:
    """Every array of a per-layer cache's state."""
    flat: Any = tree_flatten([c.state for c in cache])
    return [item[1] for item in flat if isinstance(item[1], mx.array)]


class DiskTieredCache(CacheStrategy):
    """``memory`` (the built-in LRU) backed by ``store`` (None: the tier is off)."""

    name = "disk-cache"

    def __init__(
        self,
        model: Any,
        memory: LRUPrefixCache,
        store: DiskStore | None,
        *,
        min_tokens: int = 512,
        max_pending_bytes: int = 1 << 30,
        kv_quant: KVQuantization | None = None,
    ) -> None:
        self.model = model
        self.memory = memory
        self.disk = store
        self.min_tokens = min_tokens
        self.counter = LookupCounter()
        self.reads = self.read_bytes = self.dropped = 0
        self.read_seconds = 0.0
        self.layout = [type(c).__name__ for c in make_prompt_cache(model)]
        self.kv_quant = kv_quant
        self.trimmable = memory.trimmable
        self.writer = (
            DiskWriter(store, max_pending_bytes, self._turn_off, trimmable=self.trimmable)
            if store is not None
            else None
        )

    # -- lookups ---------------------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        found = self.memory.find(tokens)
        if self.disk is not None and len(tokens) > 1:
            try:
                found = self._from_disk(tokens, found) or found
            except Exception:
                log.exception("disk-cache: lookup failed; serving from memory")
        self.counter.count(found)
        return found

    def _from_disk(self, tokens: Sequence[int], found: CacheLookup) -> CacheLookup | None:
        assert self.disk is not None
        self.disk.refresh()
        match = self.disk.closest(np.asarray(tokens, dtype=np.int32), trimmable=self.trimmable)
        entry, usable = match.entry, match.usable
        before = found.explanation
        if entry is None or usable <= found.cached_tokens:
            if before is not None and match.shared > max(before.diverged_at, found.cached_tokens):
                # say what the disk holds when it knows more about the miss than memory
                found.explanation = self._explain(tokens, found.cached_tokens, match, before.source)
            return None
        start = time.perf_counter()
        cache = self._load(entry)
        if cache is None:
            return None
        if usable < entry.length:
            trim_prompt_cache(cache, entry.length - usable)
        self.reads += 1
        self.read_bytes += entry.nbytes
        self.read_seconds += time.perf_counter() - start
        match.nearest_tokens, match.shared = entry.length, max(usable, match.shared)
        log.debug("disk-cache: read %d tokens from %s", usable, entry.data)
        explanation = self._explain(tokens, usable, match, "disk")
        return CacheLookup(cache=cache, cached_tokens=usable, explanation=explanation)

    def _explain(
        self, tokens: Sequence[int], cached: int, match: Match, source: str | None
    ) -> CacheExplanation:
        return explain_lookup(
            len(tokens),
            cached,
            entry_tokens=match.nearest_tokens,
            shared=match.shared,
            trimmable=self.trimmable,
            source=source,
        )

    def _layout_ok(self, cache: LayerCache) -> bool:
        """True when ``cache`` has this model's layers (attention layers may be quantized
        as ``--kv-cache-dtype`` says)."""
        if len(cache) != len(self.layout):
            return False
        kv = self.kv_quant
        for layer, expected in zip(cache, self.layout, strict=True):
            name = type(layer).__name__
            if name == expected:
                continue
            if kv is None or (expected, name) != ("KVCache", "QuantizedKVCache"):
                return False
            if (layer.bits, layer.group_size) != (kv.bits, kv.group_size):
                return False
        return True

    def _load(self, entry: DiskEntry) -> LayerCache | None:
        assert self.disk is not None
        try:
            cache = self.disk.read(entry)
            if not self._layout_ok(cache):
                self.disk.remove(entry)
                raise CorruptEntry("its cache layout is not this model's")
            mx.eval(_arrays(cache))
        except EntryGone:
            return None
        except CorruptEntry as exc:
            self.dropped += 1
            log.warning(
                "disk-cache: dropped a damaged entry (%d tokens, %s): %s; the prompt is "
                "computed instead",
                entry.length,
                entry.data,
                exc,
            )
            return None
        return list(cache)

    # -- storing ---------------------------------------------------------------

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self._keep(tokens, cache, "assistant")

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self._keep(tokens, cache, "user")

    def _keep(self, tokens: Sequence[int], cache: LayerCache, kind: str) -> None:
        kept = self.memory.insert(tokens, cache, kind)
        if self.writer is None or len(tokens) < self.min_tokens or not cache:
            return
        if kept is None:  # memory is off: the disk gets its own compact copy
            kept = compact_cache(cache)
        arrays = _arrays(kept)
        mx.eval(arrays)  # the writer thread must only read finished buffers
        nbytes = sum(a.nbytes for a in arrays)
        self.writer.submit(tokens, kept, nbytes, "checkpoint" if kind == "user" else "sequence")

    def _turn_off(self, exc: OSError) -> None:
        """The folder cannot take entries: serve from memory only from now on."""
        if self.disk is None:
            return
        log.warning(
            "disk-cache: turned off, %s cannot take entries (%s); prefix reuse continues "
            "from memory only",
            self.disk.root,
            exc,
        )
        self.disk = None

    # -- the rest of the interface ----------------------------------------------

    def clear(self) -> None:
        self.memory.clear()

    def evict(self, nbytes: int) -> None:
        self.memory.evict(nbytes)

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self.writer is not None:
            self.writer.close()

    def stats(self) -> CacheStats:
        mem = self.memory.stats()
        extra: dict[str, float] = {"disk_enabled": 1.0 if self.disk is not None else 0.0}
        store = self.disk
        if store is not None:
            extra.update(
                disk_entries=len(store.entries),
                disk_bytes=store.nbytes(),
                disk_capacity_bytes=store.max_bytes,
            )
        extra.update(
            disk_reads=self.reads,
            disk_read_bytes=self.read_bytes,
            disk_read_seconds=self.read_seconds,
            disk_dropped_damaged=self.dropped,
        )
        if self.writer is not None:
            w = self.writer.stats
            extra.update(
                disk_writes=w.writes,
                disk_written_bytes=w.written_bytes,
                disk_write_seconds=w.write_seconds,
                disk_write_errors=w.errors,
                disk_writes_skipped=w.skipped_full_queue,
                disk_evicted=w.evicted,
                disk_pending_bytes=self.writer.pending_bytes,
            )
        return self.counter.stats(
            entries=mem.entries, nbytes=mem.nbytes, capacity_bytes=mem.capacity_bytes, extra=extra
        )
