"""Memory policy: MLX limits from ``--gpu-memory-utilization``, and refusing
requests whose cache could never fit.

The KV cost per token is measured once at start-up by running one token
through a fresh cache of the real model, so it is right for every architecture
(GQA, sliding windows, recurrent layers with constant state).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

log = logging.getLogger(__name__)


def physical_memory() -> int | None:
    """Total physical memory in bytes, or ``None`` when unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of cache one more token of context costs (measured with one token)."""
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    total = 0
    for layer in cache:
        keys = getattr(layer, "keys", None)
        values = getattr(layer, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim >= 3:
            total += (keys.nbytes + values.nbytes) // max(1, keys.shape[-2])
    return total


@attrs.define
class MemoryBudget:
    """How much memory MLX may use, and what a request's cache will cost.

    Attributes:
        limit: bytes MLX may use in all (``None``: no limit known).
        weights: bytes the model's weights hold.
        per_token: cache bytes per token of context.
    """

    limit: int | None
    weights: int
    per_token: int

    @classmethod
    def for_model(cls, model: Any, utilization: float) -> MemoryBudget:
        """Measure the model and set MLX's memory and cache limits."""
        total = physical_memory()
        limit = int(total * utilization) if total else None
        if limit is not None:
            mx.set_memory_limit(limit)
            mx.set_cache_limit(max(0, limit // 4))
        weights = mx.get_active_memory()
        per_token = kv_bytes_per_token(model)
        mx.clear_cache()
        log.info(
            "memory: limit %s, weights %.1f MB, cache %.1f KB per token",
            f"{limit / 2**30:.1f} GiB" if limit else "none",
            weights / 2**20,
            per_token / 2**10,
        )
        return cls(limit=limit, weights=weights, per_token=per_token)

    def max_context(self) -> int | None:
        """The longest context one sequence could ever hold, alone."""
        if self.limit is None or self.per_token <= 0:
            return None
        return max(0, (self.limit - self.weights) // self.per_token)
