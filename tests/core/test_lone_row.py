"""The plain decoder's batch cache gives a lone row's one-token step no mask, as mlx-lm's
own ``KVCache`` does (defaults/decoder.py): there is no padding to hide."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxcore.defaults.decoder import _merged


def filled(length: int, dim: int = 4) -> KVCache:
    cache = KVCache()
    cache.update_and_fetch(mx.ones((1, 2, length, dim)), mx.ones((1, 2, length, dim)))
    return cache


def test_a_lone_row_steps_without_a_mask_and_a_batch_with_one() -> None:
    lone = _merged([filled(5)])
    assert lone.make_mask(1) is None
    assert lone.make_mask(3) is not None  # a prompt chunk is causal
    assert lone.make_mask(1, return_array=True) is not None
    assert lone.make_mask(1, window_size=2) is not None

    pair = _merged([filled(5), filled(3)])
    mask = pair.make_mask(1)  # over the 5 cached positions and the step's own
    assert mask is not None and mask.tolist() == [[[[True] * 6]], [[[False, False] + [True] * 4]]]
    pair.filter([1])  # the shorter row alone: its padding is shifted away
    assert pair.left_padding.tolist() == [0]
    assert pair.make_mask(1) is None


def test_without_a_mask_a_lone_row_attends_as_with_the_all_true_one() -> None:
    from mlx_lm.models.base import scaled_dot_product_attention

    mx.random.seed(0)
    cache = _merged([filled(7)])
    q = mx.random.normal((1, 2, 1, 4))
    keys, values = cache.update_and_fetch(mx.random.normal((1, 2, 1, 4)), mx.ones((1, 2, 1, 4)))
    full = mx.ones((1, 1, 1, 8), dtype=mx.bool_)
    unmasked = scaled_dot_product_attention(q, keys, values, cache, scale=0.5, mask=None)
    masked = scaled_dot_product_attention(q, keys, values, cache, scale=0.5, mask=full)
    assert mx.array_equal(unmasked, masked).item()


def test_a_running_batch_of_the_subclass_is_quantized_at_the_start() -> None:
    from mlxcore.engine.kv_quant import BatchQuantizedKVCache, KVQuantization

    cache = [_merged([filled(5, 64)]), _merged([filled(5, 64), filled(3, 64)])]
    KVQuantization(bits=8, group_size=64, start=0).quantize_batch(cache)
    assert all(type(layer) is BatchQuantizedKVCache for layer in cache)
