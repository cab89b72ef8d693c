"""Built-in plugin: the default strategies (chunked prefill, plain batched decode
from :mod:`mlxcore.builtin.decoder`, the LRU prefix cache from
:mod:`mlxcore.builtin.prefix_cache`). Registered like any
plugin, offered last, so a plugin's own strategy for a model takes precedence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcore import hookimpl
from mlxcore.builtin.decoder import PlainDecoder
from mlxcore.builtin.prefix_cache import LRUPrefixCache, parse_cache_size
from mlxcore.builtin.radix_cache import RadixPrefixCache, prefix_cache_for
from mlxcore.config import ServerConfig
from mlxcore.engine.batch_prefill import cache_is_batchable, prefill_together
from mlxcore.engine.cache_explain import EXPLAIN_OPTION
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.strategies import (
    CacheStrategy,
    Decoder,
    PrefillGenerator,
    PrefillResult,
    PrefillStrategy,
    PrefillTask,
)
from mlxcore.errors import OptionError
from mlxcore.model_info import ModelInfo

__all__ = [
    "ChunkedPrefill",
    "LRUPrefixCache",
    "PlainDecoder",
    "RadixPrefixCache",
    "parse_cache_size",
    "prefix_cache_for",
]

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
    runs_in_lockstep = True

    def __init__(
        self, model: Any, step_size: int = 2048, kv_quant: KVQuantization | None = None
    ) -> None:
        self.model = model
        self.step_size = step_size
        self.kv_quant = kv_quant
        """Quantize the cache after the chunk that reaches its start (``--kv-cache-dtype``)."""
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
        if self.kv_quant is not None and len(request.prompt_tokens) - 1 >= self.kv_quant.start:
            return False  # quantized after its body: prefilled alone, as mlx-lm does
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
            if self.kv_quant is not None:
                self.kv_quant.quantize_prefill(task.cache)
            mx.eval([c.state for c in task.cache])
            done += n
            if done in stops and task.snapshot is not None:
                task.snapshot(task.start + done)
            yield done
        logits = self.model(tokens[:, body:], cache=task.cache)[:, -1, :]
        return PrefillResult(logits=logits)


@hookimpl
def mlxcore_request_options() -> list[str]:
    """The core's own request fields: ``batched_prefill``, ``explain_cache``."""
    return [BATCH_OPTION, EXPLAIN_OPTION]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """The core's own request options are booleans: ``batched_prefill``, ``explain_cache``."""
    for name in (BATCH_OPTION, EXPLAIN_OPTION):
        if name in options and not isinstance(options[name], bool):
            raise OptionError(name, f"{name} must be true or false, got {options[name]!r}")


@hookimpl(trylast=True)
def mlxcore_prefill_strategy(model: Any, info: ModelInfo, config: ServerConfig) -> PrefillStrategy:
    """The default: chunked prefill with ``--prefill-step-size``."""
    return ChunkedPrefill(model, config.prefill_step_size, KVQuantization.from_config(config))


@hookimpl(trylast=True)
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> Decoder:
    """The default: plain batched decoding."""
    return PlainDecoder(model, KVQuantization.from_config(config))


@hookimpl(trylast=True)
def mlxcore_cache_strategy(
    model: Any, info: ModelInfo, config: ServerConfig
) -> list[CacheStrategy]:
    """The default: a radix-tree prefix cache of ``--prefix-cache-size`` (``radix``);
    ``--cache-strategy lru`` picks whole entries in mlx-lm's LRU instead, the only choice
    for models whose cache cannot be cut into segments."""
    if config.cache_strategy == LRUPrefixCache.name:
        return [LRUPrefixCache(model, size=config.prefix_cache_size)]
    return [prefix_cache_for(model, config.prefix_cache_size)]
