"""The disk tier behind the built-in in-memory prefix cache.

Lookups ask memory first and the disk index second, and take whichever covers more of
the prompt; what comes from disk goes into memory too. Every stored entry of at least
``--disk-cache-min-tokens`` (finished sequences, history checkpoints and, on hybrid
models, the snapshots taken during prefill) is also written to disk by a writer thread;
so what memory evicts later is already on disk, and what a restart loses from memory is
found there.

Behind the built-in radix tree (:class:`~mlxcore.defaults.radix_cache.RadixPrefixCache`)
an entry holds only the tokens past the deepest entry already on disk that it extends
(its parent), so the disk, like memory, holds a shared prefix once. Behind the whole-entry
LRU (models whose cache cannot be cut) entries are whole caches.

While a request waits in the engine's queue, its entry's files are read ahead on a
thread of their own (:meth:`DiskTieredCache.prefetch`), so admission does not wait for
the disk.
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxcore.defaults.prefix_cache import LookupCounter, LRUPrefixCache
from mlxcore.defaults.radix_cache import RadixPrefixCache
from mlxcore.engine.cache_explain import CacheExplanation, explain_lookup
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.memory import compact_cache
from mlxcore.engine.prefix_pool import PoolSeat
from mlxcore.engine.prefix_tree import TierWatcher, TreeWatcher
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import (
    CacheLookup,
    CacheStats,
    CacheStrategy,
    LayerCache,
)
from mlxcore_disk_cache.chain import file_layers, segment_of, snapshot_of
from mlxcore_disk_cache.store import (
    CorruptEntry,
    DiskEntry,
    DiskStore,
    EntryGone,
    Match,
    common_prefix,
    entry_key,
)
from mlxcore_disk_cache.writer import DiskWriter

log = logging.getLogger("mlxcore.plugins.disk_cache")

MAX_PENDING_KEYS = 256
"""How many queued entries are remembered as parents for later ones."""


def _arrays(cache: LayerCache) -> list[mx.array]:
    """Every array of a per-layer cache's state."""
    flat: Any = tree_flatten([c.state for c in cache])
    return [item[1] for item in flat if isinstance(item[1], mx.array)]


def _storable(tokens: Sequence[int]) -> bool:
    """True for token ids a disk entry can hold (int32): a media prompt's cache key
    holds ids derived from its images' hashes, and a LoRA adapter's requests an id for
    the adapter's weights, which stay in memory only; a cache partition's markers (a
    key's or a salt's, :mod:`mlxcore.engine.cache_partition`) are negative int32 ids and
    go to disk with the rest."""
    return min(tokens) >= -(2**31) and max(tokens) < 2**31


