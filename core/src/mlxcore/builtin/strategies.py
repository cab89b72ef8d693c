"""Built-in plugin: the default strategies (chunked prefill, plain batched decode,
LRU prefix cache). Registered like any plugin, offered last, so a plugin's own
strategy for a model takes precedence.
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
from mlxcore.config import ServerConfig
from mlxcore.engine.sampling import token_with_logprobs
from mlxcore.engine.strategies import (
    CacheLookup,
    CacheStats,
    CacheStrategy,
    Decoder,
    DecodeSequence,
    LayerCache,
    PrefillGenerator,
    PrefillResult,
    PrefillStrategy,
    PrefillTask,
    StepToken,
)
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo


class ChunkedPrefill(PrefillStrategy):
    """Processes the prompt in chunks of ``step_size`` tokens, then the last token
    alone for its logits (the same split as ``mlx_lm.generate``)."""

    name = "chunked"

    def __init__(self, model: Any, step_size: int = 2048) -> None:
        self.model = model
        self.step_size = step_size

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        tokens = mx.array(list(task.remaining))[None]
        body = tokens.shape[1] - 1
        done = 0
        while done < body:
            n = min(self.step_size, body - done)
            self.model(tokens[:, done : done + n], cache=task.cache)
            mx.eval([c.state for c in task.cache])
            done += n
            yield done
        logits = self.model(tokens[:, body:], cache=task.cache)[:, -1, :]
        return PrefillResult(logits=logits)


class PlainDecoder(Decoder):
    """One token per sequence per step, all sequences in one batched forward pass.

    Each sequence's own cache is merged into mlx-lm's batch caches
    (``BatchKVCache`` / ``ArraysCache``) when it joins, and extracted back when it
    leaves.
    """

    name = "plain"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.seqs: list[DecodeSequence] = []
        self.cache: LayerCache = []
        self._joining: list[DecodeSequence] = []

    def __len__(self) -> int:
        return len(self.seqs) + len(self._joining)

    def add(self, seq: DecodeSequence) -> None:
        self._joining.append(seq)

    def _merge_joining(self) -> None:
        if not self._joining:
            return
        new = [
            layer.merge([s.cache[i] for s in self._joining])
            for i, layer in enumerate(self._joining[0].cache)
        ]
        if self.cache:
            for mine, theirs in zip(self.cache, new, strict=True):
                mine.extend(theirs)
        else:
            self.cache = new
        for s in self._joining:
            s.cache = []  # the batch cache owns the state now
        self.seqs.extend(self._joining)
        self._joining = []

    def remove(self, uid: int) -> LayerCache | None:
        for i, s in enumerate(self._joining):
            if s.uid == uid:
                del self._joining[i]
                return s.cache
        idx = next((i for i, s in enumerate(self.seqs) if s.uid == uid), None)
        if idx is None:
            return None
        own = [layer.extract(idx) for layer in self.cache]
        keep = [i for i in range(len(self.seqs)) if i != idx]
        del self.seqs[idx]
        if keep:
            for layer in self.cache:
                layer.filter(keep)
        else:
            self.cache = []
        return own

    def step(self) -> dict[int, list[StepToken]]:
        self._merge_joining()
        if not self.seqs:
            return {}
        inputs = mx.array([s.next_token for s in self.seqs])[:, None]
        logits = self.model(inputs, cache=self.cache)[:, -1, :]
        if any(s.logits_processors for s in self.seqs):
            rows = []
            for i, s in enumerate(self.seqs):
                row = logits[i : i + 1]
                if s.logits_processors:
                    context = mx.array(s.tokens)
                    for proc in s.logits_processors:
                        row = proc(context, row)
                rows.append(row)
            logits = mx.concatenate(rows, axis=0)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = [s.sampler for s in self.seqs]
        if all(sp is samplers[0] for sp in samplers):
            sampled = samplers[0](logprobs)
        else:
            sampled = mx.concatenate(
                [sp(logprobs[i : i + 1]) for i, sp in enumerate(samplers)], axis=0
            )
        mx.eval(sampled)
        tokens: list[int] = sampled.tolist()
        out: dict[int, list[StepToken]] = {}
        for i, (s, tok) in enumerate(zip(self.seqs, tokens, strict=True)):
            s.tokens.append(tok)
            s.next_token = tok
            out[s.uid] = [
                token_with_logprobs(tok, logprobs[i], s.request.sampling.top_logprobs)
                if s.request.sampling.logprobs
                else StepToken(tok)
            ]
        return out


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
    are an exact prefix of the new prompt.
    """

    name = "lru"
    max_entries: ClassVar[int] = 64
    KEY: ClassVar[str] = "model"
    """mlx-lm's cache is keyed by model; one strategy instance serves one model."""

    def __init__(self, model: Any, size: str = "32768") -> None:
        self.model = model
        self.max_tokens, max_bytes = parse_cache_size(size)
        self.store_ = LRUPromptCache(max_size=self.max_entries, max_bytes=max_bytes or (1 << 62))
        self._hits = self._misses = self._reused = 0
        self._per_token: int | None = None

    @property
    def enabled(self) -> bool:
        """False when the configured size is zero."""
        return self.max_tokens != 0 and self.store_.max_bytes > 0

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
        cache, rest = self.store_.fetch_nearest_cache(self.KEY, tokens)
        if cache is None:
            return None, 0
        if rest:
            return cache, len(tokens) - len(rest)
        # An exact hit leaves nothing to prefill: step back one token.
        if can_trim_prompt_cache(cache):
            trim_prompt_cache(cache, 1)
            return cache, len(tokens) - 1
        cache, rest = self.store_.fetch_nearest_cache(self.KEY, tokens[:-1])
        if cache is None:
            return None, 0
        return cache, len(tokens) - 1 - len(rest)

    def store(self, tokens: Sequence[int], cache: LayerCache) -> None:
        if not self.enabled or not tokens or not cache:
            return
        if self.max_tokens is not None and self._per_token is None:
            self._per_token = max(1, sum(c.nbytes for c in cache) // len(tokens))
            self.store_.max_bytes = self.max_tokens * self._per_token
        self.store_.insert_cache(self.KEY, list(tokens), cache)

    def clear(self) -> None:
        self.store_.trim_to(n_sequences=0)

    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            reused_tokens=self._reused,
            entries=len(self.store_),
            nbytes=self.store_.nbytes,
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
