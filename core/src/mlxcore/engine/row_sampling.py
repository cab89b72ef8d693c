"""Sampling all rows of a decode step in one computation, from mlx-lm's distribution.

mlx-lm's sampler (``mlx_lm.sample_utils.make_sampler``) draws from
``softmax(logprobs / T)`` after three filters on the untempered log-probabilities: top-p
(keep the most likely tokens until their mass reaches ``top_p``, found by sorting the whole
vocabulary), min-p (drop tokens less likely than ``min_p`` times the best) and top-k. Run
row by row, the sort and the Gumbel noise over a 151K-token vocabulary cost several times
the forward pass of a small model on the CPU. Here every row is drawn at once, with the
per-row settings as arrays, and no sort:

* min-p and top-k are masks (a threshold under the row's maximum, the k-th largest logit);
* the draw is an inverse-CDF search over chunk sums of ``exp((l - max) / T)``: one
  exponential pass, a cumulative sum over ``V / CHUNK`` chunk totals and one within the
  chosen chunk (short sums, so float32 rounding stays far below the probabilities);
* top-p is applied by **rejection**: a token drawn from the tempered distribution under
  the other filters is kept exactly when the untempered mass strictly above it is below
  ``top_p`` of the total (which is how the sorted cut is defined). The first kept draw
  of i.i.d. proposals is distributed as the proposal restricted to the kept set: exactly
  mlx-lm's distribution. The step checks a row's first proposal; a row whose first
  proposal was rejected (about ``1 - top_p`` of the time) is flagged, and :func:`settle`
  checks that row's next proposals (the same uniforms, so the result does not depend on
  where it was checked) and, if all :data:`DRAWS` fail, draws it by :func:`exact_sample`,
  the sorted computation, from a key of its own.

Greedy rows in the same batch take the raw argmax and are flagged where a near tie could
make it differ from mlx-lm's normalised pick. Each row's random numbers come from its own
key (:func:`split_step_keys`), so a seeded request gives the same tokens whatever else is
in the batch.

**On a GPU nothing is left to settle** (:func:`sample_rows_at_once`, chosen by
:func:`settle_free_default`). Settling waits for the step's computation before the next
step's graph can be built, and on a GPU that wait leaves the device idle while Python
builds the graph (measured on an H200: a 28-layer model decoded 172 tok/s through the
server against mlx-lm's 283 in process). The full-vocabulary work the proposals avoid
costs little there, so greedy rows take mlx-lm's normalised argmax and sampled rows are
drawn once from the tempered weights with top-p applied as the sorted cut, all lazily.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.engine.request import SamplingParams

CHUNK = 512
"""Tokens per chunk of the inverse-CDF search."""

DRAWS = 8
"""Proposals per row and step (their uniforms are drawn in one go, a fixed number, so a
row's numbers never depend on the batch)."""

NEAR_TIE = 2.0**-16
"""Logits this close to a row's maximum (float32) could tie with it after
``logits - logsumexp(logits)``: the results lie within ``log(vocabulary) < 32`` of 0, where
float32 rounding moves a value by at most ``2**-20``. Such greedy rows take the exact path
(see ``mlxcore.defaults.decoder``)."""


def near_ties(logits: mx.array) -> mx.array:
    """Per row: True when a second logit lies within :data:`NEAR_TIE` of the maximum."""
    top = mx.max(logits, axis=-1, keepdims=True)
    return (logits >= top - NEAR_TIE).sum(axis=-1) > 1


def exact_greedy(logits: mx.array) -> mx.array:
    """mlx-lm's greedy pick: the argmax of the normalised log-probabilities."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


@attrs.frozen
class RowSettings:
    """The sampling settings of a batch's rows as arrays (``None`` params: a greedy row)."""

    greedy: mx.array
    """(B,) True for greedy rows."""
    inv_temperature: mx.array
    """(B, 1) ``1 / T`` (1 for greedy rows)."""
    top_p: mx.array
    """(B, 1); 1 where top-p is off."""
    log_min_p: mx.array
    """(B, 1); ``-inf`` where min-p is off."""
    top_k: tuple[int, ...]
    """Per row; 0 where top-k is off."""
    any_greedy: bool
    all_greedy: bool
    any_top_p: bool
    any_min_p: bool
    unit_temperature: bool
    """Every row has temperature 1 (one exponential pass serves top-p and the draw)."""

    @classmethod
    def of(cls, rows: Sequence[SamplingParams | None]) -> RowSettings:
        """Settings for ``rows`` (greedy rows as ``None`` or greedy params)."""
        sampled = [p if p is not None and not p.greedy else None for p in rows]
        inv_t = [1.0 / p.temperature if p else 1.0 for p in sampled]
        top_p = [p.top_p if p and 0.0 < p.top_p < 1.0 else 1.0 for p in sampled]
        min_p = [math.log(p.min_p) if p and 0.0 < p.min_p <= 1.0 else -math.inf for p in sampled]
        return cls(
            greedy=mx.array([p is None for p in sampled]),
            inv_temperature=mx.array(inv_t)[:, None],
            top_p=mx.array(top_p)[:, None],
            log_min_p=mx.array(min_p)[:, None],
            top_k=tuple(p.top_k if p and p.top_k > 0 else 0 for p in sampled),
            any_greedy=any(p is None for p in sampled),
            all_greedy=all(p is None for p in sampled),
            any_top_p=any(t < 1.0 for t in top_p),
            any_min_p=any(m > -math.inf for m in min_p),
            unit_temperature=all(t == 1.0 for t in inv_t),
        )


def split_step_keys(keys: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """Each row's key (N, 2) split into (its next key, this step's proposals, its
    fallback draw)."""
    parts = mx.vmap(lambda k: mx.random.split(k, 3))(keys)
    return parts[:, 0], parts[:, 1], parts[:, 2]


def uniforms(proposal_keys: mx.array) -> mx.array:
    """(N, :data:`DRAWS`) uniforms, each row from its own key."""
    return mx.vmap(lambda k: mx.random.uniform(shape=(DRAWS,), key=k))(proposal_keys)


def _top_k_floor(logits: mx.array, top_k: tuple[int, ...]) -> mx.array:
    """(B, 1): each row's k-th largest logit, ``-inf`` where top-k is off."""
    vocab = logits.shape[-1]
    ks = [k if 0 < k < vocab else 0 for k in top_k]
    if not any(ks):
        return mx.full((logits.shape[0], 1), -math.inf)
    widest = max(ks)
    best = mx.sort(mx.topk(logits, widest, axis=-1), axis=-1)  # ascending
    index = mx.array([widest - k if k else 0 for k in ks])[:, None]
    floor = mx.take_along_axis(best, index, axis=-1)
    return mx.where(mx.array(ks)[:, None] > 0, floor, -math.inf)


def _inverse_cdf(weights: mx.array, u: mx.array) -> mx.array:
    """Tokens (B, R) drawn from unnormalised ``weights`` (B, V) with uniforms ``u`` (B, R)."""
    rows, vocab = weights.shape
    chunks = -(-vocab // CHUNK)
    if chunks * CHUNK != vocab:
        weights = mx.pad(weights, [(0, 0), (0, chunks * CHUNK - vocab)])
    sums = weights.reshape(rows, chunks, CHUNK).sum(axis=-1)
    cdf = mx.cumsum(sums, axis=-1)
    target = u * cdf[:, -1:]
    chunk = mx.minimum((cdf[:, None, :] <= target[:, :, None]).sum(axis=-1), chunks - 1)
    rest = target - mx.take_along_axis(cdf - sums, chunk, axis=-1)
    draws = u.shape[-1]
    columns = (chunk * CHUNK)[:, :, None] + mx.arange(CHUNK)
    inside = mx.take_along_axis(weights, columns.reshape(rows, -1), axis=-1)
    inside = inside.reshape(rows, draws, CHUNK)
    position = (mx.cumsum(inside, axis=-1) <= rest[:, :, None]).sum(axis=-1)
    last = mx.max(mx.where(inside > 0, mx.arange(CHUNK), 0), axis=-1)
    return chunk * CHUNK + mx.minimum(position, last)


def _weights(logits: mx.array, settings: RowSettings) -> tuple[mx.array, mx.array | None]:
    """(tempered draw weights under min-p and top-k, untempered mass or ``None`` without
    top-p), both relative to each row's maximum, for float32 ``logits`` (B, V)."""
    shifted = logits - mx.max(logits, axis=-1, keepdims=True)
    mass = mx.exp(shifted) if settings.any_top_p else None
    if mass is not None and settings.unit_temperature:
        tempered = mass
    else:
        tempered = mx.exp(shifted * settings.inv_temperature)
    if settings.any_min_p or any(settings.top_k):
        keep = (shifted >= settings.log_min_p) & (logits >= _top_k_floor(logits, settings.top_k))
        tempered = mx.where(keep, tempered, 0.0)
    return tempered, mass


def _kept_by_top_p(logits: mx.array, mass: mx.array, top_p: mx.array, tokens: mx.array) -> mx.array:
    """(B, R): whether each of ``tokens`` (B, R) survives top-p: the untempered mass
    strictly above it is below ``top_p`` (B, 1) of the row's total."""
    bound = top_p[:, 0] * mass.sum(axis=-1)
    kept = []
    for r in range(tokens.shape[-1]):
        value = mx.take_along_axis(logits, tokens[:, r : r + 1], axis=-1)
        kept.append(mx.where(logits > value, mass, 0.0).sum(axis=-1) < bound)
    return mx.stack(kept, axis=-1) | (top_p >= 1.0)


def sample_rows(logits: mx.array, settings: RowSettings, u: mx.array) -> tuple[mx.array, mx.array]:
    """One token per row of ``logits`` (B, V), lazily: ``(tokens (B,), redo (B,))``.

    ``u`` holds each row's :data:`DRAWS` uniforms; the first is used here. ``redo`` flags
    the rows :func:`settle` must finish: sampled rows whose first proposal top-p rejected,
    greedy rows with a near tie.
    """
    greedy_pick = ties = None
    if settings.any_greedy:
        if logits.dtype == mx.float32:
            greedy_pick, ties = mx.argmax(logits, axis=-1), near_ties(logits)
        else:  # mlx-lm's pick in the model's own dtype, whose rounding makes ties
            greedy_pick = exact_greedy(logits)
            ties = mx.zeros(greedy_pick.shape, mx.bool_)
        if settings.all_greedy:
            return greedy_pick, ties
    logits = logits.astype(mx.float32)
    tempered, mass = _weights(logits, settings)
    drawn = _inverse_cdf(tempered, u[:, :1])
    if mass is None:
        tokens, redo = drawn[:, 0], mx.zeros(drawn.shape[:1], mx.bool_)
    else:
        tokens, redo = drawn[:, 0], ~_kept_by_top_p(logits, mass, settings.top_p, drawn)[:, 0]
    if greedy_pick is not None and ties is not None:
        tokens = mx.where(settings.greedy, greedy_pick, tokens)
        redo = mx.where(settings.greedy, ties, redo)
    return tokens, redo


SETTLE_FREE_ENV = "MLXCORE_SETTLE_FREE"
"""``1`` / ``0`` forces :func:`settle_free_default` (to compare the two ways on a machine)."""


def settle_free_default() -> bool:
    """True where steps should leave nothing to settle: on a GPU (Metal, CUDA), where a
    sync between steps idles the device and full-vocabulary sorts are cheap. On the CPU
    the proposals and the fast greedy path save more than the sync costs.
    ``$MLXCORE_SETTLE_FREE`` (``1`` or ``0``) overrides."""
    forced = os.environ.get(SETTLE_FREE_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return mx.default_device().type == mx.DeviceType.gpu


def top_p_kept(logits: mx.array, top_p: mx.array) -> mx.array:
    """(B, V): the tokens top-p keeps, per row's ``top_p`` (B, 1), by mlx-lm's sorted cut
    on float32 ``logits`` (B, V); every token where ``top_p >= 1``."""
    ascending = mx.sort(logits, axis=-1)
    probs = mx.exp(ascending - ascending[:, -1:])
    above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    total = above[:, :1] + probs[:, :1]
    cut = (above >= top_p * total).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(ascending, cut, axis=-1)
    return (logits >= threshold) | (top_p >= 1.0)


def sample_rows_at_once(logits: mx.array, settings: RowSettings, u: mx.array) -> mx.array:
    """One token per row of ``logits`` (B, V), lazily and final (nothing to settle):
    greedy rows by :func:`exact_greedy` in the model's dtype, sampled rows by one
    inverse-CDF draw (``u[:, 0]``) from the tempered weights under every filter."""
    if settings.all_greedy:
        return exact_greedy(logits)
    greedy_pick = exact_greedy(logits) if settings.any_greedy else None
    full = logits.astype(mx.float32)
    tempered, mass = _weights(full, settings)
    if mass is not None:
        tempered = mx.where(top_p_kept(full, settings.top_p), tempered, 0.0)
    tokens = _inverse_cdf(tempered, u[:, :1])[:, 0]
    if greedy_pick is not None:
        tokens = mx.where(settings.greedy, greedy_pick, tokens)
    return tokens


def finish_row(
    params: SamplingParams, logits: mx.array, u: mx.array, fallback_key: mx.array
) -> mx.array:
    """The token (1,) of a sampled row whose first proposal was rejected: its next
    proposals in order, then :func:`exact_sample`. ``logits`` (1, V), ``u`` (1, DRAWS)."""
    settings = RowSettings.of([params])
    logits = logits.astype(mx.float32)
    tempered, mass = _weights(logits, settings)
    assert mass is not None
    drawn = _inverse_cdf(tempered, u[:, 1:])
    kept: list[bool] = _kept_by_top_p(logits, mass, settings.top_p, drawn)[0].tolist()  # type: ignore[assignment]
    if any(kept):
        return drawn[0, kept.index(True)][None]
    return exact_sample(params, logits, fallback_key)


def filter_logprobs(params: SamplingParams, logprobs: mx.array) -> mx.array:
    """``logprobs`` with the request's top-p, min-p and top-k filters applied, in that
    order, as mlx-lm applies them (a value that keeps every token is skipped)."""
    if 0.0 < params.top_p < 1.0:
        logprobs = top_p_filter(logprobs, params.top_p)
    if 0.0 < params.min_p <= 1.0:
        floor = mx.max(logprobs, axis=-1, keepdims=True) + math.log(params.min_p)
        logprobs = mx.where(logprobs < floor, -math.inf, logprobs)
    if 0 < params.top_k < logprobs.shape[-1]:
        dropped = mx.argpartition(-logprobs, kth=params.top_k - 1, axis=-1)[..., params.top_k :]
        logprobs = mx.put_along_axis(
            logprobs, dropped, mx.array(-math.inf, logprobs.dtype), axis=-1
        )
    return logprobs


def top_p_filter(logprobs: mx.array, top_p: float) -> mx.array:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``
    (a sort of the whole vocabulary)."""
    ascending = mx.sort(logprobs, axis=-1)
    probs = mx.exp(ascending.astype(mx.float32))
    # probability mass strictly above each sorted position
    above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    total = above[..., :1] + probs[..., :1]
    cut = (above >= top_p * total).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(ascending, cut, axis=-1)
    return mx.where(logprobs < threshold, -math.inf, logprobs)


def exact_sample(params: SamplingParams, logits: mx.array, key: mx.array) -> mx.array:
    """One draw (1,) from mlx-lm's distribution for ``logits`` (1, V), computed the
    direct way (normalise, filter with a sort, categorical): the fallback of a row whose
    draws were all rejected."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tempered = filter_logprobs(params, logprobs) * (1.0 / params.temperature)
    return mx.random.categorical(tempered, key=key)


@attrs.define(eq=False)
class PendingDraw:
    """A step's lazy draw and what settling it needs."""

    tokens: mx.array
    redo: mx.array | None
    """Rows :func:`settle` must finish; ``None`` when the draw is final."""
    logits: mx.array
    uniforms: mx.array
    fallback_keys: mx.array
    params: tuple[SamplingParams | None, ...]


class BatchDraws:
    """The random keys and settings of a decode batch's rows, for :func:`sample_rows`.

    Rows are appended when sequences join and dropped when they leave, in the batch's
    order. A sampled row's key lives here while the row is in the batch (``owners``
    give it back: any object with a ``key`` attribute, e.g. a
    :class:`~mlxcore.engine.sampling.RandomSampler`); greedy rows hold a placeholder.
    """

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.params: list[SamplingParams | None] = []
        self.owners: list[Any] = []
        self._settings: RowSettings | None = None

    def join(self, rows: Sequence[tuple[SamplingParams | None, Any]]) -> None:
        """Append rows: (params or ``None`` for greedy, key owner or ``None``)."""
        keys = [
            owner.key if owner is not None else mx.zeros((1, 2), mx.uint32) for _, owner in rows
        ]
        joined = mx.concatenate(keys) if len(keys) > 1 else keys[0]
        self.keys = joined if self.keys is None else mx.concatenate([self.keys, joined])
        self.params += [p for p, _ in rows]
        self.owners += [owner for _, owner in rows]
        self._settings = None

    def give_back(self, index: int) -> None:
        """Hand row ``index``'s current key back to its owner."""
        owner = self.owners[index]
        if owner is not None and self.keys is not None:
            owner.key = self.keys[index : index + 1]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices in the current order); give the others' keys back."""
        kept = set(rows)
        for i in range(len(self.owners)):
            if i not in kept:
                self.give_back(i)
        if not rows:
            self.keys, self.params, self.owners = None, [], []
        else:
            assert self.keys is not None
            self.keys = self.keys[mx.array(rows)]
            self.params = [self.params[i] for i in rows]
            self.owners = [self.owners[i] for i in rows]
        self._settings = None

    def draw(self, logits: mx.array, *, settle_free: bool = False) -> PendingDraw:
        """Every row's token from ``logits`` (B, V), lazily; advances the rows' keys.
        ``settle_free``: by :func:`sample_rows_at_once` (nothing for :func:`settle` to
        wait for) instead of proposals."""
        if self._settings is None:
            self._settings = RowSettings.of(self.params)
        assert self.keys is not None
        self.keys, proposals, fallback = split_step_keys(self.keys)
        u = uniforms(proposals)
        redo: mx.array | None
        if settle_free:
            tokens, redo = sample_rows_at_once(logits, self._settings, u), None
        else:
            tokens, redo = sample_rows(logits, self._settings, u)
        return PendingDraw(tokens, redo, logits, u, fallback, tuple(self.params))


def settle(draw: PendingDraw) -> tuple[mx.array, int]:
    """The draw's tokens with its flagged rows finished (waits for the draw, unless it
    is final), and how many rows were flagged."""
    if draw.redo is None:
        return draw.tokens, 0
    flagged: list[bool] = draw.redo.tolist()  # type: ignore[assignment]
    if not any(flagged):
        return draw.tokens, 0
    tokens: list[int] = draw.tokens.tolist()  # type: ignore[assignment]
    for i, redo in enumerate(flagged):
        if redo:
            tokens[i] = finish(
                draw.params[i],
                draw.logits[i : i + 1],
                draw.uniforms[i : i + 1],
                draw.fallback_keys[i],
            )
    return mx.array(tokens), sum(flagged)


def finish(
    params: SamplingParams | None, logits: mx.array, u: mx.array, fallback_key: mx.array
) -> int:
    """A flagged row's token: mlx-lm's normalised argmax for a greedy row (in the model's
    dtype), :func:`finish_row` for a sampled one."""
    if params is None or params.greedy:
        picked: list[int] = exact_greedy(logits).tolist()  # type: ignore[assignment]
        return picked[0]
    drawn: list[int] = finish_row(params, logits, u, fallback_key).tolist()  # type: ignore[assignment]
    return drawn[0]