class DiskTieredCache(CacheStrategy):
    """``memory`` (the built-in LRU) backed by ``store`` (None: the tier is off)."""

    name = "disk-cache"

    def __init__(
        self,
        model: Any,
        memory: RadixPrefixCache | LRUPrefixCache,
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
        self.tree = memory if isinstance(memory, RadixPrefixCache) else None
        """The memory tier's tree: entries are written as chains (None: whole entries)."""
        whole = self.trimmable and self.tree is None  # a longer entry replaces its prefixes
        self.writer = (
            DiskWriter(store, max_pending_bytes, self._turn_off, trimmable=whole)
            if store is not None
            else None
        )
        self.pending: dict[str, int] = {}
        """Entries handed to the writer (key: length), parents for later entries."""
        self._reader: concurrent.futures.ThreadPoolExecutor | None = None
        self.prefetches = 0
        self._closed = False

    # -- lookups ---------------------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        found = self.memory.find(tokens)
        if self.disk is not None and len(tokens) > 1 and _storable(tokens):
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
        loaded = self._load(entry, usable, tokens)
        if loaded is None:
            return None
        cache, nbytes = loaded
        if self.tree is None and usable < entry.length:
            trim_prompt_cache(cache, entry.length - usable)
        if self.tree is not None:
            self.tree.insert(tokens[:usable], cache)  # later prompts find it in memory
        self.reads += 1
        self.read_bytes += nbytes
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

    def _load(
        self, entry: DiskEntry, usable: int, tokens: Sequence[int]
    ) -> tuple[LayerCache, int] | None:
        """The cache of ``entry``'s first ``usable`` tokens (a prefix of ``tokens``) and
        the bytes read for it (None: it could not be read)."""
        assert self.disk is not None
        try:
            if self.tree is None:
                cache, nbytes = self._read(entry), entry.nbytes
            else:
                cache, nbytes = self._assemble(self.disk.chain(entry), usable, tokens)
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
        return list(cache), nbytes

    def _read(self, entry: DiskEntry) -> LayerCache:
        assert self.disk is not None
        cache = self.disk.read(entry)
        if not self._layout_ok(cache):
            self.disk.remove(entry)
            raise CorruptEntry("its cache layout is not this model's")
        return cache

    def _assemble(
        self, chain: list[DiskEntry], usable: int, tokens: Sequence[int]
    ) -> tuple[LayerCache, int]:
        """A sequence's cache from an entry and its parents (root first), and the bytes
        read. The links whose tokens the memory tier still holds are not read: its
        segments stand for them (a long session that outgrew memory keeps its beginning
        there, so only the rest comes from disk). The last link is always read: it holds
        the recurrent snapshot."""
        assert self.tree is not None
        layout = self.tree.layout
        held = self.tree.longest(tokens[:usable])
        first = 0
        while first < len(chain) - 1 and chain[first].length <= held:
            first += 1
        segments = self.tree.segments(tokens, chain[first].start) if first else []
        if segments is None:  # evicted meanwhile
            first, segments = 0, []
        assert self.disk is not None
        for link in chain[:first]:  # a parent stays as recent as its children on disk
            self.disk.touch(link)
        snapshot, nbytes = None, 0
        for link in chain[first:]:
            layers = self._read(link)
            segments.append(segment_of(layout, layers, link.length - link.start))
            snapshot = snapshot_of(layout, layers)
            nbytes += link.nbytes
        if layout.recurrent and usable != chain[-1].length:
            raise CorruptEntry("a recurrent snapshot resumes only where it was taken")
        return layout.assemble(segments, usable, snapshot), nbytes

    # -- reading ahead ---------------------------------------------------------

    def prefetch(self, request: GenerationRequest) -> None:
        """Read the files of ``request``'s disk entry on the reader thread, when the disk
        holds more of its prompt than memory."""
        tokens = request.cache_tokens
        if self.disk is None or self.tree is None or len(tokens) < 2 or not _storable(tokens):
            return
        match = self.disk.closest(np.asarray(tokens, dtype=np.int32), trimmable=self.trimmable)
        held = self.tree.longest(tokens)
        if match.entry is None or match.usable <= held:
            return
        if self._reader is None:
            self._reader = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="mlxcore-disk-prefetch"
            )
        self._reader.submit(self.disk.prefetch, match.entry, held)
        self.prefetches += 1

    # -- storing ---------------------------------------------------------------

    def snapshot_points(self, request: GenerationRequest, start: int) -> list[int]:
        return self.memory.snapshot_points(request, start)

    def size_from_pool(self, seat: PoolSeat) -> bool:
        return self.memory.size_from_pool(seat)

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        if self.tree is not None:
            self._keep_chained(tokens, cache, "sequence")
        else:
            self._keep_whole(tokens, cache, "assistant")

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        if self.tree is not None:
            self._keep_chained(tokens, cache, "checkpoint")
        else:  # the prefill goes on filling ``cache``: keep a copy
            self._keep_whole(tokens, copy.deepcopy(cache), "user")

    def _keep_whole(self, tokens: Sequence[int], cache: LayerCache, kind: str) -> None:
        assert isinstance(self.memory, LRUPrefixCache)
        kept = self.memory.insert(tokens, cache, kind)
        if self.writer is None or len(tokens) < self.min_tokens or not cache:
            return
        if not _storable(tokens):
            return
        if kept is None:  # memory is off: the disk gets its own compact copy
            kept = compact_cache(cache)
        self._submit(tokens, kept, "checkpoint" if kind == "user" else "sequence")

    def _keep_chained(self, tokens: Sequence[int], cache: LayerCache, kind: str) -> None:
        """Keep ``tokens`` in the tree, and write to disk what the disk lacks of them:
        the tokens past the deepest entry on disk (or queued) that they extend."""
        assert self.tree is not None
        self.tree.insert(tokens, cache)
        if self.writer is None or len(tokens) < self.min_tokens or not _storable(tokens):
            return
        key = entry_key(tokens)
        if key in self.pending or (self.disk is not None and key in self.disk.entries):
            return
        layout = self.tree.layout
        if not layout.fits(cache, len(tokens)):
            return
        parent, start = self._disk_parent(tokens)
        segment = layout.take_segment(cache, start, len(tokens))
        snapshot = layout.take_snapshot(cache) if layout.recurrent else None
        layers = file_layers(layout, segment, snapshot, len(tokens) - start)
        if self._submit(tokens, layers, kind, start, parent):
            self.pending[key] = len(tokens)
            self._forget_written()

    def _forget_written(self) -> None:
        """Keep :attr:`pending` small: entries on disk are found in its index."""
        if len(self.pending) <= MAX_PENDING_KEYS or self.disk is None:
            return
        index = self.disk.entries
        self.pending = {k: n for k, n in self.pending.items() if k not in index}
        while len(self.pending) > MAX_PENDING_KEYS:
            del self.pending[next(iter(self.pending))]

    def _disk_parent(self, tokens: Sequence[int]) -> tuple[str | None, int]:
        """The longest entry on disk or queued whose tokens begin ``tokens`` (key,
        length), or (None, 0)."""
        best: tuple[str | None, int] = (None, 0)
        for key, length in self.pending.items():
            if best[1] < length < len(tokens) and entry_key(tokens[:length]) == key:
                best = (key, length)
        if self.disk is not None:
            prompt = np.asarray(tokens, dtype=np.int32)
            for entry in self.disk.snapshot().values():
                length = entry.length
                if best[1] < length < len(tokens) and (
                    common_prefix(prompt, entry.tokens) == length
                ):
                    best = (entry.key, length)
        return best

    def _submit(
        self, tokens: Sequence[int], layers: LayerCache, kind: str, start: int = 0,
        parent: str | None = None,
    ) -> bool:  # fmt: skip
        assert self.writer is not None
        arrays = _arrays(layers)
        mx.eval(arrays)  # the writer thread must only read finished buffers
        nbytes = sum(a.nbytes for a in arrays)
        return self.writer.submit(tokens, layers, nbytes, kind, start, parent)

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

    def watch(self, watcher: TreeWatcher) -> bool:
        """The memory tier's changes; a :class:`TierWatcher` also gets the disk tier
        as the medium ``DISK`` (its entries' tokens, read when it asks)."""
        watching = self.memory.watch(watcher)
        if watching and isinstance(watcher, TierWatcher):
            watcher.watch_tier("DISK", self._disk_entries)
        return watching

    def _disk_entries(self) -> dict[str, Any] | None:
        """The disk tier's entries now (key -> tokens); None once closed."""
        if self._closed:
            return None
        store = self.disk
        return {} if store is None else {k: e.tokens for k, e in store.snapshot().items()}

    def close(self) -> None:
        """Write what is queued, then stop the writer and the reader."""
        self._closed = True
        self.memory.close()
        if self.writer is not None:
            self.writer.close()
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)

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
            disk_prefetches=self.prefetches,
            disk_prefetch_hits=store.prefetched.hits if store is not None else 0,
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
            entries=mem.entries,
            nbytes=mem.nbytes,
            capacity_bytes=mem.capacity_bytes,
            extra={**mem.extra, **extra},
        )
