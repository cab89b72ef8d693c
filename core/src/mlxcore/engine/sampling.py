"""Per-request samplers and logits processors, built from :class:`SamplingParams`.

Built once per request at set-up, on mlx-lm's public sampling pieces. A seeded
request draws from its own random key, so the same seed and prompt give the
same output whatever else runs in the batch.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from mlxcore.engine.request import SamplingParams
from mlxcore.engine.strategies import LogitsProcessor, Sampler, StepToken


def greedy(logprobs: mx.array) -> mx.array:
    """Argmax over the last axis."""
    return mx.argmax(logprobs, axis=-1)


class RandomSampler:
    """Temperature / top-p / top-k / min-p sampling with an optional private seed."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._key: Any = mx.random.key(params.seed) if params.seed is not None else None

    def __call__(self, logprobs: mx.array) -> mx.array:
        p = self.params
        if 0.0 < p.top_p < 1.0:
            logprobs = apply_top_p(logprobs, p.top_p)
        if p.min_p > 0.0:
            logprobs = apply_min_p(logprobs, p.min_p)
        if p.top_k > 0:
            logprobs = apply_top_k(logprobs, p.top_k)
        key = None
        if self._key is not None:
            self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=key)


def make_sampler(params: SamplingParams) -> Sampler:
    """The sampler for one request (``greedy`` for temperature 0)."""
    if params.greedy:
        return greedy
    return RandomSampler(params)


def make_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """mlx-lm logits processors for bias and penalties (empty when none is set)."""
    processors: list[LogitsProcessor] = make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )
    return processors


def token_with_logprobs(token: int, logprobs: mx.array, top: int) -> StepToken:
    """A :class:`StepToken` carrying the chosen token's logprob and the ``top`` best."""
    chosen: float = logprobs[token].item()  # type: ignore[assignment]
    if top <= 0:
        return StepToken(token, chosen)
    best = mx.argpartition(-logprobs, kth=top - 1)[:top]
    ids: list[int] = best.tolist()  # type: ignore[assignment]
    values: list[float] = logprobs[best].tolist()  # type: ignore[assignment]
    pairs = sorted(zip(ids, values, strict=True), key=lambda p: -p[1])
    return StepToken(token, chosen, tuple(pairs))
