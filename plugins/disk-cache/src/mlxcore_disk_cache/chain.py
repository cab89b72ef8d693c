"""Chained disk entries: the part of a radix-tree path a file holds, and back.

A chained entry's file holds, per layer, the attention keys and values of its own tokens
(a ``KVCache`` or ``QuantizedKVCache`` holding only them) and, for recurrent layers, the
state after its last token (the ``ArraysCache`` the tree's snapshot keeps); mlx-lm's
``save_prompt_cache`` / ``load_prompt_cache`` write and read it. The memory tier's
:class:`~mlxcore.engine.cache_segments.CacheLayout` rebuilds a sequence's cache from the
files of an entry and its parents.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import QuantizedKVCache

from mlxcore.engine.cache_segments import KV, STATE, CacheLayout, KVPart, Segment, Snapshot
from mlxcore_disk_cache.store import CorruptEntry


def file_layers(
    layout: CacheLayout, segment: Segment, snapshot: Snapshot | None, length: int
) -> list[Any]:
    """The per-layer caches to save for ``segment`` (``length`` tokens) and, on a
    recurrent model, ``snapshot``."""
    out: list[Any] = []
    for i, kind in enumerate(layout.kinds):
        if kind == STATE:
            if snapshot is None:
                raise ValueError("a recurrent model's entry needs its snapshot")
            out.append(snapshot[i])
            continue
        part = segment[i]
        assert part is not None and part.length == length
        out.append(part.as_layer(length))
    return out


def segment_of(layout: CacheLayout, layers: list[Any], length: int) -> Segment:
    """The attention state of a loaded file (which must hold ``length`` tokens)."""
    if len(layers) != len(layout.kinds):
        raise CorruptEntry("its cache layout is not this model's")
    out: Segment = []
    for layer, kind in zip(layers, layout.kinds, strict=True):
        if kind != KV:
            out.append(None)
            continue
        if int(getattr(layer, "offset", -1)) != length or layer.keys is None:
            raise CorruptEntry(f"an attention layer does not hold its {length} tokens")
        if type(layer) is QuantizedKVCache:
            quantized: Any = layer
            keys = tuple(a[..., :length, :] for a in quantized.keys)
            values = tuple(a[..., :length, :] for a in quantized.values)
            out.append(KVPart(keys, values, layer.bits, layer.group_size))
        else:
            keys1, values1 = layer.keys[..., :length, :], layer.values[..., :length, :]
            out.append(KVPart((keys1,), (values1,)))
    return out


def snapshot_of(layout: CacheLayout, layers: list[Any]) -> Snapshot | None:
    """The recurrent state of a loaded file (None for a model without recurrent layers)."""
    if not layout.recurrent:
        return None
    return [
        layer if kind == STATE else None for layer, kind in zip(layers, layout.kinds, strict=True)
    ]
