"""Token importance from a draft model's attention, and chunk selection.

The draft prefills the whole prompt except its last ``lookahead`` tokens with its own
forward pass, then runs those last tokens through :class:`~.stack.TextStack` with an
observer that reads, in every attention layer, the softmax attention of those
positions over the whole prompt. A token's importance is the largest, over layers
and heads, of its attention averaged over the lookahead queries (as in the
SpecPrefill paper). Selection then keeps whole chunks: the prompt's head and tail
always, then the best-scoring chunks until the budget is reached.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore_specprefill.stack import TextStack


def score_tokens(
    draft: TextStack, tokens: Sequence[int], lookahead: int, step: int
) -> Generator[int, None, mx.array]:
    """Importance of every prompt token, shape ``(len(tokens),)`` float32.

    A generator: yields the count of tokens the draft processed after each chunk,
    returns the scores.
    """
    n = len(tokens)
    w = max(1, min(lookahead, n - 1))
    body = n - w
    ids = mx.array(list(tokens), dtype=mx.int32)[None]
    cache = make_prompt_cache(draft.model)
    done = 0
    while done < body:
        size = min(step, body - done)
        draft.model(ids[:, done : done + size], cache=cache)
        mx.eval([c.state for c in cache])
        done += size
        yield done
    best = [mx.zeros((n,), dtype=mx.float32)]

    def observe(index: int, queries: mx.array, keys: mx.array, scale: float) -> None:
        # evaluated layer by layer: one layer's (heads, window, n) scores at a time
        best[0] = mx.maximum(best[0], _layer_importance(queries, keys, scale))
        mx.eval(best[0])

    draft.forward(ids[:, body:], mx.arange(body, n, dtype=mx.int32), cache, observe)
    yield n
    return best[0]


def _layer_importance(queries: mx.array, keys: mx.array, scale: float) -> mx.array:
    """Per key: max over heads of the attention averaged over the queries.

    ``queries`` ``(1, H, w, D)`` are the last ``w`` positions of ``keys`` ``(1, Hkv, T, D)``.
    """
    _, n_heads, w, dim = queries.shape
    n_kv, total = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    q = queries.astype(mx.float32).reshape(n_kv, group * w, dim)
    k = keys.astype(mx.float32).reshape(n_kv, total, dim)
    logits = (q * scale) @ k.transpose(0, 2, 1)  # (Hkv, G*w, T)
    q_pos = mx.tile(mx.arange(total - w, total), group)[:, None]
    logits = mx.where(mx.arange(total)[None] <= q_pos, logits, -mx.inf)
    probs = mx.softmax(logits, axis=-1).reshape(n_kv * group, w, total)
    return probs.mean(axis=1).max(axis=0)


def select_chunks(
    scores: mx.array | Sequence[float],
    start: int,
    keep: float,
    chunk: int,
    tail: int,
) -> list[int]:
    """Positions to prefill among ``start .. len(scores) - 1``, sorted.

    Whole chunks of ``chunk`` tokens (counted from ``start``) are kept: the last
    chunks covering at least ``tail`` tokens, the first chunk when ``start == 0``
    (the attention sink and the start of the system prompt), then chunks by mean
    score until ``ceil(keep * (n - start))`` tokens are kept.
    """
    raw = scores.tolist() if isinstance(scores, mx.array) else scores
    values = [float(v) for v in cast(Sequence[float], raw)]
    n = len(values)
    span = n - start
    if span <= 0:
        return []
    budget = min(span, max(1, math.ceil(keep * span)))
    bounds = [(s, min(s + chunk, n)) for s in range(start, n, chunk)]
    chosen: set[int] = set()
    kept = 0

    def take(c: int) -> None:
        nonlocal kept
        if c not in chosen:
            chosen.add(c)
            kept += bounds[c][1] - bounds[c][0]

    covered = 0
    for c in range(len(bounds) - 1, -1, -1):
        if covered >= max(1, tail):
            break
        take(c)
        covered += bounds[c][1] - bounds[c][0]
    if start == 0:
        take(0)
    means = [sum(values[a:b]) / (b - a) for a, b in bounds]
    for c in sorted(range(len(bounds)), key=lambda c: (-means[c], c)):
        if kept >= budget:
            break
        take(c)
    return [p for c in sorted(chosen) for p in range(*bounds[c])]


def uniform_chunks(n: int, start: int, keep: float, chunk: int, tail: int) -> list[int]:
    """The same budget spread evenly (a baseline for fidelity comparisons)."""
    span = n - start
    flat: list[Any] = [0.0] * n
    nchunks = max(1, math.ceil(span / chunk))
    want = max(1, math.ceil(keep * span / chunk))
    for i in range(want):
        c = (i * nchunks) // want
        for p in range(start + c * chunk, min(start + (c + 1) * chunk, n)):
            flat[p] = 1.0
    return select_chunks(flat, start, keep, chunk, tail)
