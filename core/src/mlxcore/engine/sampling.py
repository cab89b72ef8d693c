"""Per-request samplers and logits processors, built from :class:`SamplingParams`.

Built once per request at set-up. Every sampled request draws from its own random
key (its seed, or a fresh random one), so the same seed and prompt give the same
output whatever else runs in the batch, and no request touches MLX's global random
state. The draw itself is :mod:`mlxcore.engine.row_sampling`'s (mlx-lm's distribution
without a sort of the vocabulary); the plain decoder draws all rows of a step at once
with the same computation, so a request's tokens do not depend on which path drew them.
Values are range-checked before a request is accepted
(:mod:`mlxcore.engine.validation`); the filters also skip values that mean "keep
everything" (``top_k`` at or above the vocabulary size).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors

from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.row_sampling import (
    RowSettings,
    finish,
    sample_rows,
    split_step_keys,
    uniforms,
)
from mlxcore.engine.strategies import LogitsProcessor, Sampler, StepToken, stateless

log = logging.getLogger(__name__)


def greedy(logprobs: mx.array) -> mx.array:
    """Argmax over the last axis."""
    return mx.argmax(logprobs, axis=-1)


def request_key(seed: int | None, salt: int = 0) -> Any:
    """A private random key: from ``seed`` (plus ``salt``) when given, else a fresh one."""
    if seed is None:
        return mx.random.key(secrets.randbits(63))
    return mx.random.key((seed + salt) & (2**64 - 1))


class RandomSampler:
    """Temperature / top-p / top-k / min-p sampling from the request's own random key.

    ``key`` is the request's key state: each step splits it (see
    :func:`~mlxcore.engine.row_sampling.split_step_keys`). The plain decoder holds the
    keys of its rows in one array while they are in the batch and hands each back here
    when its row leaves.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.key: Any = request_key(params.seed)[None]
        self._settings = RowSettings.of([params])

    def __call__(self, logprobs: mx.array) -> mx.array:
        """One token per row of ``logprobs`` (N, V), every row with this request's
        settings; waits for the draw (see :mod:`~mlxcore.engine.row_sampling`)."""
        out = []
        for i in range(logprobs.shape[0]):
            row = logprobs[i : i + 1]
            self.key, proposals, fallback = split_step_keys(self.key)
            u = uniforms(proposals)
            token, redo = sample_rows(row, self._settings, u)
            if redo.item():
                token = mx.array([finish(self.params, row, u, fallback[0])])
            out.append(token)
        return out[0] if len(out) == 1 else mx.concatenate(out)


def make_sampler(params: SamplingParams) -> Sampler:
    """The sampler for one request (``greedy`` for temperature 0)."""
    if params.greedy:
        return greedy
    return RandomSampler(params)


def make_processors(
    request: GenerationRequest, stop_ids: frozenset[int] = frozenset()
) -> list[LogitsProcessor]:
    """Logits processors for the request's bias and penalties (mlx-lm's) and for
    ``min_tokens`` (``stop_ids``, the end-of-sequence and stop tokens, are masked until
    that many tokens exist); empty when none is set."""
    params = request.sampling
    processors: list[LogitsProcessor] = make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )
    if params.min_tokens > 0 and stop_ids:
        processors.append(MinTokens(len(request.prompt_tokens), params.min_tokens, stop_ids))
    return [stateless(proc) for proc in processors]  # functions of their arguments alone


class MinTokens:
    """Masks the end-of-sequence and stop tokens until ``count`` tokens were generated."""

    __name__ = "min_tokens"

    def __init__(self, prompt_length: int, count: int, banned: frozenset[int]) -> None:
        self.until = prompt_length + count
        self.banned = mx.array(sorted(banned))

    def __call__(self, tokens: Any, logits: mx.array) -> mx.array:
        if len(tokens) >= self.until:
            return logits
        return logits.at[..., self.banned].add(-mx.inf)


LOGPROB_FLOOR = -9999.0
"""The logprob reported for a token a constraint ruled out (``-inf`` is not JSON; OpenAI
and vLLM report this value)."""


def token_with_logprobs(token: int, logprobs: mx.array, top: int) -> StepToken:
    """A :class:`StepToken` carrying the chosen token's logprob and the ``top`` best
    (none below :data:`LOGPROB_FLOOR`)."""
    return tokens_with_logprobs([token], logprobs[None], [top])[0]


