"""One verification pass over a batch, and an exact per-row rollback without a replay.

Verifying ``k`` drafts feeds ``k + 1`` positions per sequence. Attention KV caches can
drop rejected positions afterwards, but the GatedDeltaNet layers keep a recurrent state
(``ArraysCache``: a convolution window and the delta-rule matrix) that cannot be undone.
:func:`forward_verify` therefore runs the Qwen3.5 trunk itself, layer by layer with
mlx-lm's own modules, except that in each GatedDeltaNet layer the recurrence advances one
position at a time (mlx-lm's ``gated_delta_update`` on one-position slices: the same
operations its sequential path runs) and keeps the state after every position. The
expensive projections still run once over all positions. :func:`rollback` then gives each
row its own accepted length: it selects the kept position's recurrent state, and moves
the rejected trailing KV entries of a row into that row's left padding
(``BatchKVCache``'s public ``state``), which is how mlx-lm's batch cache already
represents rows of different lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, dynamic_roll
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

RecurrentStates = tuple[mx.array, mx.array]
"""Per position: convolution windows (B, T, K-1, C) and delta-rule states (B, T, Hv, Dv, Dk)."""


def _gated_delta_net(
    gdn: Any, inputs: mx.array, mask: mx.array | None, cache: ArraysCache
) -> tuple[mx.array, RecurrentStates]:
    """mlx-lm's ``GatedDeltaNet.__call__``, keeping the recurrent state after every position."""
    if cache.lengths is not None:
        raise ValueError("per-position verification does not take right-padded lengths")
    batch, steps, _ = inputs.shape
    qkv = gdn.in_proj_qkv(inputs)
    z = gdn.in_proj_z(inputs).reshape(batch, steps, gdn.num_v_heads, gdn.head_v_dim)
    b = gdn.in_proj_b(inputs)
    a = gdn.in_proj_a(inputs)
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((batch, gdn.conv_kernel_size - 1, gdn.conv_dim), dtype=inputs.dtype)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    keep = gdn.conv_kernel_size - 1
    windows = mx.stack([conv_input[:, t + 1 : t + 1 + keep] for t in range(steps)], axis=1)
    conv_out = nn.silu(gdn.conv1d(conv_input))
    q, k, v = [
        t.reshape(batch, steps, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [gdn.key_dim, 2 * gdn.key_dim], -1),
            [gdn.num_k_heads, gdn.num_k_heads, gdn.num_v_heads],
            [gdn.head_k_dim, gdn.head_k_dim, gdn.head_v_dim],
            strict=True,
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=gdn.head_k_dim**-0.5, eps=1e-6)
    state = cache[1]
    outs, states = [], []
    for t in range(steps):
        step_mask = None if mask is None else mask[:, t : t + 1]
        out, state = gated_delta_update(
            q[:, t : t + 1],
            k[:, t : t + 1],
            v[:, t : t + 1],
            a[:, t : t + 1],
            b[:, t : t + 1],
            gdn.A_log,
            gdn.dt_bias,
            state,
            step_mask,
            use_kernel=not gdn.training,
        )
        outs.append(out)
        states.append(state)
    out = gdn.norm(mx.concatenate(outs, axis=1), z)
    cache[0] = windows[:, -1]
    cache[1] = states[-1]
    cache.advance(steps)
    return gdn.out_proj(out.reshape(batch, steps, -1)), (windows, mx.stack(states, axis=1))


def forward_verify(
    trunk: Any, inputs: mx.array, cache: list[Any]
) -> tuple[mx.array, list[RecurrentStates | None]]:
    """Run the Qwen3.5 text trunk over ``inputs`` (B, T).

    Returns the final-normed hidden states (B, T, H), as the trunk's own call gives, and
    per layer the recurrent states after each position (``None`` for attention layers).
    """
    h = trunk.embed_tokens(inputs)
    fa_mask = create_attention_mask(h, cache[trunk.fa_idx])
    ssm_mask = create_ssm_mask(h, cache[trunk.ssm_idx])
    recurrent: list[RecurrentStates | None] = []
    for layer, layer_cache in zip(trunk.layers, cache, strict=True):
        if layer.is_linear:
            r, states = _gated_delta_net(
                layer.linear_attn, layer.input_layernorm(h), ssm_mask, layer_cache
            )
            recurrent.append(states)
        else:
            r = layer.self_attn(layer.input_layernorm(h), fa_mask, layer_cache)
            recurrent.append(None)
        h = h + r
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return trunk.norm(h), recurrent


