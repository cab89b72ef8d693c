"""A sequence's context for logits processors, grown incrementally."""

from __future__ import annotations

import mlx.core as mx
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.engine.token_context import CHUNK, TokenContext


def test_the_context_matches_the_tokens_as_they_grow_past_chunks() -> None:
    context, tokens = TokenContext(), list(range(7))
    for step in range(3 * CHUNK + 5):
        extra = mx.array([step % 50], dtype=mx.uint32)
        got = context.array(tokens, extra)
        assert got.tolist() == [*tokens, step % 50]
        assert got.dtype == mx.int32
        tokens.append(step % 50)
    assert context.array(tokens).tolist() == tokens


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3 * CHUNK, 3 * CHUNK), min_size=1, max_size=12))
def test_growth_and_rollbacks_in_any_order(moves: list[int]) -> None:
    """Positive moves append that many tokens, negative ones roll back (a speculative
    decoder's rejected draft): the array is always the list."""
    context, tokens = TokenContext(), [1, 2, 3]
    for move in moves:
        if move >= 0:
            tokens += [(len(tokens) * 7) % 1000 for _ in range(move)]
        else:
            del tokens[max(0, len(tokens) + move) :]
        assert context.array(tokens).tolist() == tokens


def test_an_empty_context() -> None:
    assert TokenContext().array([]).tolist() == []
    assert TokenContext().array([], mx.array([5])).tolist() == [5]
