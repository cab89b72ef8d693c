"""Prefilling several prompts in one forward pass, on mlx-lm's batch caches.

The recipe is ``mlx_lm.generate``'s own batched prompt processing
(``PromptProcessingBatch``): merge the sequences' per-layer caches into mlx-lm's
batch caches (``BatchKVCache``, ``ArraysCache``, ``BatchRotatingKVCache``), feed the
prompts right-padded with ``prepare(lengths=..., right_padding=...)`` so every real
token keeps its position and the causal mask hides the padding, ``finalize()`` (which
turns the right padding into left padding), then feed the last prompt token of every
row as one ``(B, 1)`` step for the logits. Each row's cache is then extracted
(``extract(i)``) so the sequence joins the decoder exactly as after a single prefill.

A prompt's checkpoints (see :attr:`PrefillTask.checkpoints`) split its body into
segments; the batch processes segment ``k`` of every row together and snapshots the
rows whose segment ended at a checkpoint, as mlx-lm's ``BatchGenerator`` does.

:class:`mlxcore.defaults.chunked_prefill.ChunkedPrefill` uses these functions; a plugin's
dense prefill strategy may reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from mlxcore.engine.adapters import forward
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import LayerCache, PrefillResult, PrefillTask

BATCHABLE_CACHES: tuple[type, ...] = (KVCache, ArraysCache, RotatingKVCache)
"""Per-layer cache types mlx-lm can merge into a batch and extract again (exact types:
a subclass may keep state the batch caches do not know about)."""


def cache_is_batchable(cache: LayerCache, length: int) -> bool:
    """True when every layer of ``cache`` is a kind mlx-lm's batch caches can hold,
    for a prompt of ``length`` tokens.

    A sliding-window layer (``RotatingKVCache``) qualifies only while the prompt fills
    at most half its window: two such rows padded to a common length then still fit
    the window, nothing is trimmed or rotated, and the batch computes exactly what a
    single prefill does. Past the window, the batch cache's trimming changes the
    float rounding slightly (measured: logits differ by ~3e-6), which could flip a
    greedy token.
    """
    for layer in cache:
        kind = type(layer)
        if kind not in BATCHABLE_CACHES:
            return False
        if kind is RotatingKVCache and (layer.keep != 0 or 2 * length > layer.max_size):
            return False  # BatchRotatingKVCache has no "keep" (attention sinks)
    return bool(cache)


def segments(task: PrefillTask) -> list[list[int]]:
    """The prompt body still to process (all but the last token), split at the
    task's checkpoints: segment ``k`` ends at checkpoint ``k``."""
    body = list(task.remaining)[:-1]
    out: list[list[int]] = []
    done = 0
    for stop in (c - task.start for c in task.checkpoints):
        out.append(body[done:stop])
        done = stop
    out.append(body[done:])
    return out


def _feed(
    model: Any, cache: LayerCache, rows: list[list[int]], requests: list[GenerationRequest]
) -> None:
    """Process one right-padded segment per row (rows may be empty) of ``requests``."""
    lengths = [len(r) for r in rows]
    width = max(lengths)
    if width == 0:
        return
    if width == 1 and min(lengths) == 0:
        # BatchRotatingKVCache takes a one-token step as decoding, which it refuses
        # while right padding is pending: pad to two tokens instead.
        width = 2
    padding = [width - n for n in lengths]
    padded = max(padding) > 0
    if padded:
        for layer in cache:
            layer.prepare(lengths=lengths, right_padding=padding)
    forward(model, mx.array([r + [0] * (width - len(r)) for r in rows]), cache, requests)
    if padded:
        for layer in cache:
            layer.finalize()
    mx.eval([layer.state for layer in cache])


def _row(cache: LayerCache, i: int) -> LayerCache:
    return [layer.extract(i) for layer in cache]


def prefill_together(model: Any, tasks: Sequence[PrefillTask]) -> list[PrefillResult]:
    """Prefill ``tasks`` in one batch; fill each ``task.cache``, return one result each.

    Each task's remaining prompt is processed whole (the caller bounds its length) and
    its checkpoints are snapshotted through ``task.snapshot``. The tasks' caches must
    pass :func:`cache_is_batchable` and share one layout (the same model). On an
    exception the tasks' own caches are untouched (the batch works on merged copies),
    so the caller may prefill them one by one instead.
    """
    merged: LayerCache = [
        type(layer).merge([t.cache[i] for t in tasks]) for i, layer in enumerate(tasks[0].cache)
    ]
    parts = [segments(t) for t in tasks]
    requests = [t.request for t in tasks]
    for k in range(max(len(p) for p in parts)):
        _feed(model, merged, [p[k] if k < len(p) else [] for p in parts], requests)
        for i, (task, p) in enumerate(zip(tasks, parts, strict=True)):
            if k < len(p) - 1 and task.snapshot is not None:
                own, task.cache = task.cache, _row(merged, i)
                try:
                    task.snapshot(task.start + sum(len(s) for s in p[: k + 1]))
                finally:
                    task.cache = own
    last = mx.array([[t.request.prompt_tokens[-1]] for t in tasks])
    logits = forward(model, last, merged, requests)[:, -1, :]
    rows = [_row(merged, i) for i in range(len(tasks))]
    mx.eval(logits, [[layer.state for layer in row] for row in rows])
    for task, row in zip(tasks, rows, strict=True):
        task.cache = row
    return [PrefillResult(logits=logits[i : i + 1]) for i in range(len(tasks))]
