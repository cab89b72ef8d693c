"""Logprobs for every row of a step in one computation, as a row-by-row reading gives."""

from __future__ import annotations

import mlx.core as mx

from mlxcore.engine.sampling import LOGPROB_FLOOR, token_with_logprobs, tokens_with_logprobs


def by_hand(token: int, row: list[float], top: int) -> tuple[float, list[tuple[int, float]]]:
    ranked = sorted(range(len(row)), key=lambda i: -row[i])[:top]
    return max(row[token], LOGPROB_FLOOR), [(i, max(row[i], LOGPROB_FLOOR)) for i in ranked]


def test_each_row_gets_its_token_and_its_own_number_of_alternatives() -> None:
    mx.random.seed(3)
    logits = mx.random.normal((5, 40)) * 4
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    logprobs[2, 7] = -mx.inf  # a token a constraint ruled out
    tokens, tops = [3, 11, 7, 0, 39], [0, 1, 5, 20, 3]
    got = tokens_with_logprobs(tokens, logprobs, tops)
    rows: list[list[float]] = logprobs.tolist()  # type: ignore[assignment]
    for step_token, token, top, row in zip(got, tokens, tops, rows, strict=True):
        value, alternatives = by_hand(token, row, top)
        assert step_token.token == token
        assert abs(step_token.logprob - value) < 1e-5  # type: ignore[operator]
        assert [i for i, _ in step_token.top_logprobs] == [i for i, _ in alternatives]
        assert all(
            abs(a - b) < 1e-5
            for (_, a), (_, b) in zip(step_token.top_logprobs, alternatives, strict=True)
        )
    assert got[2].logprob == LOGPROB_FLOOR
    one = token_with_logprobs(11, logprobs[1], 1)
    assert one == got[1]
