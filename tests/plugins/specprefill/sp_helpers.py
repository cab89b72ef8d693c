"""Helpers for the specprefill tests: drive prefill generators, and a dense reference
that masks dropped tokens out of attention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcore.engine.strategies import PrefillResult


def drive(gen: Any) -> PrefillResult:
    """Run a prefill generator to completion; return its result."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def prompt_ids(n: int, salt: int = 0) -> tuple[int, ...]:
    """A deterministic prompt of ``n`` ordinary token ids."""
    return tuple(int((i * 37 + salt * 101) % 5000 + 10) for i in range(n))


def masked_reference(model: Any, tokens: Sequence[int], kept: Sequence[int]) -> mx.array:
    """Logits ``(len(tokens), vocab)`` of a dense pass over ``tokens`` at their true
    positions (0, 1, ...) in which every query sees only kept keys (and itself).

    Rows at kept positions equal what a sparse prefill of ``kept`` must produce;
    a row past the prompt is a decode step at its true position. Uses the model's own
    layers (mlx-lm's ``TransformerBlock``), so it only fits pure-attention models.
    """
    n = len(tokens)
    keep = mx.zeros((n,), dtype=mx.bool_)
    keep[mx.array(list(kept))] = True
    rows = mx.arange(n)[:, None]
    cols = mx.arange(n)[None]
    mask = (cols <= rows) & (keep[None] | (cols == rows))
    h = model.model.embed_tokens(mx.array(list(tokens))[None])
    for layer in model.layers:
        h = layer(h, mask, None)
    out = model.model.norm(h)
    return model.model.embed_tokens.as_linear(out)[0]
