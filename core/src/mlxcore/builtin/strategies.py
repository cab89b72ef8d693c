"""Built-in plugin: offers the default strategies of :mod:`mlxcore.defaults` (chunked
prefill, plain batched decode, the LRU or radix prefix cache). Registered like any
plugin, offered last, so a plugin's own strategy for a model takes precedence.
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.defaults.chunked_prefill import BATCH_OPTION, ChunkedPrefill
from mlxcore.defaults.decoder import PlainDecoder
from mlxcore.defaults.prefix_cache import LRUPrefixCache, NoPrefixCache
from mlxcore.defaults.radix_cache import prefix_cache_for
from mlxcore.engine.cache_explain import EXPLAIN_OPTION
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.memory import generates
from mlxcore.engine.strategies import CacheStrategy, Decoder, PrefillStrategy
from mlxcore.errors import OptionError
from mlxcore.model_info import ModelInfo


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
    if not generates(model):
        return [NoPrefixCache()]
    if config.cache_strategy == LRUPrefixCache.name:
        return [LRUPrefixCache(model, size=config.prefix_cache_size)]
    return [prefix_cache_for(model, config.prefix_cache_size, distributed=config.distributed)]
