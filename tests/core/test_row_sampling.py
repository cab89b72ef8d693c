"""The batched sampler draws from exactly mlx-lm's distribution, row by row.

Each case builds logits, computes the distribution mlx-lm's own sampler defines
(``apply_top_p`` / ``apply_min_p`` / ``apply_top_k`` in its order, then
``softmax(logprobs / T)``), draws ~20,000 tokens through :class:`BatchDraws` and
:func:`settle` (the decoder's path), and compares them with Pearson's chi-square, binned by
rank under the exact distribution. Tokens outside the kept set must never appear. The
cases include settings where the first proposal is often rejected and where all
:data:`DRAWS` proposals are, so the settle and exact paths are part of what is tested.
Every case runs twice: with proposals (the CPU's way) and settle-free (a GPU's way:
:func:`sample_rows_at_once`, top-p by the sorted cut, nothing left to settle).
"""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlxcore.engine.request import SamplingParams
from mlxcore.engine.row_sampling import (
    CHUNK,
    SETTLE_FREE_ENV,
    BatchDraws,
    settle,
    settle_free_default,
)
from mlxcore.engine.sampling import RandomSampler

ROWS = 512
STEPS = 40
RANK_BINS = ((0, 1), (1, 2), (2, 4), (4, 10), (10, 30), (30, 100), (100, 10**9))


