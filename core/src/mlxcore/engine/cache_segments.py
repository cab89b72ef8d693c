"""Cutting a model's per-layer cache into pieces a prefix tree can share, and back.

A prefix tree (:mod:`mlxcore.engine.prefix_tree`) stores, per node, the attention keys and
values of the node's own tokens (a :class:`Segment`: one :class:`KVPart` per attention
layer) and, for models with recurrent layers, the recurrent state after the node's last
token (a :class:`Snapshot`). Attention state grows with the context and can be cut at
any token, so entries that share a prefix share its segments; recurrent state (Qwen3.5's
GatedDeltaNet layers, Mamba) is a fixed-size summary of everything before it, so it can
only be resumed exactly where a snapshot was taken.

:class:`CacheLayout` knows which layers are which, for one model, from a fresh
``make_prompt_cache``; :meth:`CacheLayout.assemble` rebuilds a sequence's own cache from
the segments along a path and the snapshot at its end. Every array kept is an owned copy
(never a view into a sequence's or a batch's buffer), so the bytes counted are the bytes
held.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

KV = "kv"
STATE = "state"


ARRAY_OVERHEAD_BYTES = 1024
"""Memory a stored array costs beside its data: measured 715 bytes of RSS per small
array (mlx 0.32.4 CPU, Linux: its C++ header, shared buffer bookkeeping and the heap's
rounding), plus its share of the Python objects that hold it. A radix cache of short
segments holds tens of thousands of arrays; counting their data only left ~8 % of its
memory outside the budget (the soak's growth beyond the bounded caches)."""


@attrs.frozen
class KVPart:
    """One attention layer's keys and values for a run of consecutive tokens.

    Attributes:
        keys: the keys, ``(1, heads, tokens, dim)``: one array, or mlx's three arrays
            of a quantized tensor (packed values, scales, biases).
        values: the values, in the same form.
        bits: the quantization's bits (None: not quantized).
        group_size: the quantization's group size (None: not quantized).
    """

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]
    bits: int | None = None
    group_size: int | None = None

    @property
    def length(self) -> int:
        """How many tokens the part holds."""
        return int(self.keys[0].shape[-2])

    @property
    def nbytes(self) -> int:
        """Bytes held: the arrays' data and :data:`ARRAY_OVERHEAD_BYTES` for each."""
        arrays = (*self.keys, *self.values)
        return sum(int(a.nbytes) for a in arrays) + ARRAY_OVERHEAD_BYTES * len(arrays)

    def arrays(self) -> list[mx.array]:
        """Every array of the part."""
        return [*self.keys, *self.values]

    def cut(self, start: int, stop: int) -> KVPart:
        """An owned copy of tokens ``[start, stop)`` of this part."""
        return attrs.evolve(
            self,
            keys=tuple(mx.array(a[..., start:stop, :]) for a in self.keys),
            values=tuple(mx.array(a[..., start:stop, :]) for a in self.values),
        )

    def as_layer(self, length: int) -> Any:
        """An mlx-lm cache layer (``KVCache``, or ``QuantizedKVCache`` when quantized)
        whose first ``length`` tokens are this part's (the arrays are shared)."""
        if self.bits is not None:
            layer: Any = QuantizedKVCache(group_size=self.group_size or 64, bits=self.bits)
            layer.keys, layer.values = self.keys, self.values
        else:
            layer = KVCache()
            layer.keys, layer.values = self.keys[0], self.values[0]
        layer.offset = length
        return layer

    def quantized(self, bits: int, group_size: int) -> KVPart:
        """This part quantized (itself when it already is). ``mx.quantize`` works on
        groups of one token's head dimension, so a part quantized alone equals the same
        tokens quantized within a longer run."""
        if self.bits is not None:
            return self
        keys = tuple(mx.quantize(self.keys[0], group_size=group_size, bits=bits))
        values = tuple(mx.quantize(self.values[0], group_size=group_size, bits=bits))
        return KVPart(keys, values, bits, group_size)


Segment = list[KVPart | None]
"""One node's attention state: a part per attention layer, ``None`` for the others."""

Snapshot = list[Any]
"""The recurrent layers' state after a node's last token: a detached copy of each
recurrent layer's cache object, ``None`` for the attention layers."""


def segment_nbytes(segment: Segment) -> int:
    """Bytes a segment holds."""
    return sum(part.nbytes for part in segment if part is not None)


def snapshot_nbytes(snapshot: Snapshot) -> int:
    """Bytes a snapshot holds."""
    return sum(int(layer.nbytes) for layer in snapshot if layer is not None)


def split_segment(segment: Segment, at: int) -> tuple[Segment, Segment]:
    """``segment`` cut into its first ``at`` tokens and the rest (owned copies)."""
    head: Segment = []
    tail: Segment = []
    for part in segment:
        if part is None:
            head.append(None)
            tail.append(None)
        else:
            head.append(part.cut(0, at))
            tail.append(part.cut(at, part.length))
    mx.async_eval([a for s in (head, tail) for p in s if p is not None for a in p.arrays()])
    return head, tail


def _tokens_held(layer: Any) -> int:
    return int(layer.offset)


