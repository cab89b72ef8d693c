"""Built-in plugin: the default strategies (chunked prefill, plain batched decode
from :mod:`mlxcore.builtin.decoder`, LRU prefix cache). Registered like any
plugin, offered last, so a plugin's own strategy for a model takes precedence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

import mlx.core as mx
from mlx_lm.models.cache import (
    LRUPromptCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from mlxcore import hookimpl
from mlxcore.builtin.decoder import PlainDecoder
from mlxcore.config import ServerConfig
from mlxcore.engine.batch_prefill import cache_is_batchable, prefill_together
from mlxcore.engine.memory import cache_cost, compact_cache
from mlxcore.engine.strategies import (
    CacheLookup,
    CacheStats,
    CacheStrategy,
    Decoder,
    LayerCache,
    PrefillGenerator,
    PrefillResult,
    PrefillStrategy,
    PrefillTask,
)
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo

BATCH_OPTION = "batched_prefill"
"""Request option: ``{"batched_prefill": false}`` keeps a request out of batched prefill."""


class ChunkedPrefill(PrefillStrategy):
    """Processes the prompt in chunks of ``step_size`` tokens, then the last token
    alone for its logits (the same split as ``mlx_lm.generate``).

    Prompts whose remaining part fits in one chunk can also be prefilled together
    (:meth:`prefill_batch`, mlx-lm's batched prompt processing, see
    :mod:`mlxcore.engine.batch_prefill`).
    """

    name = "chunked"

    def __init__(self, model: Any, step_size: int = 2048) -> None:
        self.model = model
        self.step_size = step_size
        self._batches = 0
        self._batched_requests = 0

    @property
    def stops_at_checkpoints(self) -> bool:
        return type(self).prefill is ChunkedPrefill.prefill  # not a subclass's own prefill

    def can_batch(self, task: PrefillTask) -> bool:
        if type(self).prefill is not ChunkedPrefill.prefill:
            return False  # a subclass changed how a prompt is filled
        request = task.request
        if request.media is not None or request.options.get(BATCH_OPTION) is False:
            return False
        if len(task.remaining) > self.step_size + 1:
            return False
        return cache_is_batchable(task.cache, len(request.prompt_tokens))

    def prefill_batch(self, tasks: Sequence[PrefillTask]) -> list[PrefillResult]:
        results = prefill_together(self.model, tasks)
        self._batches += 1
        self._batched_requests += len(tasks)
        return results

    def stats(self) -> dict[str, float]:
        return {"batches": self._batches, "batched_requests": self._batched_requests}

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        tokens = mx.array(list(task.remaining))[None]
        body = tokens.shape[1] - 1
        done = 0
        while done < body:
            stops = [c - task.start for c in task.checkpoints]  # may grow between chunks
            n = min(task.step_tokens or self.step_size, self.step_size, body - done)
            upcoming = [s for s in stops if done < s < done + n]
            if upcoming:
                n = upcoming[0] - done
            self.model(tokens[:, done : done + n], cache=task.cache)
            mx.eval([c.state for c in task.cache])
            done += n
            if done in stops and task.snapshot is not None:
                task.snapshot(task.start + done)
            yield done
        logits = self.model(tokens[:, body:], cache=task.cache)[:, -1, :]
        return PrefillResult(logits=logits)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?i?b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_cache_size(text: str) -> tuple[int | None, int | None]:
    """``--prefix-cache-size``: ``"32768"`` is tokens, ``"512MB"`` is bytes.

    Returns ``(tokens, bytes)`` with one of them set; ``"0"`` disables the cache.
    """
    m = _SIZE.match(text)
    if not m:
        raise UsageError(
            f"--prefix-cache-size {text!r}: give a token count (e.g. 32768) or a size "
            "with a unit (e.g. 512MB, 2GiB)"
        )
    number, unit = float(m.group(1)), m.group(2)
    if unit is None:
        return int(number), None
    return None, int(number * _UNITS[unit.lower()])


class LRUPrefixCache(CacheStrategy):
    """Prefix reuse on mlx-lm's ``LRUPromptCache``, bounded in tokens or bytes.

    Trimmable caches are cut back to the longest shared prefix; caches with state
    that cannot be rewound (recurrent layers) are reused only from entries that
    are an exact prefix of the new prompt. Entries are stored as compact copies
    (:func:`~mlxcore.engine.memory.compact_cache`), so the bytes reported are the
    bytes held; a token budget is turned into bytes with the model's measured
    cache cost per token (plus, for hybrid models, the fixed recurrent state of two
    entries). History checkpoints are kept longer than finished sequences
    (:meth:`store_checkpoint`).
    """

    name = "lru"
    max_entries: ClassVar[int] = 64
    KEY: ClassVar[str] = "model"
    """mlx-lm's cache is keyed by model; one strategy instance serves one model."""

    def __init__(self, model: Any, size: str = "32768") -> None:
        self.model = model
        self.max_tokens, max_bytes = parse_cache_size(size)
        if self.max_tokens:
            # N tokens of history, plus the fixed recurrent state of the two entries a
            # conversation turn stores (its history checkpoint and its finished sequence)
            per_token, fixed = cache_cost(model)
            max_bytes = self.max_tokens * per_token + 2 * fixed
        elif self.max_tokens is not None:
            max_bytes = 0
        self.lru = LRUPromptCache(max_size=self.max_entries, max_bytes=max_bytes or 0)
        self._hits = self._misses = self._reused = 0

    @property
    def enabled(self) -> bool:
        """False when the configured size is zero."""
        return self.max_tokens != 0 and self.lru.max_bytes > 0

    def lookup(self, tokens: Sequence[int]) -> CacheLookup:
        if self.enabled and len(tokens) > 1:
            cache, cached = self._nearest(list(tokens))
            if cache is not None and cached > 0:
                self._hits += 1
                self._reused += cached
                return CacheLookup(cache=cache, cached_tokens=cached)
        self._misses += 1
        return CacheLookup(cache=make_prompt_cache(self.model), cached_tokens=0)

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

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        self._insert(tokens, cache, "assistant")

    def store_checkpoint(self, tokens: Sequence[int], cache: LayerCache) -> None:
        """A conversation's history snapshot: filed as mlx-lm's ``user`` kind, which its
        LRU evicts after the ``assistant`` kind (finished sequences), so an agent's long
        turns keep the entry the next turn starts from."""
        self._insert(tokens, cache, "user")

    def _insert(self, tokens: Sequence[int], cache: LayerCache, kind: str) -> None:
        if not self.enabled or not tokens or not cache:
            return
        self.lru.insert_cache(self.KEY, list(tokens), compact_cache(cache), cache_type=kind)

    def clear(self) -> None:
        self.lru.trim_to(n_sequences=0)

    def evict(self, nbytes: int) -> None:
        self.lru.trim_to(n_bytes=self.lru.nbytes - nbytes)

    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            reused_tokens=self._reused,
            entries=len(self.lru),
            nbytes=self.lru.nbytes,
            capacity_bytes=self.lru.max_bytes,
        )


@hookimpl(trylast=True)
def mlxcore_prefill_strategy(model: Any, info: ModelInfo, config: ServerConfig) -> PrefillStrategy:
    """The default: chunked prefill with ``--prefill-step-size``."""
    return ChunkedPrefill(model, step_size=config.prefill_step_size)


@hookimpl(trylast=True)
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> Decoder:
    """The default: plain batched decoding."""
    return PlainDecoder(model)


@hookimpl(trylast=True)
def mlxcore_cache_strategy(model: Any, info: ModelInfo, config: ServerConfig) -> CacheStrategy:
    """The default: an LRU prefix cache of ``--prefix-cache-size``."""
    return LRUPrefixCache(model, size=config.prefix_cache_size)