def peaked_logits(vocab: int, seed: int) -> mx.array:
    """A language-model-like row: a few strong tokens, a long tail."""
    key = mx.random.key(seed)
    base = mx.random.normal((vocab,), key=key) * 1.5
    boost = (
        mx.zeros((vocab,))
        .at[mx.array([7, vocab // 2, vocab - 3, vocab // 3])]
        .add(mx.array([5.0, 4.5, 4.0, 3.0]))
    )
    return base + boost


def flat_logits(vocab: int, seed: int) -> mx.array:
    """A random-weight model's row: nearly uniform over a large vocabulary."""
    return mx.random.normal((vocab,), key=mx.random.key(seed)) * 0.5


def mlx_lm_probs(logits: mx.array, p: SamplingParams) -> mx.array:
    """mlx-lm's sampling distribution for one row (its filters, its order)."""
    logprobs = (logits - mx.logsumexp(logits, keepdims=True))[None]
    if 0 < p.top_p < 1:
        logprobs = apply_top_p(logprobs, p.top_p)
    if p.min_p > 0:
        logprobs = apply_min_p(logprobs, p.min_p)
    if p.top_k > 0:
        logprobs = apply_top_k(logprobs, p.top_k)
    return mx.softmax(logprobs[0] / p.temperature)


def draw_many(
    logits: mx.array, params: SamplingParams, steps: int = STEPS, settle_free: bool = False
) -> tuple[list[int], int]:
    """ROWS x STEPS tokens for ``logits`` (V,), every row its own seed; also how many
    rows settle had to finish."""
    draws = BatchDraws()
    rows = [attrs_seed(params, i) for i in range(ROWS)]
    draws.join([(p, RandomSampler(p)) for p in rows])
    batch = mx.broadcast_to(logits[None], (ROWS, logits.shape[0]))
    out: list[int] = []
    finished = 0
    for _ in range(steps):
        tokens, flagged = settle(draws.draw(batch, settle_free=settle_free))
        finished += flagged
        out += tokens.tolist()
    return out, finished


def attrs_seed(params: SamplingParams, seed: int) -> SamplingParams:
    import attrs

    return attrs.evolve(params, seed=seed)


def chi2_999(dof: int) -> float:
    """The chi-square 0.999 quantile (Wilson-Hilferty; within 1% from 1 degree of freedom)."""
    z = 3.0902
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(tokens: list[int], probs: mx.array) -> tuple[float, int, int]:
    """(statistic, degrees of freedom, draws outside the kept set)."""
    p: list[float] = probs.tolist()  # type: ignore[assignment]
    order = sorted(range(len(p)), key=lambda t: -p[t])
    rank = {t: r for r, t in enumerate(order)}
    outside = sum(1 for t in tokens if p[t] == 0.0)
    kept = sum(1 for x in p if x > 0)
    bins = [(lo, min(hi, kept)) for lo, hi in RANK_BINS if lo < kept]
    counts = [0] * len(bins)
    for t in tokens:
        r = rank[t]
        for b, (lo, hi) in enumerate(bins):
            if lo <= r < hi:
                counts[b] += 1
    n = len(tokens)
    stat = 0.0
    for (lo, hi), seen in zip(bins, counts, strict=True):
        expected = n * sum(p[order[r]] for r in range(lo, hi))
        stat += (seen - expected) ** 2 / expected
    return stat, len(bins) - 1, outside


CASES = [
    pytest.param("peaked", SamplingParams(temperature=0.8, top_p=0.95), id="t0.8-top_p0.95"),
    pytest.param("peaked", SamplingParams(temperature=0.6), id="t0.6"),
    pytest.param("peaked", SamplingParams(temperature=1.3, top_p=0.9), id="t1.3-top_p0.9"),
    pytest.param("peaked", SamplingParams(temperature=1.0, top_p=0.5), id="t1-top_p0.5"),
    pytest.param("peaked", SamplingParams(temperature=0.7, top_k=20), id="top_k20"),
    pytest.param("peaked", SamplingParams(temperature=1.0, min_p=0.05), id="min_p0.05"),
    pytest.param(
        "peaked",
        SamplingParams(temperature=0.9, top_p=0.9, min_p=0.02, top_k=50),
        id="all-filters",
    ),
    pytest.param("flat", SamplingParams(temperature=0.8, top_p=0.95), id="flat-top_p0.95"),
    # a tempered mass of the kept set near 0.3: all eight proposals fail ~6% of the time
    pytest.param("flat", SamplingParams(temperature=2.0, top_p=0.3), id="flat-exact-path"),
]


@pytest.mark.parametrize("settle_free", [False, True], ids=["proposals", "settle-free"])
@pytest.mark.parametrize(("shape", "params"), CASES)
def test_draws_follow_mlx_lm_distribution(
    shape: str, params: SamplingParams, settle_free: bool
) -> None:
    vocab = 3 * CHUNK + 77 if shape == "peaked" else 8 * CHUNK + 5
    maker = peaked_logits if shape == "peaked" else flat_logits
    logits = maker(vocab, seed=11)
    probs = mlx_lm_probs(logits, params)
    # the exact path's case finishes most rows one by one after the step: fewer draws
    steps = STEPS if params.top_p > 0.3 or settle_free else 12
    tokens, finished = draw_many(logits, params, steps, settle_free=settle_free)
    stat, dof, outside = chi_square(tokens, probs)
    assert outside == 0, f"{outside} draws outside the kept set"
    assert stat < chi2_999(dof), (stat, dof)
    if settle_free:
        assert finished == 0  # nothing was left for settle
    elif 0 < params.top_p <= 0.5:
        assert finished > 0  # the settle path ran and is part of the result


@pytest.mark.parametrize("settle_free", [False, True], ids=["proposals", "settle-free"])
def test_a_row_draws_the_same_tokens_alone_and_in_a_batch(settle_free: bool) -> None:
    logits = peaked_logits(2 * CHUNK + 9, seed=3)
    mine = SamplingParams(temperature=0.9, top_p=0.8, seed=42)
    others = [
        SamplingParams(temperature=t, top_k=k, seed=s) for t, k, s in [(1.2, 5, 1), (0.5, 0, 2)]
    ]

    def run(rows: list[SamplingParams | None], steps: int = 30) -> list[int]:
        draws = BatchDraws()
        draws.join([(p, RandomSampler(p) if p else None) for p in rows])
        batch = mx.broadcast_to(logits[None], (len(rows), logits.shape[0]))
        index = rows.index(mine)
        return [
            int(settle(draws.draw(batch, settle_free=settle_free))[0][index].item())
            for _ in range(steps)
        ]

    alone = run([mine])
    assert run([*others, mine, None]) == alone
    assert run([None, mine, *others]) == alone
    assert len(set(alone)) > 1  # it samples


@pytest.mark.parametrize("settle_free", [False, True], ids=["proposals", "settle-free"])
def test_greedy_rows_in_a_sampled_batch_take_the_normalised_argmax(settle_free: bool) -> None:
    logits = mx.stack([peaked_logits(CHUNK + 1, seed=s) for s in range(4)])
    rows: list[SamplingParams | None] = [None, SamplingParams(temperature=1.0, seed=1), None, None]
    draws = BatchDraws()
    draws.join([(p, RandomSampler(p) if p else None) for p in rows])
    draw = draws.draw(logits, settle_free=settle_free)
    assert (draw.redo is None) == settle_free
    tokens: list[int] = settle(draw)[0].tolist()  # type: ignore[assignment]
    normalised = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    expected: list[int] = mx.argmax(normalised, axis=-1).tolist()  # type: ignore[assignment]
    assert [tokens[i] for i in (0, 2, 3)] == [expected[i] for i in (0, 2, 3)]


def test_keys_go_back_to_their_samplers_when_rows_leave() -> None:
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(3)]
    samplers = [RandomSampler(p) for p in params]
    before = [s.key.tolist() for s in samplers]
    draws = BatchDraws()
    draws.join([(p, s) for p, s in zip(params, samplers, strict=True)])
    settle(draws.draw(mx.zeros((3, 64))))
    draws.keep([0, 2])
    assert samplers[1].key.tolist() != before[1]  # the advanced key came back
    assert samplers[0].key.tolist() == before[0]  # still held by the batch
    draws.keep([])
    assert samplers[0].key.tolist() != before[0]


def test_the_gpu_default_and_its_override(monkeypatch: pytest.MonkeyPatch) -> None:
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    monkeypatch.delenv(SETTLE_FREE_ENV, raising=False)
    assert settle_free_default() == on_gpu
    monkeypatch.setenv(SETTLE_FREE_ENV, "1")
    assert settle_free_default()
    monkeypatch.setenv(SETTLE_FREE_ENV, "0")
    assert not settle_free_default()


def test_a_vanishing_top_p_keeps_the_top_token(tiny_llama: Path) -> None:
    """top_p = 5e-324 (valid, > 0; schemathesis sent it) rounds to 0 in float32, which
    kept nothing: the draw left the top token, and a grammar-constrained request failed.
    It is floored: a sampled request with it gives the greedy tokens."""
    from mlxcore.engine.request import TOP_P_FLOOR, GenerationRequest
    from mlxcore.testing.runtime import make_runtime, submit_together

    assert SamplingParams(temperature=1.0, top_p=5e-324).top_p == TOP_P_FLOOR
    assert SamplingParams(top_p=0.5).top_p == 0.5
    rt = make_runtime(tiny_llama)
    try:
        prompt = (30551, 263, 151668, 2804)
        vanishing = SamplingParams(temperature=1.0, top_p=5e-324, seed=0)
        greedy, tiny = submit_together(
            rt,
            [
                GenerationRequest(prompt, 12, SamplingParams(temperature=0.0)),
                GenerationRequest(prompt, 12, vanishing),
            ],
        )
    finally:
        rt.engine.shutdown(timeout=5)
    assert tiny.tokens == greedy.tokens and len(greedy.tokens) == 12