def tokens_with_logprobs(
    tokens: Sequence[int], logprobs: mx.array, tops: Sequence[int]
) -> list[StepToken]:
    """:func:`token_with_logprobs` for several rows at once (``logprobs`` (rows, vocab),
    one token and one ``top`` per row): one evaluation for all of them, not three reads
    per row."""
    ids = mx.array(list(tokens))
    chosen = mx.take_along_axis(logprobs, ids[:, None], axis=-1)[:, 0]
    most = max(tops, default=0)
    arrays = [chosen]
    if most > 0:
        best = mx.argpartition(-logprobs, kth=most - 1, axis=-1)[:, :most]
        arrays += [best, mx.take_along_axis(logprobs, best, axis=-1)]
    mx.eval(arrays)
    values: list[float] = arrays[0].tolist()  # type: ignore[assignment]
    best_ids: list[list[int]] = arrays[1].tolist() if most > 0 else []  # type: ignore[assignment]
    best_values: list[list[float]] = arrays[2].tolist() if most > 0 else []  # type: ignore[assignment]
    out = []
    for row, (token, top) in enumerate(zip(tokens, tops, strict=True)):
        chosen_value = max(values[row], LOGPROB_FLOOR)
        if top <= 0:
            out.append(StepToken(token, chosen_value))
            continue
        pairs = zip(best_ids[row], (max(v, LOGPROB_FLOOR) for v in best_values[row]), strict=True)
        ranked = sorted(pairs, key=lambda p: -p[1])[:top]
        out.append(StepToken(token, chosen_value, tuple(ranked)))
    return out


def sample_first(
    sampler: Sampler,
    processors: Sequence[LogitsProcessor],
    logits: mx.array,
    prompt: list[int],
    sampling: SamplingParams,
) -> StepToken:
    """The first generated token, from the prefill's ``logits`` (1, vocab) after the
    request's ``processors`` (each sees the prompt as its context)."""
    if processors:
        context = mx.array(prompt)
        for proc in processors:
            logits = proc(context, logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    token = int(sampler(logprobs).item())
    if sampling.logprobs:
        return token_with_logprobs(token, logprobs[0], sampling.top_logprobs)
    return StepToken(token)


def prompt_token_logprobs(logits: mx.array, targets: mx.array, top: int) -> list[StepToken]:
    """The logprob, rank and ``top`` best alternatives of each of ``targets`` (n,) under
    the matching row of ``logits`` (n, vocab): the prompt logprobs of one prefill chunk.
    Computed in float32; one evaluation for the whole chunk."""
    logits = logits.astype(mx.float32)
    # no (n, vocab) logprobs matrix: each value is its logit minus the row's logsumexp,
    # and the order (rank, top) is the logits' own
    norm = mx.logsumexp(logits, axis=-1, keepdims=True)
    mine = mx.take_along_axis(logits, targets[:, None], axis=-1)
    ranks = (logits > mine).sum(axis=-1) + 1
    arrays = [(mine - norm)[:, 0], ranks]
    if top > 0:
        best = mx.argpartition(-logits, kth=top - 1, axis=-1)[:, :top]
        arrays += [best, mx.take_along_axis(logits, best, axis=-1) - norm]
    mx.eval(arrays)
    ids: list[int] = targets.tolist()  # type: ignore[assignment]
    values: list[float] = arrays[0].tolist()  # type: ignore[assignment]
    rank_list: list[int] = arrays[1].tolist()  # type: ignore[assignment]
    alternatives: list[tuple[tuple[int, float], ...]] = [()] * len(ids)
    if top > 0:
        top_ids: list[list[int]] = arrays[2].tolist()  # type: ignore[assignment]
        top_values: list[list[float]] = arrays[3].tolist()  # type: ignore[assignment]
        alternatives = [
            tuple(sorted(zip(i, v, strict=True), key=lambda p: -p[1]))
            for i, v in zip(top_ids, top_values, strict=True)
        ]
    return [
        StepToken(token, value, alts, rank)
        for token, value, alts, rank in zip(ids, values, alternatives, rank_list, strict=True)
    ]


def repair_random_state() -> None:
    """Reseed MLX's global random state if a failed compiled function left it broken
    (mlx-lm's compiled samplers capture it; an exception while tracing one leaves a
    placeholder behind, and every later unseeded draw fails)."""
    try:
        mx.eval(mx.random.state)
    except Exception:
        log.warning("MLX's global random state was broken by a failed request; reseeding")
        mx.random.seed(secrets.randbits(63))
