"""Drafting and acceptance rules that keep speculative output identical in distribution.

Three rules, chosen per sequence from its sampler:

* ``greedy`` (temperature 0): drafts are the head's argmax; the target's argmax at each
  verified position decides; the first mismatch is replaced by the target's token. The
  output is token-identical to plain greedy decoding.
* ``rejection`` (mlxcore's temperature / top-p / top-k / min-p sampler): drafts are
  sampled from the head's distribution ``q`` (same temperature and filters); draft ``d``
  is accepted with probability ``min(1, p(d) / q(d))``; on the first rejection the token
  is drawn from ``normalize(max(p - q, 0))``; when all drafts pass, a bonus token comes
  from ``p``. The emitted tokens follow exactly the target distribution ``p``
  (Leviathan et al. 2023, Chen et al. 2023).
* ``match`` (any other sampler): drafts are the head's argmax; the request's own sampler
  draws the target token at each position and a draft counts only when it equals that
  draw. Exact for any sampler, with a lower acceptance than rejection sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcore.engine.request import SamplingParams
from mlxcore.engine.row_sampling import filter_logprobs
from mlxcore.engine.sampling import RandomSampler, greedy, request_key

GREEDY = "greedy"
REJECTION = "rejection"
MATCH = "match"


def rule_for(sampler: Any) -> str:
    """The acceptance rule for a sequence's sampler."""
    if sampler is greedy:
        return GREEDY
    if isinstance(sampler, RandomSampler):
        return REJECTION
    return MATCH


def normalize(logits: mx.array) -> mx.array:
    """Log-probabilities from logits along the last axis."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def sampling_logits(params: SamplingParams, logprobs: mx.array) -> mx.array:
    """The tempered, filtered logits that mlxcore's ``RandomSampler`` draws from."""
    return filter_logprobs(params, logprobs) * (1.0 / params.temperature)


class KeyStream:
    """Random keys for one sequence: from its seed when seeded, else from a fresh random
    key (never MLX's global generator, which every request shares)."""

    def __init__(self, seed: int | None) -> None:
        self._key: Any = request_key(seed, salt=0x6D7470)

    def next(self) -> Any:
        """The next key."""
        self._key, key = mx.random.split(self._key)
        return key


def draft_token(rule: str, params: SamplingParams, logits: mx.array, keys: KeyStream) -> tuple:
    """Choose one draft from the head's logits (1, V): (token (1,), q log-probs or None)."""
    if rule == REJECTION:
        q = normalize(sampling_logits(params, normalize(logits)))
        return mx.random.categorical(q, key=keys.next()), q
    return mx.argmax(logits, axis=-1), None


def decide(
    rule: str,
    params: SamplingParams,
    sampler: Any,
    target: mx.array,
    drafts: Sequence[int],
    draft_q: list[mx.array],
    keys: KeyStream,
) -> list[int]:
    """The tokens to emit: accepted drafts followed by one target token.

    Args:
        target: processed target log-probabilities, (k + 1, V), row ``i`` conditioned on
            the drafts before ``i``.
        drafts: the k drafted tokens.
        draft_q: for ``rejection``, the head's log-probabilities each draft came from.
    """
    k = len(drafts)
    if rule == GREEDY:
        chosen: list[int] = mx.argmax(target, axis=-1).tolist()  # type: ignore[assignment]
        return _first_mismatch(chosen, drafts)
    if rule == MATCH:
        rows = [sampler(target[i : i + 1]) for i in range(k + 1)]
        chosen = mx.concatenate(rows).tolist()  # type: ignore[assignment]
        return _first_mismatch(chosen, drafts)
    p_logits = sampling_logits(params, target)
    bonus = mx.random.categorical(p_logits[k:], key=keys.next())
    if k == 0:
        return [_int(bonus)]
    p = mx.softmax(p_logits[:k], axis=-1)
    q = mx.exp(mx.concatenate(draft_q, axis=0))
    idx = mx.array(list(drafts))[:, None]
    p_d = mx.take_along_axis(p, idx, axis=-1)[:, 0]
    q_d = mx.take_along_axis(q, idx, axis=-1)[:, 0]
    u = mx.random.uniform(shape=(k,), key=keys.next())
    accepted = u * q_d <= p_d
    residual = mx.maximum(p - q, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p)
    fixes = mx.random.categorical(mx.log(residual), key=keys.next())
    flags: list[bool] = accepted.tolist()  # type: ignore[assignment]
    fix_tokens: list[int] = fixes.tolist()  # type: ignore[assignment]
    out: list[int] = []
    for i, ok in enumerate(flags):
        if not ok:
            return [*out, fix_tokens[i]]
        out.append(drafts[i])
    return [*out, _int(bonus)]


def _int(token: mx.array) -> int:
    """The single token in ``token`` as a Python int."""
    values: list[int] = token.reshape(-1).tolist()  # type: ignore[assignment]
    return values[0]


def _first_mismatch(chosen: list[int], drafts: Sequence[int]) -> list[int]:
    """Drafts up to the first one the target disagrees with, then the target's token."""
    out: list[int] = []
    for i, draft in enumerate(drafts):
        if chosen[i] != draft:
            return [*out, chosen[i]]
        out.append(draft)
    return [*out, chosen[len(drafts)]]
