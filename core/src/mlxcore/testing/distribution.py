"""Checking that a decoder keeps the model's sampling distribution, on a context-free model.

The model (``mlxcore_qwen35_mtp.testing.build_mtp_model``: a small Qwen3 BPE vocabulary,
zero output projections) has a next-token distribution ``p(. | t)`` that depends only on
the current token ``t``, computed exactly by :func:`exact_p`. :func:`generate` runs many
seeded requests at temperature 1 through the real engine; :func:`binned` bins every
emitted transition ``prev -> next`` by the rank of ``next`` under ``p(. | prev)`` and
gives the exact expectation of each bin; :func:`chi2` (goodness of fit) and
:func:`homogeneity` (two samples, one distribution) are Pearson's statistics, compared
with :data:`CHI2_999`. Used by the speculative decoders' tests (``qwen35-mtp``,
``prompt-lookup``, ``draft``): :func:`sample_both_arms` and :func:`assert_same_distribution`
run and judge the two arms.
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from mlxcore.runtime import Runtime

REQUESTS = 96
TOKENS = 24
BINS = ((0, 1), (1, 2), (2, 4), (4, 10), (10, 10**9))
"""Rank ranges under ``p(. | prev)``: the top token, the second, 3-4, 5-10, the rest."""

CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}
"""Chi-square quantiles at 0.999 by degrees of freedom (a false alarm once in 1000 runs)."""


def exact_p(rt: Runtime) -> mx.array:
    """``p(next | current)`` for every current token, (V, V): the model is context-free."""
    vocab = rt.model.language_model.args.vocab_size
    logits = rt.model(mx.arange(vocab)[:, None])[:, 0]
    return mx.softmax(logits.astype(mx.float32), axis=-1)


def generate(rt: Runtime, prompt: list[int], options: dict[str, Any]) -> list[list[int]]:
    """REQUESTS seeded requests at temperature 1, all submitted at once."""
    sinks: list[queue.SimpleQueue[Any]] = []
    for i in range(REQUESTS):
        sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
        sampling = SamplingParams(temperature=1.0, seed=1000 + i)
        rt.engine.submit(
            GenerationRequest(tuple(prompt), TOKENS, sampling, options=options), sink.put
        )
        sinks.append(sink)
    out = []
    for sink in sinks:
        tokens: list[int] = []
        while True:
            event = sink.get(timeout=300)
            if isinstance(event, TokenEvent):
                tokens.extend(t.token for t in event.tokens)
            elif isinstance(event, FinishEvent):
                break
        assert len(tokens) == TOKENS  # the model never predicts EOS
        out.append(tokens)
    return out


def binned(
    p: mx.array, prompt: list[int], outputs: list[list[int]]
) -> tuple[list[int], list[float]]:
    """Observed bin counts and their exact expectation over every emitted transition."""
    ranks = mx.argsort(-p, axis=-1)
    position = mx.argsort(ranks, axis=-1)  # position[t, x] = rank of x under p(. | t)
    sorted_p = mx.take_along_axis(p, ranks, axis=-1)
    cumulative = mx.concatenate([mx.zeros((p.shape[0], 1)), mx.cumsum(sorted_p, axis=-1)], axis=1)
    prev_list: list[int] = []
    next_list: list[int] = []
    for tokens in outputs:
        chain = [prompt[-1], *tokens]
        prev_list += chain[:-1]
        next_list += chain[1:]
    prev = mx.array(prev_list)
    rank = position[prev, mx.array(next_list)]
    observed: list[int] = []
    expected: list[float] = []
    vocab = p.shape[-1]
    for lo, hi in BINS:
        hi = min(hi, vocab)
        count: Any = ((rank >= lo) & (rank < hi)).sum().item()
        observed.append(int(count))
        mass = cumulative[prev, hi] - cumulative[prev, lo]
        total: Any = mass.sum().item()
        expected.append(float(total))
    return observed, expected


def chi2(observed: list[int], expected: list[float]) -> float:
    """Pearson's goodness-of-fit statistic."""
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))


def homogeneity(a: list[int], b: list[int]) -> float:
    """Pearson's chi-square that two samples of bin counts share one distribution."""
    total_a, total_b = sum(a), sum(b)
    stat = 0.0
    for x, y in zip(a, b, strict=True):
        pooled = (x + y) / (total_a + total_b)
        for count, total in ((x, total_a), (y, total_b)):
            stat += (count - pooled * total) ** 2 / (pooled * total)
    return stat


def sample_both_arms(
    rt: Runtime, prompt: list[int]
) -> tuple[list[list[int]], list[list[int]], int, int]:
    """:func:`generate` with speculation on, then off (``"speculative": false``);
    returns ``(speculative, plain, drafted, accepted)``, the last two counted by the
    decoder during the speculative arm."""
    before = rt.engine.decoder.stats()
    spec = generate(rt, prompt, {})
    after = rt.engine.decoder.stats()
    plain = generate(rt, prompt, {"speculative": False})
    drafted = int(after["speculative_drafted"] - before["speculative_drafted"])
    accepted = int(after["speculative_accepted"] - before["speculative_accepted"])
    return spec, plain, drafted, accepted


def assert_same_distribution(
    p: mx.array, prompt: list[int], spec: list[list[int]], plain: list[list[int]]
) -> None:
    """Both arms fit the exact distribution ``p`` and each other (chi-square at 0.999),
    with expectations large enough for the approximation to hold."""
    dof = len(BINS) - 1
    obs_spec, exp_spec = binned(p, prompt, spec)
    obs_plain, exp_plain = binned(p, prompt, plain)
    assert min(exp_spec) >= 5 and min(exp_plain) >= 5
    assert chi2(obs_spec, exp_spec) < CHI2_999[dof], (obs_spec, exp_spec)
    assert chi2(obs_plain, exp_plain) < CHI2_999[dof], (obs_plain, exp_plain)
    assert homogeneity(obs_spec, obs_plain) < CHI2_999[dof], (obs_spec, obs_plain)
