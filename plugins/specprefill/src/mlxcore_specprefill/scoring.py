"""Token importance from a draft model's attention, and chunk selection.

The draft reads the whole prompt with its own forward pass and, when its caches can
be trimmed, greedily decodes ``decode`` lookahead tokens (the SpecPrefill paper's
"speculated" tokens: what the answer is about to need). Its cache is then cut back
to just before the last ``lookahead`` prompt tokens, and those tokens plus the
generated ones are run through :class:`~.stack.TextStack` with an observer that
reads, in every attention layer, their softmax attention over the prompt. A token's
importance is the largest, over layers and heads, of its attention averaged over
those query positions. Selection then keeps whole chunks: the prompt's head and
tail always, then the best-scoring chunks until the budget is reached.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from mlxcore_specprefill.stack import TextStack


def score_tokens(
    draft: TextStack, tokens: Sequence[int], lookahead: int, step: int, decode: int = 0
) -> Generator[int, None, mx.array]:
    """Importance of every prompt token, shape ``(len(tokens),)`` float32.

    ``lookahead`` final prompt positions and, if the draft's caches are trimmable
    (not recurrent), ``decode`` greedily generated draft tokens are the queries.
    A generator: yields the count of prompt tokens the draft processed after each
    chunk, returns the scores.
    """
    n = len(tokens)
    w = max(1, min(lookahead, n - 1))
    ids = mx.array(list(tokens), dtype=mx.int32)[None]
    cache = make_prompt_cache(draft.model)
    extra = decode if decode > 0 and can_trim_prompt_cache(cache) else 0
    end = n - 1 if extra else n - w
    done = 0
    while done < end:
        size = min(step, end - done)
        # only the cache is evaluated: the (unused) logits of the chunk are never computed
        draft.model(ids[:, done : done + size], cache=cache)
        mx.eval([c.state for c in cache])
        done += size
        yield done
    generated: list[int] = []
    if extra:
        logits = draft.model(ids[:, n - 1 :], cache=cache)[:, -1, :]
        generated = greedy_tokens(draft.model, cache, logits, extra)
        trim_prompt_cache(cache, w + len(generated) - 1)
    scores = observe_queries(draft, cache, [*tokens[n - w :], *generated], n - w, n)
    yield n
    return scores


def greedy_tokens(model: Any, cache: list[Any], logits: mx.array, count: int) -> list[int]:
    """``count`` greedy tokens from ``logits`` (the last prompt position's) on;
    feeds all but the last one to ``model`` (the cache grows by ``count - 1``)."""
    out = [argmax_token(logits)]
    while len(out) < count:
        logits = model(mx.array([[out[-1]]], dtype=mx.int32), cache=cache)[:, -1, :]
        out.append(argmax_token(logits))
    return out


def argmax_token(logits: mx.array) -> int:
    """The greedy token of ``logits`` ``(1, vocab)``."""
    return int(cast(int, mx.argmax(logits, axis=-1).item()))


def observe_queries(
    draft: TextStack, cache: list[Any], queries: Sequence[int], start: int, n_keys: int
) -> mx.array:
    """Run ``queries`` at positions ``start, start + 1, ...`` through ``draft`` (its
    cache holds the ``start`` tokens before them) and return, per key position below
    ``n_keys``, the max over layers and heads of the attention averaged over the
    queries. The cache grows by ``len(queries)``."""
    best = [mx.zeros((n_keys,), dtype=mx.float32)]

    def observe(index: int, q: mx.array, keys: mx.array, scale: float) -> None:
        # evaluated layer by layer: one layer's (heads, queries, keys) scores at a time
        best[0] = mx.maximum(best[0], _layer_importance(q, keys, scale)[:n_keys])
        mx.eval(best[0])

    ids = mx.array(list(queries), dtype=mx.int32)[None]
    positions = mx.arange(start, start + len(queries), dtype=mx.int32)
    draft.forward(ids, positions, cache, observe)
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
