"""Targets without positional encoding: the sparse prefill is the model's own forward pass.

Nemotron-H (mlx-lm ``nemotron_h``) stacks blocks of ``norm`` + ``mixer``, the mixer
being a Mamba-2 layer, attention **without** RoPE, or a feed-forward MLP / MoE. No
part of it reads an absolute position: attention compares keys and queries by content
only (its causal mask comes from the cache's length), the Mamba-2 mixers consume
tokens in order from a recurrent state, and the feed-forward blocks are token-wise.
A prefill with only the kept prompt tokens is therefore exactly the model's own
forward pass over those tokens, in order; the cache then holds them and decoding
continues with no position bookkeeping (there is nothing to re-rotate).

:class:`SequentialStack` offers the interface the strategy uses for a
:class:`~.stack.TextStack` target (``check_cache``, ``window``, ``shift_positions``,
``forward``) with positions ignored. It is recognised by structure
(:func:`detect_sequential`): every layer is ``norm`` + ``mixer`` of a known kind, no
attention mixer has a ``rope`` and no module of the model is a positional encoding.
:func:`probe_sequential` then checks numerically that each attention mixer is blind
to token order (permuting its input rows permutes its output rows: a RoPE or ALiBi
would break that) and that the model's forward pass resumes from its cache exactly.
Such models can be targets only: the draft's scoring reads attention through a
:class:`~.stack.TextStack`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias, cast

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

from mlxcore_specprefill.stack import Observer, TextStack, Unsupported, detect, probe

_BLOCK_PARTS = {"norm", "mixer"}
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MAMBA = {"in_proj", "conv1d", "out_proj"}
_MLP = {"up_proj", "down_proj"}
_MOE = {"gate", "switch_mlp"}
_POSITIONAL = (nn.RoPE, nn.ALiBi, nn.SinusoidalPositionalEncoding)

ATTENTION, RECURRENT, FEED_FORWARD = "attention", "recurrent", "feed-forward"


@attrs.define
class SequentialStack:
    """A causal LM whose layers carry no positions, run through its own forward pass.

    Attributes:
        model: the mlx-lm model.
        embed: its token embedding module.
        layers: its blocks, in order.
        kinds: per block, ``"attention"``, ``"recurrent"`` or ``"feed-forward"``.
    """

    model: Any
    embed: Any
    layers: list[Any]
    kinds: list[str]

    window = 0
    """No sliding windows: every cache holds all the tokens it was given."""

    @property
    def cached_kinds(self) -> list[str]:
        """The kinds of the blocks that own a cache entry, in cache order."""
        return [k for k in self.kinds if k != FEED_FORWARD]

    def check_cache(self, cache: Sequence[Any]) -> None:
        """Raise :class:`Unsupported` unless ``cache`` has one plain ``KVCache`` per
        attention block and one ``ArraysCache`` per recurrent block, in order."""
        kinds = self.cached_kinds
        if len(cache) != len(kinds):
            raise Unsupported(f"cache has {len(cache)} entries for {len(kinds)} cached blocks")
        for i, (kind, c) in enumerate(zip(kinds, cache, strict=True)):
            if kind == ATTENTION and type(c) is not KVCache:
                raise Unsupported(f"cache {i}: attention cache {type(c).__name__} is not KVCache")
            if kind == RECURRENT and not isinstance(c, ArraysCache):
                raise Unsupported(f"cache {i}: recurrent cache {type(c).__name__} unsupported")

    def forward(
        self,
        tokens: mx.array,
        positions: mx.array,
        cache: Sequence[Any],
        observer: Observer | None = None,
        past: mx.array | None = None,
    ) -> mx.array:
        """Run ``tokens`` ``(1, L)`` through the model's own forward pass, appending them
        to ``cache`` in order. ``positions`` and ``past`` are ignored: nothing in the
        model depends on them. Returns the model's (lazy) logits; evaluating only the
        cache never computes them."""
        if observer is not None:
            raise Unsupported("attention cannot be observed in a sequential stack")
        return cast(mx.array, self.model(tokens, cache=list(cache)))

    def shift_positions(self, cache: Sequence[Any], count: int, delta: int) -> None:
        """Nothing to do: no cached entry carries a position."""


Target: TypeAlias = TextStack | SequentialStack
"""What :class:`~.strategy.SpecPrefill` can prefill sparsely."""


def detect_sequential(model: Any) -> SequentialStack:
    """Recognise a position-free ``norm`` + ``mixer`` block stack; raise
    :class:`Unsupported` with the reason otherwise."""
    layers = list(getattr(model, "layers", None) or [])
    if not layers:
        raise Unsupported(f"{type(model).__name__}: no layers found")
    kinds = [_block_kind(layer, i) for i, layer in enumerate(layers)]
    if ATTENTION not in kinds:
        raise Unsupported("the model has no attention blocks")
    embeddings: list[Any] = []
    for name, module in model.named_modules():
        if isinstance(module, _POSITIONAL) or name.rsplit(".", 1)[-1] == "rope":
            raise Unsupported(f"{name or 'model'} is a positional encoding")
        if isinstance(module, nn.Embedding | nn.QuantizedEmbedding):
            embeddings.append(module)
    if len(embeddings) != 1:  # a second one would be a learned absolute position embedding
        raise Unsupported(f"{len(embeddings)} embedding modules; expected only the token embedding")
    stack = SequentialStack(model=model, embed=embeddings[0], layers=layers, kinds=kinds)
    stack.check_cache(make_prompt_cache(model))
    return stack


def probe_sequential(stack: SequentialStack, length: int = 12, atol: float = 1e-3) -> None:
    """Check numerically that every attention mixer ignores token order and that the
    model's forward pass resumes from its cache exactly; raise :class:`Unsupported`
    otherwise."""
    try:
        for i, (layer, kind) in enumerate(zip(stack.layers, stack.kinds, strict=True)):
            if kind == ATTENTION:
                _check_order_blind(layer, i, length, atol)
        vocab = int(stack.embed.weight.shape[0])
        tokens = ((mx.arange(length, dtype=mx.int32) * 7919 + 11) % max(2, vocab - 1))[None]
        ref = stack.model(tokens, cache=make_prompt_cache(stack.model))[:, -1, :]
        cache = make_prompt_cache(stack.model)
        cut = length // 2
        for a, b in ((0, cut), (cut, length - 1)):
            stack.forward(tokens[:, a:b], mx.arange(a, b), cache)
            mx.eval([c.state for c in cache])
        out = stack.model(tokens[:, -1:], cache=cache)[:, -1, :]
        err = _max_abs(out - ref)
        scale = max(1.0, _max_abs(ref))
    except Unsupported:
        raise
    except Exception as exc:  # any failure means "not a structure we can run"
        raise Unsupported(f"sequential forward failed: {type(exc).__name__}: {exc}") from exc
    if not err <= atol * scale * 10:
        raise Unsupported(f"chunked forward disagrees with the model (max |diff| {err:.3g})")


def detect_target(model: Any) -> Target:
    """A :class:`~.stack.TextStack` if the model's layers can be placed at explicit
    positions, else a :class:`SequentialStack` if it has no positions at all; raise
    :class:`Unsupported` with both reasons otherwise."""
    try:
        return detect(model)
    except Unsupported as positional:
        try:
            return detect_sequential(model)
        except Unsupported as sequential:
            raise Unsupported(f"{positional}; not position-free either: {sequential}") from None


def probe_target(target: Target) -> None:
    """The numeric self-check that fits ``target``'s kind."""
    if isinstance(target, SequentialStack):
        probe_sequential(target)
    else:
        probe(target)


