"""The built-in prefix cache: mlx-lm's ``LRUPromptCache``, bounded, explained.

:class:`LRUPrefixCache` keeps compact copies of finished sequences and history
checkpoints in mlx-lm's LRU (its trie finds the nearest entry; its eviction order drops
finished sequences before checkpoints). Each lookup is classified
(:mod:`mlxcore.engine.cache_explain`): to say where a prompt left the stored entries,
the strategy walks mlx-lm's trie once more, and it remembers the tokens of the last
evicted entries to tell an eviction from a plain miss.
"""

from __future__ import annotations

import collections
import copy
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from mlx_lm.models.cache import (
    LRUPromptCache,
    RotatingKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from mlxcore.engine.cache_explain import REASONS, CacheExplanation, explain_lookup
from mlxcore.engine.cache_segments import CacheLayout
from mlxcore.engine.memory import cache_cost, compact_cache
from mlxcore.engine.prefix_pool import PoolSeat
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheLookup, CacheStats, CacheStrategy, LayerCache
from mlxcore.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?i?b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

EVICTED_MEMORY_TOKENS = 1 << 20
"""How many tokens of evicted entries are remembered (8 MB) to explain misses."""

EVICTED_MEMORY_ENTRIES = 256
"""How many evicted entries are remembered at most: a miss compares its prompt with each
(the newest evictions are the ones a returning client meets). Bounded by tokens alone,
short requests filled it with ~35,000 entries and every miss and eviction went through
all of them: a batch of short chats slowed from 210 to 118 requests/s as it grew."""


class EvictionMemory:
    """The token paths of the newest evicted entries (bounded in tokens and entries), to
    tell a miss caused by an eviction from a plain one."""

    def __init__(
        self, max_tokens: int = EVICTED_MEMORY_TOKENS, max_entries: int = EVICTED_MEMORY_ENTRIES
    ) -> None:
        self.max_tokens, self.max_entries = max_tokens, max_entries
        self._entries: collections.deque[np.ndarray] = collections.deque()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens remembered."""
        return self._tokens

    def add(self, tokens: np.ndarray) -> None:
        """Remember an evicted entry's tokens, forgetting the oldest past the bounds."""
        self._entries.append(tokens)
        self._tokens += int(tokens.shape[0])
        while self._entries and (
            self._tokens > self.max_tokens or len(self._entries) > self.max_entries
        ):
            self._tokens -= int(self._entries.popleft().shape[0])

    def closest(self, prompt: np.ndarray) -> tuple[int, int]:
        """See :func:`closest_of`."""
        return closest_of(self._entries, prompt)


AUTO = "auto"
"""``--prefix-cache-size auto``: sized from memory (:mod:`mlxcore.engine.prefix_pool`)."""

AUTO_FALLBACK = "32768"
"""What an ``auto`` cache holds until an engine seats it in its pool (tokens)."""


def parse_cache_size(text: str) -> tuple[int | None, int | None]:
    """``--prefix-cache-size``: ``"32768"`` is tokens, ``"512MB"`` is bytes, ``"auto"``
    is the engine's prefix-cache pool.

    Returns ``(tokens, bytes)`` with one of them set (``"0"`` disables the cache), or
    ``(None, None)`` for ``auto``.
    """
    if text.strip().lower() == AUTO:
        return None, None
    m = _SIZE.match(text)
    if not m:
        raise UsageError(
            f"--prefix-cache-size {text!r}: give auto, a token count (e.g. 32768) or a "
            "size with a unit (e.g. 512MB, 2GiB)"
        )
    number, unit = float(m.group(1)), m.group(2)
    if unit is None:
        return int(number), None
    return None, int(number * _UNITS[unit.lower()])


def fixed_size(text: str) -> str:
    """``text``, or the size an ``auto`` cache has before it is seated in a pool."""
    return AUTO_FALLBACK if parse_cache_size(text) == (None, None) else text


class LookupCounter:
    """Hits, misses, reused tokens and lookups by reason, for a strategy's stats."""

    def __init__(self) -> None:
        self.hits = self.misses = self.reused = 0
        self.by_reason: collections.Counter[str] = collections.Counter()

    def count(self, lookup: CacheLookup) -> None:
        """Count one lookup's outcome."""
        if lookup.cached_tokens > 0:
            self.hits += 1
            self.reused += lookup.cached_tokens
        else:
            self.misses += 1
        if lookup.explanation is not None:
            self.by_reason[lookup.explanation.reason] += 1

    def stats(
        self,
        *,
        entries: int,
        nbytes: int,
        capacity_bytes: int,
        extra: Mapping[str, float] | None = None,
    ) -> CacheStats:
        """:class:`CacheStats` with these counters and the given sizes."""
        return CacheStats(
            hits=self.hits,
            misses=self.misses,
            reused_tokens=self.reused,
            entries=entries,
            nbytes=nbytes,
            capacity_bytes=capacity_bytes,
            lookups={r: self.by_reason.get(r, 0) for r in REASONS},
            extra=dict(extra or {}),
        )


class _EvictionLog(LRUPromptCache.CacheOrder):
    """mlx-lm's eviction order, noting what it evicts (``pop`` is only called to evict)."""

    def __init__(self, evicted: EvictionMemory) -> None:
        super().__init__()
        self.evicted = evicted

    def pop(self) -> Any:
        model, tokens = super().pop()
        self.evicted.add(np.asarray(tokens, dtype=np.int64))
        return model, tokens


class _ExplainedLRU(LRUPromptCache):
    """``LRUPromptCache`` (this instance only) with an eviction log and a way to ask
    where a prompt leaves the stored entries."""

    def __init__(self, max_size: int, max_bytes: int) -> None:
        super().__init__(max_size=max_size, max_bytes=max_bytes)
        self.evicted = EvictionMemory()
        self._lru = _EvictionLog(self.evicted)

    def fetch_nearest_cache(self, model: Any, tokens: list[int]) -> tuple[Any, list[int]]:
        """mlx-lm's lookup; the entry it used then moves to the back of the eviction order.
        mlx-lm orders entries by insertion only: the entry a system prompt's side requests
        all resume from aged out after 64 newer entries (measured: two misses in a
        257K-token session on Gemma 4)."""
        found = self._trie.search(model, tokens)
        cache, rest = super().fetch_nearest_cache(model, tokens)
        used = len(tokens) - len(rest)
        entry_tokens = None
        if cache is not None and found.exact is not None and not rest:
            entry_tokens = found.exact
        elif cache is not None and found.shorter is not None and used == len(found.shorter):
            entry_tokens = found.shorter
        elif cache is not None and found.longer is not None:
            entry_tokens = found.longer
        if entry_tokens is not None:
            kind = self._trie.get(model, entry_tokens).cache_type
            self._lru.remove(model, entry_tokens)
            self._lru.push(model, entry_tokens, kind)
        return cache, rest

    def closest(self, key: Any, tokens: list[int]) -> tuple[int, int]:
        """``(entry_tokens, shared)``: the length of the stored entry nearest to
        ``tokens`` and how many leading tokens they share (0, 0 when none)."""
        found = self._trie.search(key, tokens)
        if found.exact is not None:
            return len(tokens), len(tokens)
        if found.longer is not None and found.common_prefix > len(found.shorter or ()):
            return len(found.longer), found.common_prefix
        if found.shorter is not None:
            return len(found.shorter), found.common_prefix
        return 0, found.common_prefix

    def closest_evicted(self, tokens: list[int]) -> tuple[int, int]:
        """Like :meth:`closest` over the remembered evicted entries."""
        return self.evicted.closest(np.asarray(tokens, dtype=np.int64))


def closest_of(entries: Iterable[np.ndarray], prompt: np.ndarray) -> tuple[int, int]:
    """``(entry_tokens, shared)``: the length of the entry among ``entries`` sharing the
    longest prefix with ``prompt``, and that prefix's length ((0, 0) when none)."""
    best = (0, 0)
    for entry in entries:
        n = min(prompt.shape[0], entry.shape[0])
        differ = np.flatnonzero(prompt[:n] != entry[:n])
        shared = int(differ[0]) if differ.size else n
        if shared > best[1]:
            best = (int(entry.shape[0]), shared)
    return best


MIN_WHOLE_SNAPSHOT = 256
"""Message starts before this token (the system prompt's own) get no whole-entry
snapshot (:meth:`LRUPrefixCache.snapshot_points`)."""

UNBOUNDED_BYTES = 1 << 62
"""The byte bound of a cache that evicts only when told (see ``follow_evictions``)."""


class LRUPrefixCache(CacheStrategy):
    """Prefix reuse on mlx-lm's ``LRUPromptCache``, bounded in tokens or bytes.

    Trimmable caches are cut back to the longest shared prefix; caches with state
    that cannot be rewound (recurrent layers) are reused only from entries that
    are an exact prefix of the new prompt. Entries are stored as compact copies
    (:func:`~mlxcore.engine.memory.compact_cache`), so the bytes reported are the
    bytes held; a token budget is turned into bytes with the model's measured
    cache cost per token (plus, for hybrid models, the fixed recurrent state of two
    entries). History checkpoints are kept longer than finished sequences
    (:meth:`store_checkpoint`); a sliding-window model's cache also keeps a copy where
    the first message after the system prompt starts (:meth:`snapshot_points`). The
    size ``auto`` (the default) is a seat in the engine's prefix-cache pool.

    A tier in front of it (a plugin's disk cache) composes :meth:`find` and
    :meth:`insert` instead of :meth:`lookup` and :meth:`store`.
    """

    name = "lru"
    max_entries: ClassVar[int] = 64
    KEY: ClassVar[str] = "model"
    """mlx-lm's cache is keyed by model; one strategy instance serves one model."""

    def __init__(self, model: Any, size: str = AUTO) -> None:
        self.model = model
        self.auto = parse_cache_size(size) == (None, None)
        self.max_tokens, max_bytes = parse_cache_size(fixed_size(size))
        if self.max_tokens:
            # N tokens of history, plus the fixed recurrent state of the two entries a
            # conversation turn stores (its history checkpoint and its finished sequence)
            per_token, fixed = cache_cost(model)
            max_bytes = self.max_tokens * per_token + 2 * fixed
        elif self.max_tokens is not None:
            max_bytes = 0
        self.lru = _ExplainedLRU(self.max_entries, max_bytes or 0)
        fresh = make_prompt_cache(model)
        self.trimmable = can_trim_prompt_cache(fresh)
        """Whether this model's cache can be cut back to any prefix (no recurrent state)."""
        self.rewinds = self.trimmable and not any(isinstance(c, RotatingKVCache) for c in fresh)
        """Whether every entry can be cut back: a sliding window that wrapped cannot be."""
        self.only_choice = CacheLayout.of(fresh) is None
        """The radix tree cannot cut this model's cache (sliding windows, nested caches):
        whole entries are its only prefix reuse, not a choice (``--cache-strategy lru``)."""
        self.counter = LookupCounter()
        self.seat: PoolSeat | None = None
        """The pool this cache is sized from (``auto`` only, once the engine seats it)."""
        self._lock = threading.RLock()

    def size_from_pool(self, seat: PoolSeat) -> bool:
        if not self.auto or self.lru.max_bytes == UNBOUNDED_BYTES:
            return False
        self.seat = seat
        self.lru.max_bytes = UNBOUNDED_BYTES  # the pool bounds it (settle, after inserts)
        return True

    @property
    def enabled(self) -> bool:
        """False when the configured size is zero."""
        return self.max_tokens != 0 and self.lru.max_bytes > 0

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        found = self.find(tokens)
        self.counter.count(found)
        return found

    def find(self, tokens: Sequence[int]) -> CacheLookup:
        """:meth:`lookup` without counting it (for a tier that counts its own)."""
        prompt = list(tokens)
        if not self.enabled:
            explanation = CacheExplanation("disabled", len(prompt))
            return CacheLookup(make_prompt_cache(self.model), 0, explanation)
        with self._lock:
            cache, cached = self._nearest(prompt) if len(prompt) > 1 else (None, 0)
            if cache is None or cached <= 0:
                cache, cached = make_prompt_cache(self.model), 0
            return CacheLookup(cache, cached, self._explain(prompt, cached))

    def _explain(self, prompt: list[int], cached: int) -> CacheExplanation:
        entry, shared = self.lru.closest(self.KEY, prompt)
        evicted, evicted_shared = self.lru.closest_evicted(prompt)
        return explain_lookup(
            len(prompt),
            cached,
            entry_tokens=entry,
            shared=shared,
            trimmable=self.trimmable,
            source="memory",
            evicted_tokens=evicted,
            evicted_shared=evicted_shared,
        )

    def _nearest(self, tokens: list[int]) -> tuple[LayerCache | None, int]:
        """The nearest stored cache and how many of ``tokens`` it holds (< len(tokens))."""
        cache, rest = self.lru.fetch_nearest_cache(self.KEY, tokens)
        if cache is None:
            return None, 0
        if rest:
            return cache, len(tokens) - len(rest)
        # An exact hit leaves nothing to prefill: step back one token.
        if can_trim_prompt_cache(cache):
            trim_prompt_cache(cache, 1)
            return cache, len(tokens) - 1
        cache, rest = self.lru.fetch_nearest_cache(self.KEY, tokens[:-1])
        if cache is None:
            return None, 0
        return cache, len(tokens) - 1 - len(rest)

    def snapshot_points(self, request: GenerationRequest, start: int) -> list[int]:
        """For a model the radix tree cannot cut whose cache cannot be cut back either (a
        sliding window past its size): where the first message after the system prompt
        starts, unless an entry ends there already. An agent's side requests and its
        compacted request share the system prompt and tools with the session, then part;
        a whole entry is reused only when it ends exactly where a prompt leaves it. One
        copy per system prompt. (``--cache-strategy lru`` on a model the tree can cut keeps
        mlx-lm's whole entries as they were: the agent bench's baseline.)"""
        if self.rewinds or not self.only_choice or not self.enabled:
            return []
        last = len(request.prompt_tokens) - 1
        for point in sorted(request.boundaries):
            if start < point < last and point >= MIN_WHOLE_SNAPSHOT:
                with self._lock:
                    found = self.lru._trie.search(self.KEY, list(request.cache_tokens[:point]))
                return [] if found.exact is not None else [point]
        return []

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self.insert(tokens, cache, "assistant")

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        """A snapshot taken during prefill (``cache`` is lent: a copy is kept): filed as
        mlx-lm's ``user`` kind, which its LRU evicts after the ``assistant`` kind
        (finished sequences), so an agent's long turns keep the entry the next turn
        starts from."""
        self.insert(tokens, copy.deepcopy(cache), "user")

    def insert(self, tokens: Sequence[int], cache: LayerCache, kind: str) -> LayerCache | None:
        """Keep a compact copy of ``cache`` for ``tokens`` as mlx-lm's ``kind``
        (``assistant`` or ``user``); return that copy (its arrays are evaluated and never
        mutated), or None when nothing was kept."""
        if not self.enabled or not tokens or not cache:
            return None
        kept = compact_cache(cache)
        with self._lock:
            self.lru.insert_cache(self.KEY, list(tokens), kept, cache_type=kind)
        if self.seat is not None:
            self.seat.settle()
        return kept

    def clear(self) -> None:
        with self._lock:
            self.lru.trim_to(n_sequences=0)

    def evict(self, nbytes: int) -> None:
        with self._lock:
            self.lru.trim_to(n_bytes=self.lru.nbytes - nbytes)

    def follow_evictions(self) -> None:
        if self.enabled:
            self.seat = None
            self.lru.max_bytes = UNBOUNDED_BYTES

    def trim_entries(self, count: int) -> None:
        with self._lock:
            self.lru.trim_to(n_sequences=count)

    def stats(self) -> CacheStats:
        capacity = self.seat.capacity() if self.seat is not None else self.lru.max_bytes
        return self.counter.stats(
            entries=len(self.lru), nbytes=self.lru.nbytes, capacity_bytes=capacity
        )


class NoPrefixCache(CacheStrategy):
    """No prefix reuse: for a model that does not generate (a plugin's encoder, with
    ``mlxcore_task`` other than ``generate``), which has no cache to keep."""

    name = "none"

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        return CacheLookup([])

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        return None
