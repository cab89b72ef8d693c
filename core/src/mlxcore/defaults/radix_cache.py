"""The built-in prefix cache: one radix tree of token runs for every stored prompt.

:class:`RadixPrefixCache` keeps finished sequences and prefill snapshots in a
:class:`~mlxcore.engine.prefix_tree.PrefixTree`: entries that share a prefix share its
attention keys and values, so sixteen sessions on one system prompt hold it once. A
prompt resumes from the deepest point it shares with any stored entry; on a hybrid model
(recurrent layers beside attention, as Qwen3.5), from the deepest recurrent *snapshot*
on that path. Snapshots are taken while prompts are prefilled, where later requests are
likely to diverge (:meth:`RadixPrefixCache.snapshot_points`): at the start of each
message the request builder found in the rendered template (an agent's side request
shares the system prompt and tools, then differs) and every
:data:`SNAPSHOT_INTERVAL` tokens, at the same absolute positions for every prompt.

A snapshot costs the model's fixed recurrent state, a segment only its own tokens' keys
and values. Both count against the budget; eviction is least recently used over leaves
and inner snapshots, what later requests resumed from kept longer than what none did
(:mod:`mlxcore.engine.prefix_tree`). The budget is the process's prefix-cache pool by
default (``--prefix-cache-size auto``, :mod:`mlxcore.engine.prefix_pool`: sized from the
memory left beside the weights and the running requests), or a size of its own.

The engine's thread does the lookups and stores; another model's engine may evict from
this cache when the pool is over its capacity, so the tree is changed under a lock.

Models whose cache the tree cannot cut (sliding-window or nested layers) keep whole
entries in :class:`~mlxcore.defaults.prefix_cache.LRUPrefixCache` instead
(:func:`prefix_cache_for`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.defaults.prefix_cache import (
    UNBOUNDED_BYTES,
    EvictionMemory,
    LookupCounter,
    LRUPrefixCache,
    fixed_size,
    parse_cache_size,
)
from mlxcore.engine.cache_explain import CacheExplanation, explain_lookup
from mlxcore.engine.cache_segments import (
    CacheLayout,
    Segment,
    segment_nbytes,
    snapshot_nbytes,
    split_segment,
)
from mlxcore.engine.memory import cache_cost
from mlxcore.engine.prefix_pool import PoolSeat
from mlxcore.engine.prefix_tree import Node, PathMatch, PrefixTree, TreeWatcher
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheLookup, CacheStats, CacheStrategy, LayerCache

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 2048
"""Snapshot every this many tokens of a long prompt (hybrid models), at multiples of it,
so prompts that share a long prefix share snapshots; doubled until the snapshots hold at
most a quarter of the bytes of the keys and values they cover. The default prefill chunk
is as long, so a cold prefill stops nowhere extra; measured, stopping more often did not
slow prefill either (docs/benchmarks.md, "Snapshot interval")."""

MIN_SNAPSHOT_GAP = 256
"""The fewest tokens between two snapshots of one prefill."""

MAX_NODES = 8192
"""The most nodes the tree keeps (bounds the bookkeeping; bytes bound the memory)."""


class RadixPrefixCache(CacheStrategy):
    """Prefix reuse over a radix tree of shared segments and recurrent snapshots.

    Args:
        model: the model whose caches are stored.
        size: ``--prefix-cache-size``: ``"auto"`` (a seat in the engine's prefix-cache
            pool, :meth:`size_from_pool`; 32,768 tokens until it has one), tokens of
            history (``"32768"``) or bytes (``"512MB"``); ``"0"`` disables the cache. A
            token budget also pays for one snapshot per :attr:`gap` tokens on hybrid
            models.
        layout: the model's cache layout (measured from ``model`` when not given).
        protect_reused: keep what later requests resumed from longer than what none did
            (off in a distributed group, whose ranks must evict alike).
    """

    name = "radix"

    def __init__(
        self,
        model: Any,
        size: str = "auto",
        layout: CacheLayout | None = None,
        *,
        protect_reused: bool = True,
    ):
        self.model = model
        found = layout or CacheLayout.of(make_prompt_cache(model))
        if found is None:
            raise ValueError("this model's cache cannot be cut into segments")
        self.layout = found
        per_token, fixed = cache_cost(model)
        self.gap = MIN_SNAPSHOT_GAP
        if self.layout.recurrent and per_token > 0:
            self.gap = max(MIN_SNAPSHOT_GAP, math.ceil(fixed / per_token))
        """Tokens between snapshots: at least as many as make their keys and values cost
        what one snapshot costs, so snapshots never hold most of the budget."""
        self.interval = SNAPSHOT_INTERVAL
        while self.interval < 4 * self.gap:
            self.interval *= 2
        self.auto = parse_cache_size(size) == (None, None)
        self.max_tokens, max_bytes = parse_cache_size(fixed_size(size))
        if self.max_tokens:
            max_bytes = self.max_tokens * per_token
            if self.layout.recurrent:
                max_bytes += (self.max_tokens // self.gap + 2) * fixed
        elif self.max_tokens is not None:
            max_bytes = 0
        self._own_bytes = max_bytes or 0
        self.seat: PoolSeat | None = None
        """The pool this cache is sized from (``auto`` only, once the engine seats it)."""
        self._following = False
        self.max_nodes = MAX_NODES
        self.evicted = EvictionMemory()
        self.tree = PrefixTree(
            split_segment,
            needs_snapshots=self.layout.recurrent,
            on_evict=self._remember,
            size=segment_nbytes,
            protect_reused=protect_reused,
        )
        self.counter = LookupCounter()
        self._lock = threading.RLock()

    @property
    def max_bytes(self) -> int:
        """The most bytes kept: the pool's capacity when seated in one, else the
        configured size."""
        if self._following:
            return UNBOUNDED_BYTES
        if self.seat is not None:
            return self.seat.capacity()
        return self._own_bytes

    def size_from_pool(self, seat: PoolSeat) -> bool:
        if not self.auto or self._following:
            return False
        self.seat = seat
        return True

    @property
    def trimmable(self) -> bool:
        """Whether any shared prefix is reusable (no recurrent layers)."""
        return not self.layout.recurrent

    @property
    def enabled(self) -> bool:
        """False when the configured size is zero."""
        return self.max_bytes > 0

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        found = self.find(tokens)
        self.counter.count(found)
        return found

    def find(self, tokens: Sequence[int]) -> CacheLookup:
        """:meth:`lookup` without counting it (for a tier that counts its own)."""
        prompt = np.asarray(tokens, dtype=np.int64)
        if not self.enabled:
            explanation = CacheExplanation("disabled", len(prompt))
            return CacheLookup(make_prompt_cache(self.model), 0, explanation)
        with self._lock:
            match = self.tree.match(prompt)
            nodes, usable, snapshot = self._usable(match, len(prompt) - 1)
            if usable > 0:
                segments = [node.segment for node in nodes]
                cache = self.layout.assemble(segments, usable, snapshot)
                self.tree.touch(nodes[-1:], reused=True)
            else:
                cache = make_prompt_cache(self.model)
            explanation = self._explain(prompt, usable, match)
        if self.seat is not None and usable > 0:
            self.seat.active_at = time.monotonic()
        return CacheLookup(cache, usable, explanation)

    def segments(self, tokens: Sequence[int], length: int) -> list[Segment] | None:
        """The attention segments of the first ``length`` tokens of ``tokens``, when
        the tree holds them (None otherwise): a disk tier rebuilds a longer prefix from
        these and its own files past them."""
        if length <= 0:
            return []
        with self._lock:
            match = self.tree.match(np.asarray(tokens[:length], dtype=np.int64))
            if match.shared < length:
                return None
            out: list[Segment] = []
            for node in match.nodes:
                if node.start >= length:
                    break
                if node.end <= length:
                    out.append(node.segment)
                else:
                    out.append([p if p is None else p.cut(0, length - node.start)
                                for p in node.segment])  # fmt: skip
            self.tree.touch(match.nodes[-1:], reused=True)
        return out

    def _usable(self, match: PathMatch, limit: int) -> tuple[list[Node], int, Any]:
        """The nodes to rebuild from, how many tokens they give, and the snapshot."""
        if self.layout.recurrent:
            node = match.deepest_snapshot(limit)
            if node is None:
                return [], 0, None
            return node.path(), node.end, node.snapshot
        usable = min(match.shared, limit)
        return [n for n in match.nodes if n.start < usable], usable, None

    def longest(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the tree holds (usable or not)."""
        with self._lock:
            return self.tree.match(np.asarray(tokens, dtype=np.int64)).shared

    def _explain(self, prompt: np.ndarray, cached: int, match: PathMatch) -> CacheExplanation:
        evicted, evicted_shared = self.evicted.closest(prompt)
        return explain_lookup(
            len(prompt),
            cached,
            entry_tokens=_entry_end(match),
            shared=match.shared,
            trimmable=self.trimmable,
            source="memory",
            evicted_tokens=evicted,
            evicted_shared=evicted_shared,
        )

    def _remember(self, leaf: Node) -> None:
        """Note an evicted leaf's tokens (to tell an eviction from a plain miss)."""
        self.evicted.add(leaf.path_tokens())

    # -- snapshots -------------------------------------------------------------------

    def snapshot_points(self, request: GenerationRequest, start: int) -> list[int]:
        """Message starts and multiples of :attr:`interval` past ``start``, at least
        :attr:`gap` tokens apart (hybrid models only: attention caches resume anywhere)."""
        if not self.layout.recurrent or not self.enabled:
            return []
        last = len(request.prompt_tokens) - 1
        first = (start // self.interval + 1) * self.interval
        aligned = set(range(first, last, self.interval))
        points: list[int] = []
        previous = start
        for point in sorted(aligned | {b for b in request.boundaries if start < b < last}):
            if point in aligned or point - previous >= self.gap:
                if points and point - points[-1] < self.gap and point in aligned:
                    points.pop()  # an aligned point wins over a message start just before
                points.append(point)
                previous = point
        return points

    # -- storing ---------------------------------------------------------------------

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self.insert(tokens, cache)

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self.insert(tokens, cache)

    def insert(self, tokens: Sequence[int], cache: LayerCache) -> Node | None:
        """Keep the state of ``tokens`` from ``cache`` (copies of what the tree lacks;
        ``cache`` is not kept or changed); returns the node ending at ``tokens``, or None
        when nothing was kept."""
        length = len(tokens)
        if not self.enabled or length == 0 or not self.layout.fits(cache, length):
            if self.enabled and length:
                log.debug("prefix cache: a cache of another shape than its %d tokens", length)
            return None

        def segment_for(start: int, stop: int) -> tuple[Segment, int]:
            segment = self.layout.take_segment(cache, start, stop)
            return segment, segment_nbytes(segment)

        def snapshot_for() -> tuple[Any, int]:
            snapshot = self.layout.take_snapshot(cache)
            return snapshot, snapshot_nbytes(snapshot)

        with self._lock:
            node = self.tree.insert(
                np.asarray(tokens, dtype=np.int64),
                segment_for,
                snapshot_for if self.layout.recurrent else None,
            )
        self._enforce()
        with self._lock:
            return node if node is not None and node.serial in self.tree.nodes else None

    def _enforce(self) -> None:
        """Back within the bounds: the pool's (every cache it seats together, outside
        this cache's lock) or this cache's own; and the node count."""
        if self.seat is not None and not self._following:
            self.seat.settle()
        with self._lock:
            limit = self.max_bytes
            if self.seat is None and self.tree.nbytes > limit:
                self.tree.evict_bytes(limit)
            if len(self.tree.nodes) > self.max_nodes:
                self.tree.evict(lambda: len(self.tree.nodes) <= self.max_nodes)

    # -- the rest of the interface ---------------------------------------------------

    def clear(self) -> None:
        with self._lock:
            self.tree.clear()

    def watch(self, watcher: TreeWatcher) -> bool:
        with self._lock:
            self.tree.watchers.append(watcher)
        return True

    def close(self) -> None:
        """The watchers hear the tree is gone (its memory goes with the strategy)."""
        with self._lock:
            for watcher in self.tree.watchers:
                watcher.cleared()
            self.tree.watchers.clear()

    def evict(self, nbytes: int) -> None:
        with self._lock:
            self.tree.evict_bytes(self.tree.nbytes - nbytes)

    def follow_evictions(self) -> None:
        if self.enabled:
            self._following = True
            self.seat = None
            self.max_nodes = 1 << 62

    def trim_entries(self, count: int) -> None:
        with self._lock:
            self.tree.evict_entries(count)

    def shared_settings(self) -> Any:
        return {"cache": self.name, "gap": self.gap, "interval": self.interval}

    def adopt_settings(self, settings: Any) -> None:
        if not isinstance(settings, dict) or settings.get("cache") != self.name:
            super().adopt_settings(settings)
            return
        self.gap, self.interval = int(settings["gap"]), int(settings["interval"])

    def stats(self) -> CacheStats:
        return self.counter.stats(
            entries=self.tree.entries,
            nbytes=self.tree.nbytes,
            capacity_bytes=self.max_bytes,
            extra={"nodes": len(self.tree.nodes), "snapshots": self.tree.snapshots},
        )


def _entry_end(match: PathMatch) -> int:
    """The length of the stored entry a prompt left last: where the path it shares ends
    when that is a leaf, else the end of the most recently used leaf below that point."""
    node = match.last
    if node is None:
        return 0
    while node.children:
        node = max(node.children.values(), key=lambda child: child.last_used)
    return node.end


def prefix_cache_for(
    model: Any, size: str, *, distributed: bool = False
) -> RadixPrefixCache | LRUPrefixCache:
    """The built-in prefix cache for ``model``: the radix tree when its cache can be cut
    into segments, else whole entries in mlx-lm's LRU (``distributed``: a rank of a
    group, which evicts by plain LRU)."""
    layout = CacheLayout.of(make_prompt_cache(model))
    if layout is None:
        return LRUPrefixCache(model, size=size)
    return RadixPrefixCache(model, size=size, layout=layout, protect_reused=not distributed)
