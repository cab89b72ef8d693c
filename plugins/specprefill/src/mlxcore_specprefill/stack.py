"""Run a model's decoder layers on chosen tokens at explicit RoPE positions.

mlx-lm's attention modules take their RoPE offset from ``cache.offset``, so a stock
forward pass can only place a chunk of tokens at consecutive positions. Sparse
prefill needs each kept token at its own position, so :class:`TextStack` composes
the model's public pieces (embedding, norms, projections, the layer's own ``rope``
module, MLP, GatedDeltaNet mixer) and passes a position per token.

The structure is recognised from the modules present, not from the model's name:

* decoder layers with ``input_layernorm``, ``post_attention_layernorm``, ``mlp`` and
  either ``self_attn`` or ``linear_attn`` (a recurrent GatedDeltaNet-style mixer that
  consumes tokens in order and has no positions);
* attention with ``q_proj``/``k_proj``/``v_proj``/``o_proj`` and a ``rope`` module,
  optional ``q_norm``/``k_norm`` (Qwen3) and an optional output gate packed into
  ``q_proj`` (Qwen3-Next / Qwen3.5: ``q_proj`` produces twice the query width);
* optional attention sinks (a per-head ``sinks`` array, GPT-OSS) and a ``scale`` or
  ``sm_scale`` attribute;
* per-layer caches that are plain ``KVCache`` (attention), ``RotatingKVCache`` with
  ``keep=0`` (a sliding-window attention layer, GPT-OSS style: its window is the
  cache's ``max_size``) or ``ArraysCache`` (recurrent); quantized caches are refused.

A sliding-window layer masks by *position*: a token at position ``p`` sees the keys
at positions ``p - window + 1 .. p`` among those in the cache, whatever their number.

:func:`probe` then checks the composition numerically against the model's own
forward pass, so a layer that matches the names but computes something else is
refused rather than silently mis-run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

Observer = Callable[[int, mx.array, mx.array, float], None]
"""Called per attention layer as ``(layer_index, queries, keys, scale)``: queries
``(1, H, L, D)`` after RoPE, keys ``(1, Hkv, T, D)`` of the whole cache after the update."""


class Unsupported(Exception):
    """The model's structure is not one this module can run; the message says why."""


_LAYER_PARTS = {"input_layernorm", "post_attention_layernorm", "mlp"}
_MIXERS = {"self_attn", "linear_attn"}
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "rope")


