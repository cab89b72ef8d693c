"""The draft model's own prefix reuse: the draft caches of finished sequences, kept for
the next sequence that starts with the same tokens.

A target prefix-cache hit (an agent's next turn, a shared system prompt) skips the
target's prefill, but the draft's cache has to be built for the joining sequence too:
without this store that is a prefill of the draft over the whole context, on the
critical path of the first token. With it, the draft is prefilled from the longest
stored prefix on.

Entries are attention-only draft caches (one ``KVCache`` per layer, as
``BatchKVCache.extract`` gives them: copies, not views of the batch), keyed by the
tokens they hold. The store is bounded in bytes and evicts the least recently used
entry first; the engine counts its bytes in the memory budget with the prefix cache's
(:meth:`~mlxcore.engine.strategies.Decoder.held_bytes`) and asks it to give memory
back before refusing a request (:meth:`~mlxcore.engine.strategies.Decoder.release`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from mlx_lm.models.cache import KVCache

MIN_REUSE = 16
"""Fewer shared tokens than this are not worth a copy: the draft prefills them."""


def _nbytes(layers: list[Any]) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share (one vectorised compare: a join scans
    every entry against contexts of thousands of tokens, on the engine's thread)."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class DraftPrefixes:
    """An LRU of draft caches keyed by the tokens they hold, bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[np.ndarray, list[Any], int]] = OrderedDict()
        self._next = 0
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], layers: list[Any]) -> bool:
        """Keep ``layers`` (holding ``tokens``); False when not kept (too small or too
        large for the store). An entry that is a prefix of the new one is replaced."""
        size = _nbytes(layers)
        if len(tokens) < MIN_REUSE or size > self.max_bytes:
            return False
        key = np.asarray(tokens, dtype=np.int64)
        for old, (held, _, _) in list(self._entries.items()):
            if common_prefix(held, key) == len(held):  # the new entry covers it
                self._drop(old)
        self._entries[self._next] = (key, layers, size)
        self._next += 1
        self.nbytes += size
        self.release(self.nbytes - self.max_bytes)
        return True

    def take(self, context: list[int]) -> tuple[int, list[Any] | None]:
        """The longest stored prefix of ``context`` (at least :data:`MIN_REUSE` tokens):
        its length and fresh caches holding it (the entry stays), or ``(0, None)``."""
        best, best_key = 0, None
        wanted = np.asarray(context, dtype=np.int64)
        for key, (held, _, _) in self._entries.items():
            n = common_prefix(held, wanted)
            if n > best:
                best, best_key = n, key
        if best < MIN_REUSE or best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        _, layers, _ = self._entries[best_key]
        self.hits += 1
        self.reused_tokens += best
        return best, [trimmed(layer, best) for layer in layers]

    def release(self, nbytes: int) -> int:
        """Drop least recently used entries until ``nbytes`` are freed; returns the bytes
        freed."""
        freed = 0
        while freed < nbytes and self._entries:
            freed += self._drop(next(iter(self._entries)))
        return freed

    def _drop(self, key: int) -> int:
        _, _, size = self._entries.pop(key)
        self.nbytes -= size
        return size


def trimmed(layer: Any, length: int) -> KVCache:
    """A new cache holding ``layer``'s first ``length`` positions (the stored arrays are
    not written: the slice is a new array, and the batch copies it when merging)."""
    cache = KVCache()
    cache.keys = layer.keys[..., :length, :]
    cache.values = layer.values[..., :length, :]
    cache.offset = length
    return cache
