"""Quantized KV cache: ``--kv-cache-dtype int8|int4`` and ``--kv-quant-start``.

The policy is ``mlx_lm.generate``'s (``kv_bits``, ``kv_group_size``,
``quantized_kv_start``): a sequence's attention keys and values stay in the model's
dtype until its context reaches ``start`` tokens; from then on they are held as mlx's
affine quantization (``mx.quantize``: ``bits`` per value, one scale and bias per
``group_size`` values) and attention runs on them through mlx-lm's own
``quantized_scaled_dot_product_attention``, which every mlx-lm attention layer picks
when its cache has a ``bits`` attribute. Prefill converts a sequence's cache after the
chunk that reaches ``start`` (as ``generate_step`` does), so one request alone gives
exactly ``mlx_lm.generate(..., kv_bits=, quantized_kv_start=)``'s tokens.

mlx-lm has a quantized cache for one sequence (``QuantizedKVCache``) but no batch
form. :class:`BatchQuantizedKVCache` is that batch form: the same left-padded layout
as ``BatchKVCache`` (one rotary offset per row, a shared write index), holding the
three arrays of each quantized tensor. In a decode batch the switch is per batch: the
batch cache is quantized once any of its sequences reaches ``start`` (or joins with a
quantized cache), and it stays so until the batch empties. A short sequence decoded
beside a long one is therefore quantized earlier than it would be alone.

Only full attention layers (``KVCache``) are quantized; recurrent state
(``ArraysCache``, e.g. Qwen3.5's linear-attention layers) keeps its dtype. Models with
sliding-window layers (``RotatingKVCache``) or nested caches are refused at start-up,
as is any model whose attention does not run on a quantized cache (a one-token probe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    KVCache,
    QuantizedKVCache,
    _BaseCache,
    make_prompt_cache,
)

from mlxcore.errors import UsageError

KV_CACHE_DTYPES: dict[str, int | None] = {"auto": None, "int8": 8, "int4": 4}
"""``--kv-cache-dtype`` values and the bits each stands for (``auto``: the model's dtype)."""

KV_GROUP_SIZES = (32, 64, 128)
"""Group sizes ``mx.quantize`` accepts."""

PROBE_CHUNK = 41
"""Tokens in the start-up probe's prefill chunk over a quantized cache
(:meth:`KVQuantization.check_model`)."""

Parts = tuple[mx.array, ...]
"""A quantized tensor: packed values (uint32), scales, biases."""


@attrs.frozen
class KVQuantization:
    """How keys and values are quantized.

    Attributes:
        bits: bits per value (8 or 4).
        group_size: values sharing one scale and bias (along the head dimension).
        start: context length from which a sequence's cache is quantized (0: always).
    """

    bits: int
    group_size: int = 64
    start: int = 0

    @classmethod
    def from_config(cls, config: Any) -> KVQuantization | None:
        """The quantization ``config`` asks for (``None`` for ``--kv-cache-dtype auto``)."""
        name = getattr(config, "kv_cache_dtype", "auto")
        if name not in KV_CACHE_DTYPES:
            raise UsageError(
                f"--kv-cache-dtype: unknown value {name!r}; choose one of "
                + ", ".join(KV_CACHE_DTYPES)
            )
        bits = KV_CACHE_DTYPES[name]
        if bits is None:
            return None
        return cls(bits, config.kv_group_size, config.kv_quant_start)

    @property
    def label(self) -> str:
        """E.g. ``int8 (group 64, from token 0)``."""
        return f"int{self.bits} (group {self.group_size}, from token {self.start})"

    def quantize_prefill(self, cache: list[Any]) -> None:
        """Convert, in place, the attention layers of one sequence's cache that hold at
        least :attr:`start` tokens (mlx-lm's ``maybe_quantize_kv_cache``)."""
        for i, layer in enumerate(cache):
            if type(layer) is KVCache and layer.offset >= self.start:
                cache[i] = layer.to_quantized(group_size=self.group_size, bits=self.bits)

    def merge(self, layers: Sequence[Any]) -> BatchQuantizedKVCache:
        """One batch layer from the sequences' own layers (plain or quantized)."""
        return BatchQuantizedKVCache.merge(layers, self.group_size, self.bits)

    def quantize_batch(self, cache: list[Any]) -> None:
        """Convert, in place, the attention layers of a running batch cache."""
        for i, layer in enumerate(cache):
            if isinstance(layer, BatchKVCache):  # the plain decoder's subclass included
                cache[i] = BatchQuantizedKVCache.from_batch(layer, self.group_size, self.bits)

    def bytes_per_token(self, model: Any) -> int:
        """Cache bytes per token of context once quantized (measured on the model)."""
        cache = make_prompt_cache(model)
        model(mx.array([[0]]), cache=cache)
        total = 0
        for layer in cache:
            if type(layer) is KVCache:
                q: Any = layer.to_quantized(group_size=self.group_size, bits=self.bits)
                parts = [*q.keys, *q.values]
                total += sum(p.nbytes for p in parts) // max(1, q.keys[0].shape[-2])
        return total

    def check_model(self, model: Any) -> None:
        """Refuse, with a message saying why, a model that cannot decode on a quantized
        cache: sliding-window or nested cache layers, a head size the group size does not
        divide, attention that does not take a quantized cache."""
        cache = make_prompt_cache(model)
        for layer in cache:
            if type(layer) not in (KVCache, ArraysCache):
                raise UsageError(
                    f"--kv-cache-dtype int{self.bits}: this model's cache has "
                    f"{type(layer).__name__} layers (sliding-window or nested attention), "
                    "which mlxcore cannot quantize; use --kv-cache-dtype auto"
                )
        if not any(type(layer) is KVCache for layer in cache):
            raise UsageError(
                f"--kv-cache-dtype int{self.bits}: this model has no attention cache to quantize"
            )
        try:
            model(mx.array([[1, 2]]), cache=cache)
            self._check_head_sizes(cache)
            self.quantize_prefill(cache)
            model(mx.array([[3]]), cache=cache)
            # a prefill chunk over a quantized cache (a prompt resumed from a stored prefix):
            # several query rows, a shape some backends' quantized kernels lack
            model(mx.array([list(range(6, 6 + PROBE_CHUNK))]), cache=cache)
            batch = [
                self.merge([layer, layer]) if type(layer) is QuantizedKVCache
                else type(layer).merge([layer, layer])
                for layer in cache
            ]  # fmt: skip
            mx.eval(model(mx.array([[4], [5]]), cache=batch))
        except Exception as exc:
            raise UsageError(
                f"--kv-cache-dtype int{self.bits} (group size {self.group_size}): this model "
                f"cannot run on a quantized KV cache: {exc}"
            ) from exc

    def _check_head_sizes(self, cache: list[Any]) -> None:
        sizes: set[int] = set()
        for layer in cache:
            parts: Any = (layer.keys, layer.values) if type(layer) is KVCache else ()
            sizes.update(int(part.shape[-1]) for part in parts if part is not None)
        bad = sorted(d for d in sizes if d % self.group_size)
        if bad:
            fits = [g for g in KV_GROUP_SIZES if all(d % g == 0 for d in sizes)]
            hint = f"use --kv-group-size {fits[-1]}" if fits else "use --kv-cache-dtype auto"
            raise UsageError(
                f"--kv-cache-dtype int{self.bits}: this model's attention head size {bad[0]} "
                f"is not a multiple of --kv-group-size {self.group_size}; {hint}"
            )


def _empty(batch: int, heads: int, length: int, dim: int, dtype: Any, q: tuple[int, int]) -> Parts:
    """Zeros in quantized form for ``length`` positions of ``dim`` values each."""
    group_size, bits = q
    return (
        mx.zeros((batch, heads, length, dim * bits // 32), dtype=mx.uint32),
        mx.zeros((batch, heads, length, dim // group_size), dtype=dtype),
        mx.zeros((batch, heads, length, dim // group_size), dtype=dtype),
    )


def _dim(parts: Parts, group_size: int) -> int:
    """The unquantized size of the last axis."""
    return parts[1].shape[-1] * group_size


def _as_quantized(layer: Any, group_size: int, bits: int) -> tuple[Parts, Parts] | None:
    """A sequence layer's keys and values, quantized, cut to its length (None: empty)."""
    if layer.keys is None or layer.offset == 0:
        return None
    n = layer.offset
    if not hasattr(layer, "bits"):  # a plain KVCache
        keys, values = layer.keys[..., :n, :], layer.values[..., :n, :]
        return (
            mx.quantize(keys, group_size=group_size, bits=bits),
            mx.quantize(values, group_size=group_size, bits=bits),
        )
    cut = [tuple(x[..., :n, :] for x in parts) for parts in (layer.keys, layer.values)]
    if (layer.group_size, layer.bits) == (group_size, bits):
        return cut[0], cut[1]
    requant = [
        mx.quantize(
            mx.dequantize(
                parts[0], parts[1], parts[2], group_size=layer.group_size, bits=layer.bits
            ),
            group_size=group_size,
            bits=bits,
        )
        for parts in cut
    ]
    return requant[0], requant[1]


class BatchQuantizedKVCache(_BaseCache):
    """Quantized keys and values for a batch of left-padded sequences.

    The layout is ``BatchKVCache``'s: ``left_padding`` per row, ``offset`` per row (the
    rotary position of the next token), ``_idx`` the shared write index; keys and values
    are each a triple (packed values, scales, biases) of shape ``(B, heads, length, *)``.
    ``bits`` / ``group_size`` make mlx-lm's attention take its quantized path.
    """

    step = 256

    def __init__(self, left_padding: list[int], group_size: int, bits: int) -> None:
        self.keys: Any = None
        """None, or (packed values, scales, biases), each ``(B, heads, capacity, *)``."""
        self.values: Any = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self.group_size = group_size
        self.bits = bits

    # -- attention ---------------------------------------------------------------

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Parts, Parts]:
        """Quantize and append ``keys`` / ``values`` (B, heads, n, dim); return all."""
        n = keys.shape[2]
        prev = self._idx
        if self.keys is None or self.values is None or prev + n > self.keys[0].shape[2]:
            extra = (n + self.step - 1) // self.step * self.step
            shape = (keys.shape[0], keys.shape[1], extra)
            q = (self.group_size, self.bits)
            new_k = _empty(*shape, keys.shape[3], keys.dtype, q)
            new_v = _empty(*shape, values.shape[3], values.dtype, q)
            if self.keys is None or self.values is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = _concat(_cut(self.keys, prev), new_k)
                self.values = _concat(_cut(self.values, prev), new_v)
        self._idx += n
        self.offset = self.offset + n
        for stored, new in ((self.keys, keys), (self.values, values)):
            parts = mx.quantize(new, group_size=self.group_size, bits=self.bits)
            for target, part in zip(stored, parts, strict=True):
                target[..., prev : self._idx, :] = part
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Parts, Parts]:
        """The filled part of the keys and values."""
        assert self.keys is not None and self.values is not None
        return _cut(self.keys, self._idx), _cut(self.values, self._idx)

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        """The causal mask hiding each row's left padding (``BatchKVCache``'s)."""
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # -- batch membership ----------------------------------------------------------

    @classmethod
    def merge(cls, layers: Sequence[Any], group_size: int, bits: int) -> BatchQuantizedKVCache:
        """A batch cache from per-sequence layers (``KVCache`` or ``QuantizedKVCache``),
        left-padded to the longest."""
        quantized = [_as_quantized(layer, group_size, bits) for layer in layers]
        lengths = [
            layer.offset if q is not None else 0 for layer, q in zip(layers, quantized, strict=True)
        ]
        longest = max(lengths, default=0)
        cache = cls([longest - n for n in lengths], group_size, bits)
        filled = [q for q in quantized if q is not None]
        if not filled:
            return cache
        k0, v0 = filled[0]
        heads, dtype = k0[0].shape[1], k0[1].dtype
        q = (group_size, bits)
        keys = _empty(len(layers), heads, longest, _dim(k0, group_size), dtype, q)
        values = _empty(len(layers), heads, longest, _dim(v0, group_size), dtype, q)
        for row, (n, kv) in enumerate(zip(lengths, quantized, strict=True)):
            if kv is None:
                continue
            for stored, parts in zip((keys, values), kv, strict=True):
                for target, part in zip(stored, parts, strict=True):
                    target[row : row + 1, :, longest - n :] = part
        cache.keys, cache.values = keys, values
        cache._idx = longest
        cache.offset = cache.offset + longest
        return cache

    @classmethod
    def from_batch(cls, layer: BatchKVCache, group_size: int, bits: int) -> BatchQuantizedKVCache:
        """Quantize a running ``BatchKVCache`` (same rows, padding and positions)."""
        cache = cls([], group_size, bits)
        cache.left_padding, cache.offset, cache._idx = layer.left_padding, layer.offset, layer._idx
        if layer.keys is not None:
            n = layer._idx
            cache.keys = mx.quantize(layer.keys[..., :n, :], group_size=group_size, bits=bits)
            cache.values = mx.quantize(layer.values[..., :n, :], group_size=group_size, bits=bits)
        return cache

    def filter(self, batch_indices: Any) -> None:
        """Keep only the given rows (in place), dropping padding no row needs."""
        if self.keys is not None and self.values is not None:
            self.keys = tuple(x[batch_indices] for x in self.keys)
            self.values = tuple(x[batch_indices] for x in self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        trim = _int(mx.min(self.left_padding))
        if trim > 0:
            if self.keys is not None and self.values is not None:
                self.keys = tuple(x[..., trim:, :] for x in self.keys)
                self.values = tuple(x[..., trim:, :] for x in self.values)
            self._idx -= trim
            self.left_padding = self.left_padding - trim

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append ``other``'s rows (in place), right-aligning both at the write index."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        template = self if self.keys is not None else other
        assert template.keys is not None and template.values is not None

        def aligned(c: BatchQuantizedKVCache) -> tuple[Parts, Parts, mx.array]:
            rows = c.offset.shape[0]
            if c.keys is None or c.values is None:
                keys = tuple(
                    mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]), x.dtype) for x in template.keys
                )
                values = tuple(
                    mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]), x.dtype) for x in template.values
                )
            else:
                keys, values = c.keys, c.values
            left = idx - c._idx
            right = size - keys[0].shape[2] - left
            keys = tuple(_pad(x, left, right) for x in keys)
            values = tuple(_pad(x, left, right) for x in values)
            return keys, values, c.left_padding + left

        (k1, v1, p1), (k2, v2, p2) = aligned(self), aligned(other)
        self.keys, self.values = _concat(k1, k2, axis=0), _concat(v1, v2, axis=0)
        self.left_padding = mx.concatenate([p1, p2])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row ``idx`` as mlx-lm's one-sequence ``QuantizedKVCache`` (its own copy)."""
        cache: Any = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        if self.keys is None or self.values is None:
            return cache
        pad = _int(self.left_padding[idx])
        cache.keys = tuple(mx.contiguous(x[idx : idx + 1, :, pad : self._idx]) for x in self.keys)
        cache.values = tuple(
            mx.contiguous(x[idx : idx + 1, :, pad : self._idx]) for x in self.values
        )
        cache.offset = self._idx - pad
        return cache

    # -- bookkeeping -------------------------------------------------------------------

    @property
    def state(self) -> Any:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, value: Any) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = value

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))


def _int(x: mx.array) -> int:
    """A one-element integer array as a Python int."""
    value: Any = x.item()
    return int(value)


def _cut(parts: Parts, n: int) -> Parts:
    return tuple(x[..., :n, :] for x in parts)


def _concat(a: Parts, b: Parts, axis: int = 2) -> Parts:
    return tuple(mx.concatenate([x, y], axis=axis) for x, y in zip(a, b, strict=True))


def _pad(x: mx.array, left: int, right: int) -> mx.array:
    if right < 0:
        x, right = x[..., :right, :], 0
    if left == 0 and right == 0:
        return x
    return mx.pad(x, [(0, 0), (0, 0), (left, right), (0, 0)])