def rollback(
    cache: Sequence[Any],
    recurrent: Sequence[RecurrentStates | None],
    kept: Sequence[int],
    steps: int,
) -> None:
    """Keep the first ``kept[b]`` of the ``steps`` positions just fed to row ``b``."""
    drop = [steps - n for n in kept]
    if not any(drop):
        return
    rows = mx.arange(len(kept))
    last = mx.array([n - 1 for n in kept])
    for layer_cache, states in zip(cache, recurrent, strict=True):
        if isinstance(layer_cache, ArraysCache):
            if states is None:
                raise ValueError("a recurrent layer without per-position states")
            windows, deltas = states
            layer_cache[0] = windows[rows, last]
            layer_cache[1] = deltas[rows, last]
        else:
            drop_kv(layer_cache, drop)


def drop_kv(cache: Any, drop: Sequence[int]) -> None:
    """Remove the last ``drop[b]`` entries of row ``b`` of a KV cache.

    A single-row ``KVCache`` is trimmed. In a ``BatchKVCache`` the common part is trimmed
    and each row's remaining rejected entries are rotated to the front of that row, where
    a raised ``left_padding`` masks them (and lowers the row's RoPE ``offset``).
    """
    if isinstance(cache, KVCache):
        if len(drop) != 1:
            raise ValueError("a KVCache holds one row")
        cache.trim(drop[0])
        return
    if not isinstance(cache, BatchKVCache):
        raise TypeError(f"cannot roll back {type(cache).__name__} per row")
    common = min(drop)
    if common:
        cache.trim(common)
    extra = [d - common for d in drop]
    if not any(extra):
        return
    keys, values, offset, left_padding, idx = cache.state
    shifts = mx.array(extra)
    keys = dynamic_roll(keys[..., :idx, :], shifts[:, None], axis=2)
    values = dynamic_roll(values[..., :idx, :], shifts[:, None], axis=2)
    left_padding = left_padding + shifts
    offset = offset - shifts
    unused = min(left_padding.tolist())
    if unused > 0:  # every row starts later: drop the shared padding
        keys, values = keys[..., unused:, :], values[..., unused:, :]
        left_padding = left_padding - unused
        idx -= unused
    cache.state = (keys, values, offset, left_padding, idx)


class TargetVerifier:
    """The target model's verification pass for a decoder that has no trunk of its own.

    Attention-only models run their own ``__call__`` (KV caches roll back by trimming);
    Qwen3.5-style hybrids (a trunk with ``fa_idx`` / ``ssm_idx`` and GatedDeltaNet layers)
    run :func:`forward_verify` so their recurrent state can roll back per row. Other
    recurrent layouts are not supported (:meth:`supports`).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        lm = getattr(model, "language_model", model)
        trunk = getattr(lm, "model", None)
        self.per_position = all(hasattr(trunk, a) for a in ("fa_idx", "ssm_idx", "layers"))
        self.trunk = trunk
        tied = getattr(getattr(lm, "args", None), "tie_word_embeddings", False)
        self.project = (
            None if trunk is None else (trunk.embed_tokens.as_linear if tied else lm.lm_head)
        )

    def supports(self, cache: Sequence[Any]) -> bool:
        """True when a sequence with this cache can be verified and rolled back."""
        kinds = {type(layer) for layer in cache}
        if not kinds <= {KVCache, ArraysCache}:
            return False
        return ArraysCache not in kinds or self.per_position

    def __call__(
        self, inputs: mx.array, cache: list[Any]
    ) -> tuple[mx.array, list[RecurrentStates | None]]:
        """Logits (B, T, V) for ``inputs`` (B, T), and per layer the per-position
        recurrent states (``None`` for attention layers)."""
        if self.per_position and any(isinstance(layer, ArraysCache) for layer in cache):
            assert self.project is not None
            hidden, recurrent = forward_verify(self.trunk, inputs, cache)
            return self.project(hidden), recurrent
        return self.model(inputs, cache=cache), [None] * len(cache)


__all__ = ["RecurrentStates", "TargetVerifier", "drop_kv", "forward_verify", "rollback"]
