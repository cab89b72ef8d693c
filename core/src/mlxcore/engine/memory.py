"""Memory policy: MLX limits from ``--gpu-memory-utilization`` and ``--mlx-cache-limit``,
the budget admission checks live requests against, and refusing requests whose cache
could never fit.

The budget, in bytes: ``limit = total memory x utilization``; of it, the weights, MLX's
buffer cache (bounded by ``--mlx-cache-limit``) and the prefix cache's current entries
are taken first; what is left is for the caches of running requests, each counted at
its most (prompt + max_tokens tokens).

The KV cost per token is measured once at start-up by running one token
through a fresh cache of the real model, so it is right for every architecture
(GQA, sliding windows, recurrent layers with constant state).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

log = logging.getLogger(__name__)


def physical_memory() -> int | None:
    """The memory MLX's arrays live in, in bytes (``None`` when unknown): the GPU's own
    memory under MLX's CUDA backend, the machine's RAM on the CPU and on Apple silicon
    (unified memory)."""
    gpu = device_memory()
    if gpu is not None:
        return gpu
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def device_memory() -> int | None:
    """The CUDA device's memory (MLX's ``device_info()["total_memory"]``), or None on the
    CPU backend and on Metal, where arrays live in the machine's RAM."""
    if mx.default_device().type != mx.DeviceType.gpu or not mx.cuda.is_available():
        return None
    try:
        total = mx.device_info().get("total_memory")
    except (RuntimeError, AttributeError):
        return None
    return int(total) if isinstance(total, int) and total > 0 else None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on other C libraries."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


M_MMAP_THRESHOLD = -3
"""glibc ``mallopt`` parameter: the size from which allocations are memory-mapped."""

M_TRIM_THRESHOLD = -1
"""glibc ``mallopt`` parameter: free bytes at a heap's top past which it is shrunk."""

MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Buffers of this size or more are memory-mapped (glibc's own ceiling for its sliding
threshold): one that large is rare enough that mapping it fresh costs little beside
the work that fills it, and it goes back to the system when freed."""

TRIM_THRESHOLD_BYTES = 64 * 2**20
"""The free memory a heap keeps at its top before giving it back (what glibc sets
itself once its sliding threshold reaches 32 MiB)."""


@functools.cache
def tune_allocator() -> bool:
    """Fix glibc's allocation thresholds at start-up (see :data:`MMAP_THRESHOLD_BYTES`,
    :data:`TRIM_THRESHOLD_BYTES`) instead of letting them slide up from 128 KiB as large
    buffers are freed; the idle release (:func:`release_memory`) gives the heaps' free
    pages back. Mapping every buffer of 256 KiB or more (this function's earlier
    setting) cost a fresh mapping, page faults and a TLB shootdown per buffer: on a
    2-core VM in 2026-11 prefill ran 4-5x and decode 7x slower than with these
    thresholds, and a fault-free request held the engine past a 5 s watchdog.
    ``MLXCORE_MALLOC_TUNING=0`` leaves glibc's defaults. True when applied."""
    if os.environ.get("MLXCORE_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mapped = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and mapped


def release_memory() -> None:
    """Give memory nobody uses back to the system: MLX's buffer cache, then the C
    heap's free pages (glibc keeps freed buffers of a finished batch mapped otherwise:
    measured, 1.2 GB of RSS after a burst of 200 requests with MLX holding 760 MB)."""
    mx.clear_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def cache_cost(model: Any) -> tuple[int, int]:
    """What a cache of ``model`` costs, measured with one token: bytes per token of
    context (attention keys and values), and bytes that do not grow with the context
    (recurrent layers' state, as in Qwen3.5's linear-attention layers; every stored
    entry holds it once). A model that does not generate (a plugin's encoder, its
    ``mlxcore_task`` other than ``generate``) keeps no cache: nothing."""
    if not generates(model):
        return 0, 0
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    per_token = fixed = 0
    for layer in cache:
        keys = getattr(layer, "keys", None)
        values = getattr(layer, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim >= 3:
            per_token += (keys.nbytes + values.nbytes) // max(1, keys.shape[-2])
        elif keys is None and hasattr(layer, "nbytes"):
            fixed += int(layer.nbytes)
    return per_token, fixed


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of cache one more token of context costs (see :func:`cache_cost`)."""
    return cache_cost(model)[0]


@attrs.define
class MemoryBudget:
    """How much memory MLX may use, and what a request's cache will cost.

    Attributes:
        limit: bytes MLX may use in all (``None``: no limit known).
        weights: bytes the model's weights hold.
        per_token: cache bytes per token of context.
        cache_limit: bytes MLX's buffer cache may keep for reuse.
    """

    limit: int | None
    weights: int
    per_token: int
    cache_limit: int = 0
    elsewhere: Callable[[], int] | None = None
    """Bytes other models in this process hold (several models share one budget)."""
    quantized: tuple[int, int] | None = None
    """With ``--kv-cache-dtype``: (bytes per token once quantized, the context length
    from which a sequence is quantized)."""
    side_per_token: int = 0
    """Cache bytes the decoder keeps per token beside the model's own (a draft model's
    KV: :meth:`~mlxcore.engine.strategies.Decoder.side_cache_bytes_per_token`)."""

    def cost(self, tokens: int) -> int:
        """The most cache bytes a sequence of up to ``tokens`` tokens holds (the
        decoder's side cache included)."""
        side = tokens * self.side_per_token
        if self.quantized is None:
            return tokens * self.per_token + side
        per_token, start = self.quantized
        return max(min(tokens, start) * self.per_token, tokens * per_token) + side

    @classmethod
    def for_model(
        cls,
        model: Any,
        utilization: float,
        cache_limit: int,
        elsewhere: Callable[[], int] | None = None,
        kv_quant: Any = None,
    ) -> MemoryBudget:
        """Measure the model and set MLX's memory and buffer-cache limits (``elsewhere``:
        see the attribute; the weights are then this model's parameters, not all of
        MLX's active memory; ``kv_quant``: a
        :class:`~mlxcore.engine.kv_quant.KVQuantization`, or None)."""
        tune_allocator()
        total = physical_memory()
        limit = int(total * utilization) if total else None
        if limit is not None:
            mx.set_memory_limit(limit)
            cache_limit = min(cache_limit, limit // 4)
        mx.set_cache_limit(cache_limit)
        weights = parameter_bytes(model) if elsewhere else mx.get_active_memory()
        per_token = kv_bytes_per_token(model)
        quantized = None
        if kv_quant is not None:
            quantized = (kv_quant.bytes_per_token(model), kv_quant.start)
            log.info(
                "kv cache: %s, %.1f KB per token once quantized",
                kv_quant.label,
                quantized[0] / 2**10,
            )
        mx.clear_cache()
        log.info(
            "memory: limit %s, weights %.1f MB, cache %.1f KB per token, buffer cache %.0f MB",
            f"{limit / 2**30:.1f} GiB" if limit else "none",
            weights / 2**20,
            per_token / 2**10,
            cache_limit / 2**20,
        )
        return cls(limit, weights, per_token, cache_limit, elsewhere, quantized)

    def add_weights(self, nbytes: int) -> None:
        """Count ``nbytes`` more (or, negative, fewer) of weights: an adapter loaded or
        removed at run time. Called on the engine thread (from a job), so admission
        never sees half a change."""
        self.weights = max(0, self.weights + nbytes)

    def kv_budget(self, prefix_cache_bytes: int) -> int | None:
        """Bytes left for running requests' caches (``None``: no limit known)."""
        if self.limit is None:
            return None
        others = self.elsewhere() if self.elsewhere else 0
        return max(0, self.limit - self.weights - others - self.cache_limit - prefix_cache_bytes)

    def gauges(self, prefix_cache_bytes: int, reserved: int, peak: int) -> dict[str, float]:
        """The budget's ``memory_*`` gauges for ``/metrics``, given the prefix cache's
        bytes and the cache bytes admitted requests may hold now and at most so far."""
        out: dict[str, float] = {
            "memory_weights_bytes": self.weights,
            "memory_kv_reserved_bytes": reserved,
            "memory_kv_reserved_peak_bytes": peak,
            "memory_kv_bytes_per_token": self.per_token,
            "memory_side_kv_bytes_per_token": self.side_per_token,
            "memory_kv_quantized_bytes_per_token": self.quantized[0] if self.quantized else 0,
            "memory_mlx_cache_limit_bytes": self.cache_limit,
        }
        budget = self.kv_budget(prefix_cache_bytes)
        if budget is not None:
            out["memory_kv_budget_bytes"] = budget
        if self.limit is not None:
            out["memory_limit_bytes"] = self.limit
        return out

    def max_context(self) -> int | None:
        """The longest context one sequence could ever hold, alone."""
        if self.limit is None or self.per_token <= 0:
            return None
        room = max(0, self.limit - self.weights - self.cache_limit)
        if self.quantized is not None and self.quantized[0] > 0:
            longest = room // (self.quantized[0] + self.side_per_token)
            if longest >= self.quantized[1] and self.cost(longest) <= room:
                return longest
        return room // (self.per_token + self.side_per_token)


def fitted_context(asked: int | None, model: int | None, in_memory: int | None) -> int | None:
    """The context a server keeps (and says at start-up): ``--max-model-len`` when given
    (a warning when memory holds less: such requests are refused as too long for memory),
    else the model's own context, cut to what one sequence's cache can hold in the memory
    left beside the weights and MLX's buffer cache."""
    if asked:
        if in_memory is not None and asked > in_memory:
            log.warning(
                "context: --max-model-len %d, but one sequence of at most %d tokens fits in "
                "memory; longer requests are refused",
                asked,
                in_memory,
            )
        else:
            log.info("context: %d tokens (--max-model-len)", asked)
        return asked
    if in_memory is not None and (model is None or in_memory < model):
        log.info(
            "context: %d tokens, what fits in memory beside the weights (the model's own is "
            "%s); set --max-model-len to choose",
            in_memory,
            model if model is not None else "not stated",
        )
        return in_memory
    if model is not None:
        room = f"; {in_memory} would fit in memory" if in_memory is not None else ""
        log.info("context: %d tokens (the model's own%s)", model, room)
    return model


def parameter_bytes(model: Any) -> int:
    """Bytes of a model's parameters (its weights, whatever else MLX holds)."""
    from mlx.utils import tree_flatten

    leaves: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(int(v.nbytes) for _, v in leaves)


def compact_cache(cache: list[Any]) -> list[Any]:
    """Make every array of a per-layer cache own exactly its data, in place.

    A sequence's cache taken out of a batch (``BatchKVCache.extract``) or cut back to a
    prefix holds *views*: slices that keep the whole batch-sized buffer alive while
    reporting only their own size. A cache kept for later (the prefix cache) must be
    copied out, or memory grows with every batch while the accounting sees nothing.
    Plain ``KVCache`` layers are also cut to their filled length (their buffers grow in
    steps of 256 tokens). The copies are scheduled with ``mx.async_eval``: they run after
    the work already queued on the stream (a decode step in flight) without making the
    engine thread wait for it. Returns ``cache``.
    """
    arrays: list[mx.array] = []
    for layer in cache:
        _compact_layer(layer, arrays)
    mx.async_eval(arrays)
    return cache


def _compact_layer(layer: Any, out: list[mx.array]) -> None:
    full_keys: Any = getattr(layer, "keys", None)
    full_values: Any = getattr(layer, "values", None)
    if type(layer) is KVCache and full_keys is not None and layer.offset < full_keys.shape[2]:
        n = int(layer.offset)
        keys, values = mx.array(full_keys[..., :n, :]), mx.array(full_values[..., :n, :])
        layer.keys, layer.values = keys, values
        out.extend((keys, values))
        return
    if type(layer) is QuantizedKVCache and full_keys is not None:
        n = int(layer.offset)
        packed = [tuple(mx.array(x[..., :n, :]) for x in part) for part in (full_keys, full_values)]
        quantized: Any = layer
        quantized.keys, quantized.values = packed
        out.extend((*packed[0], *packed[1]))
        return
    for child in getattr(layer, "caches", ()) or ():  # CacheList
        _compact_layer(child, out)
    for name, value in list(vars(layer).items()):
        if isinstance(value, mx.array):
            copied = mx.array(value)
            setattr(layer, name, copied)
            out.append(copied)
        elif isinstance(value, list) and any(isinstance(v, mx.array) for v in value):
            copies = [mx.array(v) if isinstance(v, mx.array) else v for v in value]
            setattr(layer, name, copies)  # ArraysCache.cache
            out.extend(v for v in copies if isinstance(v, mx.array))


def generates(model: Any) -> bool:
    """Whether ``model`` generates (and so keeps a cache): every mlx-lm model; a plugin's
    model that serves another task says so with ``mlxcore_task`` (a cross-encoder:
    ``rerank``). The engine serves such a model's jobs only."""
    return getattr(model, "mlxcore_task", "generate") == "generate"