@attrs.define
class AttentionShape:
    """What the composed attention needs to know about one ``self_attn`` module."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    gated: bool
    scale: float
    window: int | None = None
    """Sliding-window size in positions, or ``None`` for full attention."""


@attrs.define
class TextStack:
    """The decoder layers of a causal LM, runnable at explicit positions.

    Attributes:
        model: the mlx-lm model (its own ``__call__`` still computes the logits).
        embed: the token embedding module.
        layers: the decoder layers, in order.
        shapes: per layer, the attention shape, or ``None`` for a recurrent layer.
    """

    model: Any
    embed: Any
    layers: list[Any]
    shapes: list[AttentionShape | None]

    @property
    def attention_layers(self) -> list[int]:
        """Indices of the attention (positional) layers."""
        return [i for i, s in enumerate(self.shapes) if s is not None]

    @property
    def window(self) -> int:
        """The largest sliding window of any layer (0 when every layer sees everything)."""
        return max((s.window or 0 for s in self.shapes if s is not None), default=0)

    def check_cache(self, cache: Sequence[Any]) -> None:
        """Raise :class:`Unsupported` unless ``cache`` is one this module can fill."""
        if len(cache) != len(self.layers):
            raise Unsupported(f"cache has {len(cache)} entries for {len(self.layers)} layers")
        for i, (shape, c) in enumerate(zip(self.shapes, cache, strict=True)):
            if shape is not None and shape.window is not None:
                if type(c) is not RotatingKVCache or c.keep or c.max_size != shape.window:
                    raise Unsupported(
                        f"layer {i}: sliding-window cache {type(c).__name__} is not a "
                        f"RotatingKVCache(max_size={shape.window}, keep=0)"
                    )
            elif shape is not None and type(c) is not KVCache:
                raise Unsupported(f"layer {i}: attention cache {type(c).__name__} is not KVCache")
            if shape is None and not isinstance(c, ArraysCache):
                raise Unsupported(f"layer {i}: recurrent cache {type(c).__name__} unsupported")

    def forward(
        self,
        tokens: mx.array,
        positions: mx.array,
        cache: Sequence[Any],
        observer: Observer | None = None,
        past: mx.array | None = None,
    ) -> mx.array:
        """Run ``tokens`` (shape ``(1, L)``) through every layer, appending to ``cache``.

        Token ``i`` is rotated at ``positions[i]``; attention is causal in cache order
        (kept tokens are appended in their original order). ``past`` holds the
        positions of the entries already in the cache, in order; sliding-window layers
        need it (default: consecutive positions just before ``positions[0]``). The
        observer sees full-attention layers only. Returns the last hidden states
        (before the final norm).
        """
        h = self.embed(tokens)
        full = [i for i in self.attention_layers if self.shapes[i].window is None]  # type: ignore[union-attr]
        attn_mask = create_attention_mask(h, cache[full[0]]) if full else None
        if self.window and past is None:
            first = int(cast(int, positions[0].item()))
            past = mx.arange(max(0, first - self.window), first, dtype=mx.int32)
        ssm_idx = next((i for i, s in enumerate(self.shapes) if s is None), None)
        ssm_mask = create_ssm_mask(h, cache[ssm_idx]) if ssm_idx is not None else None
        for i, (layer, shape, c) in enumerate(zip(self.layers, self.shapes, cache, strict=True)):
            x = layer.input_layernorm(h)
            if shape is None:
                r = layer.linear_attn(x, ssm_mask, c)
            else:
                mask = attn_mask
                if shape.window is not None:
                    mask = _PositionWindow(shape.window, positions, past)
                r = _attend(layer.self_attn, shape, x, positions, c, mask, observer, i)
            h = h + r
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h

    def shift_positions(self, cache: Sequence[Any], count: int, delta: int) -> None:
        """Re-rotate the first ``count`` cached keys of each attention layer by ``delta``
        positions (RoPE rotations compose: R(a) R(b) = R(a + b))."""
        if count <= 0 or delta == 0:
            return
        for i in self.attention_layers:
            c = cache[i]
            rope = self.layers[i].self_attn.rope
            head = c.keys[..., :count, :]
            moved = _rope_at(rope, head, mx.full((count,), delta, dtype=mx.int32))
            moved = moved / _rope_input_scale(rope, head.shape[-1], head.dtype)
            c.keys = mx.concatenate([moved.astype(head.dtype), c.keys[..., count:, :]], axis=2)


def detect(model: Any) -> TextStack:
    """Recognise ``model``'s structure; raise :class:`Unsupported` with the reason."""
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    layers = list(getattr(model, "layers", None) or getattr(inner, "layers", None) or [])
    if embed is None or not layers:
        raise Unsupported(
            f"{type(model).__name__}: no model.embed_tokens and decoder layers found "
            "(another layout, e.g. Nemotron-H's backbone of mixer blocks: a target only, "
            "never a draft)"
        )
    shapes: list[AttentionShape | None] = []
    for i, layer in enumerate(layers):
        if getattr(layer, "use_sliding", False):  # Gemma style: windows from a layer flag
            raise Unsupported(f"layer {i} uses sliding-window attention")
        children = set(layer.children())
        missing = _LAYER_PARTS - children
        extra = children - _LAYER_PARTS - _MIXERS
        mixers = children & _MIXERS
        if missing or extra or len(mixers) != 1:
            raise Unsupported(
                f"layer {i} ({type(layer).__name__}) has parts {sorted(children)}; expected "
                "input_layernorm, post_attention_layernorm, mlp and self_attn or linear_attn"
            )
        if "linear_attn" in mixers:
            shapes.append(None)
        else:
            shapes.append(_attention_shape(layer.self_attn, i))
    if not any(s is not None for s in shapes):
        raise Unsupported("the model has no attention layers to score or place")
    cache = make_prompt_cache(model)
    for shape, c in zip(shapes, cache, strict=False):
        if shape is not None and type(c) is RotatingKVCache:
            shape.window = int(c.max_size)
    stack = TextStack(model=model, embed=embed, layers=layers, shapes=shapes)
    stack.check_cache(cache)
    return stack


def probe(stack: TextStack, length: int = 12, atol: float = 1e-3) -> None:
    """Check the composed layers against the model's own forward pass on a short
    sequence; raise :class:`Unsupported` if they disagree."""
    vocab = int(stack.embed.weight.shape[0])
    tokens = (mx.arange(length, dtype=mx.int32) * 7919 + 11) % max(2, vocab - 1)
    tokens = tokens[None]
    ref_cache = make_prompt_cache(stack.model)
    ref = stack.model(tokens, cache=ref_cache)[:, -1, :].astype(mx.float32)
    cache = make_prompt_cache(stack.model)
    try:
        stack.forward(tokens[:, :-1], mx.arange(length - 1, dtype=mx.int32), cache)
        out = stack.model(tokens[:, -1:], cache=cache)[:, -1, :].astype(mx.float32)
        err = _scalar(mx.abs(out - ref).max())
    except Exception as exc:  # any failure means "not a structure we can run"
        raise Unsupported(f"composed forward failed: {type(exc).__name__}: {exc}") from exc
    scale = max(1.0, _scalar(mx.abs(ref).max()))
    if not err <= atol * scale * 10:
        raise Unsupported(f"composed forward disagrees with the model (max |diff| {err:.3g})")


def _scalar(x: mx.array) -> float:
    return float(cast(float, x.item()))