class CacheLayout:
    """Which layers of one model's cache hold attention and which hold recurrent state.

    Build it with :meth:`of` from a fresh cache; ``None`` means the cache has layers the
    tree cannot cut (sliding windows, nested caches), and such a model keeps whole
    entries instead.
    """

    def __init__(self, kinds: Sequence[str], state_types: Sequence[type | None]) -> None:
        self.kinds = list(kinds)
        self.state_types = list(state_types)

    @classmethod
    def of(cls, cache: Sequence[Any]) -> CacheLayout | None:
        """The layout of ``cache`` (a fresh ``make_prompt_cache``), or ``None``."""
        kinds: list[str] = []
        types: list[type | None] = []
        for layer in cache:
            if type(layer) in (KVCache, QuantizedKVCache):
                kinds.append(KV)
                types.append(None)
            elif isinstance(layer, ArraysCache):
                kinds.append(STATE)
                types.append(type(layer))
            else:
                return None
        return cls(kinds, types) if kinds else None

    @property
    def recurrent(self) -> bool:
        """True when some layers hold recurrent state (snapshots are needed)."""
        return STATE in self.kinds

    def fits(self, cache: Sequence[Any], length: int) -> bool:
        """True when ``cache`` has this layout and holds exactly ``length`` tokens."""
        if len(cache) != len(self.kinds):
            return False
        for layer, kind in zip(cache, self.kinds, strict=True):
            if kind == KV:
                if type(layer) not in (KVCache, QuantizedKVCache) or layer.keys is None:
                    return False
                held = _tokens_held(layer)
                if held < length or (self.recurrent and held != length):
                    return False
            elif not isinstance(layer, ArraysCache) or layer.cache[0] is None:
                return False
        return True

    def take_segment(self, cache: Sequence[Any], start: int, stop: int) -> Segment:
        """Owned copies of tokens ``[start, stop)`` of every attention layer of
        ``cache`` (the copies are scheduled, not waited for)."""
        out: Segment = []
        arrays: list[mx.array] = []
        for layer, kind in zip(cache, self.kinds, strict=True):
            if kind != KV:
                out.append(None)
                continue
            if type(layer) is QuantizedKVCache:
                quantized: Any = layer
                part = KVPart(
                    tuple(quantized.keys), tuple(quantized.values), layer.bits, layer.group_size
                )
            else:
                part = KVPart((layer.keys,), (layer.values,))
            cut = part.cut(start, stop)
            arrays.extend(cut.arrays())
            out.append(cut)
        mx.async_eval(arrays)
        return out

    def take_snapshot(self, cache: Sequence[Any]) -> Snapshot:
        """A detached copy of every recurrent layer of ``cache``."""
        out: Snapshot = []
        arrays: list[mx.array] = []
        for layer, kind in zip(cache, self.kinds, strict=True):
            if kind != STATE:
                out.append(None)
                continue
            kept = copy.copy(layer)
            kept.cache = [None if a is None else mx.array(a) for a in layer.cache]
            kept.left_padding = kept.lengths = None
            arrays.extend(a for a in kept.cache if a is not None)
            out.append(kept)
        mx.async_eval(arrays)
        return out

    def assemble(
        self, segments: Sequence[Segment], length: int, snapshot: Snapshot | None
    ) -> list[Any]:
        """A sequence's own cache holding the first ``length`` tokens of ``segments``
        (consecutive, from token 0) and, for recurrent layers, ``snapshot`` (which must
        have been taken after exactly ``length`` tokens)."""
        if self.recurrent and snapshot is None:
            raise ValueError("a model with recurrent layers resumes only at a snapshot")
        cache: list[Any] = []
        for i, kind in enumerate(self.kinds):
            if kind == STATE:
                assert snapshot is not None
                layer = copy.copy(snapshot[i])
                # new array objects: whatever the sequence writes lands in its own
                layer.cache = [None if a is None else a[...] for a in layer.cache]
                cache.append(layer)
                continue
            parts: list[KVPart] = []
            need = length
            for segment in segments:
                part = segment[i]
                assert part is not None
                if need <= 0:
                    break
                parts.append(part if part.length <= need else part.cut(0, need))
                need -= parts[-1].length
            if need > 0:
                raise ValueError(f"the segments hold {length - need} of {length} tokens")
            cache.append(_kv_layer(parts, length))
        return cache


def join_parts(parts: Sequence[KVPart]) -> KVPart:
    """Consecutive parts of one layer as one (quantized when any of them is)."""
    quant = next((p for p in parts if p.bits is not None), None)
    if quant is not None:
        assert quant.bits is not None and quant.group_size is not None
        parts = [p.quantized(quant.bits, quant.group_size) for p in parts]
    keys = tuple(_join([p.keys[j] for p in parts]) for j in range(len(parts[0].keys)))
    values = tuple(_join([p.values[j] for p in parts]) for j in range(len(parts[0].values)))
    return KVPart(keys, values, parts[0].bits, parts[0].group_size)


def _kv_layer(parts: list[KVPart], length: int) -> Any:
    """One attention layer's cache from consecutive parts (quantized when any is)."""
    return join_parts(parts).as_layer(length)


def _join(arrays: list[mx.array]) -> mx.array:
    # a new array object either way: the sequence may write into its cache, never into ours
    return arrays[0][...] if len(arrays) == 1 else mx.concatenate(arrays, axis=-2)
