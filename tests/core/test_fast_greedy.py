"""The plain decoder's greedy fast path: argmax of the raw logits, with mlx-lm's exact
normalised pick for rows where rounding could make a difference."""

from __future__ import annotations

import mlx.core as mx

from mlxcore.defaults.decoder import PlainDecoder
from mlxcore.engine.row_sampling import NEAR_TIE, exact_greedy, near_ties


def settled(logits: mx.array) -> list[int]:
    decoder = PlainDecoder(model=None)
    decoder._pending = mx.argmax(logits, axis=-1)
    decoder._unchecked = (logits, near_ties(logits))
    decoder._settle()
    return decoder._pending.tolist()


def test_a_tie_made_by_rounding_takes_the_exact_pick() -> None:
    vocab = 151_669
    row = mx.zeros((vocab,))  # logsumexp ~ 11.9: results near -11.8, where an ulp is ~1e-6
    row[7] = 0.1
    row[3] = 0.1 - 5e-8  # smaller, but equal to the largest after the subtraction
    logits = row[None]
    assert mx.argmax(logits, axis=-1).item() == 7
    exact = exact_greedy(logits).item()
    assert exact == 3, "the rounding tie this test needs did not happen"
    assert near_ties(logits).tolist() == [True]
    assert settled(logits) == [exact] != [7]
    decoder = PlainDecoder(model=None)
    decoder._pending = mx.argmax(logits, axis=-1)
    decoder._unchecked = (logits, near_ties(logits))
    decoder._settle()
    assert decoder.stats()["greedy_exact_fallbacks"] == 1


def test_unflagged_rows_agree_with_the_exact_pick() -> None:
    mx.random.seed(3)
    for scale in (0.01, 1.0, 30.0):
        logits = mx.random.normal((64, 50_000)) * scale
        flags = near_ties(logits).tolist()
        fast = mx.argmax(logits, axis=-1).tolist()
        exact = exact_greedy(logits).tolist()
        for f, a, b in zip(flags, fast, exact, strict=True):
            assert f or a == b
        assert settled(logits) == exact


def test_the_threshold_covers_float32_rounding_near_log_vocab() -> None:
    # results of logits - logsumexp lie within log(vocab) < 32 of zero: one ulp there
    assert NEAR_TIE > 2 * 2.0**-19