def _block_kind(layer: Any, i: int) -> str:
    children = set(layer.children())
    if children != _BLOCK_PARTS:
        raise Unsupported(
            f"layer {i} ({type(layer).__name__}) has parts {sorted(children)}; expected "
            "norm and mixer"
        )
    mixer = layer.mixer
    parts = set(mixer.children())
    if parts >= _ATTENTION:
        if getattr(mixer, "rope", None) is not None:
            raise Unsupported(f"layer {i}: attention mixer has a rope")
        return ATTENTION
    if parts >= _MAMBA and "A_log" in mixer:
        return RECURRENT
    if parts >= _MLP or parts >= _MOE:
        return FEED_FORWARD
    raise Unsupported(f"layer {i}: mixer {type(mixer).__name__} with parts {sorted(parts)}")


def _check_order_blind(layer: Any, i: int, length: int, atol: float) -> None:
    """Permuting the rows of the attention mixer's input (all rows visible to every
    query, no cache) must permute its output rows the same way."""
    dim = int(layer.norm.weight.shape[0])
    x = mx.random.normal((1, length, dim), key=mx.random.key(i)).astype(layer.norm.weight.dtype)
    order = mx.array([*range(1, length, 2), *range(0, length, 2)])
    out = layer.mixer(x, mask=None, cache=None)
    moved = layer.mixer(x[:, order], mask=None, cache=None)
    err = _max_abs(moved - out[:, order])
    if not err <= atol * max(1.0, _max_abs(out)) * 10:
        raise Unsupported(f"layer {i}: attention depends on token order (max |diff| {err:.3g})")


def _max_abs(x: mx.array) -> float:
    return float(cast(float, mx.abs(x.astype(mx.float32)).max().item()))