def _attention_shape(attn: Any, i: int) -> AttentionShape:
    absent = [p for p in _ATTN_PARTS if getattr(attn, p, None) is None]
    if absent:
        raise Unsupported(f"layer {i}: attention {type(attn).__name__} lacks {absent}")
    scale = getattr(attn, "scale", None)
    if not isinstance(scale, int | float):
        scale = getattr(attn, "sm_scale", None)
    if not isinstance(scale, int | float):
        raise Unsupported(f"layer {i}: attention has no numeric scale / sm_scale")
    n_heads = _first_int(attn, "n_heads", "num_attention_heads", "num_heads")
    n_kv = _first_int(attn, "n_kv_heads", "num_key_value_heads", "num_kv_heads")
    head_dim = _first_int(attn, "head_dim")
    q_norm = getattr(attn, "q_norm", None)
    if head_dim is None and q_norm is not None:
        head_dim = int(q_norm.weight.shape[0])
    if n_heads is None or n_kv is None or head_dim is None:
        raise Unsupported(f"layer {i}: cannot read head counts / head_dim of attention")
    q_out = int(attn.q_proj.weight.shape[0])
    if q_out == n_heads * head_dim:
        gated = False
    elif q_out == 2 * n_heads * head_dim:
        gated = True
    else:
        raise Unsupported(f"layer {i}: q_proj width {q_out} fits neither plain nor gated query")
    return AttentionShape(
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, gated=gated, scale=float(scale)
    )


def _first_int(obj: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int):
            return value
    return None


def _rope_at(rope: Any, x: mx.array, positions: mx.array) -> mx.array:
    """Apply ``rope`` to ``x`` ``(1, H, L, D)`` with token ``i`` at ``positions[i]``:
    the tokens go on the batch axis, where ``mx.fast.rope`` takes one offset each."""
    rotated = rope(x.transpose(2, 1, 0, 3), offset=positions)
    return rotated.transpose(2, 1, 0, 3)


def _rope_input_scale(rope: Any, dim: int, dtype: Any) -> mx.array:
    """The per-channel factor a rope module multiplies its input by (YaRN / LongRoPE
    ``mscale``; 1 elsewhere): its output at position 0 for an all-ones input."""
    return rope(mx.ones((1, 1, 1, dim), dtype=mx.float32), offset=0).astype(dtype)


@attrs.frozen(eq=False)
class _PositionWindow:
    """A sliding-window mask by position: the cache returns its last entries (up to
    ``window - 1`` old ones, then the new ones, in order), whose positions are the
    tail of ``past`` followed by ``positions``."""

    window: int
    positions: mx.array
    past: mx.array | None

    def array(self, n_keys: int) -> mx.array:
        """Boolean ``(L, n_keys)``: query ``i`` may see key ``j``."""
        length = self.positions.shape[0]
        old = n_keys - length
        parts = [self.positions]
        if old > 0:
            if self.past is None or self.past.shape[0] < old:
                raise Unsupported("positions of the cached sliding-window entries unknown")
            parts.insert(0, self.past[self.past.shape[0] - old :])
        keys = mx.concatenate(parts)[None]
        queries = self.positions[:, None]
        return (keys <= queries) & (keys > queries - self.window)


def _attend(
    attn: Any,
    shape: AttentionShape,
    x: mx.array,
    positions: mx.array,
    cache: Any,
    mask: Any,
    observer: Observer | None,
    index: int,
) -> mx.array:
    """The attention of ``attn`` with explicit per-token RoPE positions."""
    from mlx_lm.models.base import scaled_dot_product_attention

    B, L, _ = x.shape
    q = attn.q_proj(x)
    gate = None
    if shape.gated:
        q, gate = mx.split(q.reshape(B, L, shape.n_heads, -1), 2, axis=-1)
        gate = gate.reshape(B, L, -1)
    q = q.reshape(B, L, shape.n_heads, -1)
    k = attn.k_proj(x).reshape(B, L, shape.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(B, L, shape.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None:
        q = q_norm(q)
    if k_norm is not None:
        k = k_norm(k)
    q = _rope_at(attn.rope, q.transpose(0, 2, 1, 3), positions)
    k = _rope_at(attn.rope, k.transpose(0, 2, 1, 3), positions)
    if isinstance(mask, _PositionWindow):
        if L == 1:  # a rotating cache's in-place update does not return keys in order
            raise Unsupported("a single-token step through a sliding-window layer")
        keys, values = cache.update_and_fetch(k, v)
        mask = mask.array(keys.shape[2])
    else:
        keys, values = cache.update_and_fetch(k, v)
        if observer is not None:
            observer(index, q, keys, shape.scale)
    sinks = getattr(attn, "sinks", None)
    out = scaled_dot_product_attention(
        q, keys, values, cache=cache, scale=shape.scale, mask=mask, sinks=sinks
    )
    out = out.transpose(0, 2, 1, 3).reshape(B, L, -1)
    if gate is not None:
        out = out * mx.sigmoid(gate)
    return attn.o_proj(out)
