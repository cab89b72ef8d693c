"""The plain decoder's batch cache gives a lone row's one-token step no mask, as mlx-lm's
own ``KVCache`` does (defaults/decoder.py): there is no padding to hide."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxcore.defaults.decoder import _merged


def filled(length: int) -> KVCache:
    cache = KVCache()
    cache.update_and_fetch(mx.ones((1, 2, length, 4)), mx.ones((1, 2, length, 4)))
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
