"""The SpecPrefill prefill strategy.

For a long enough prompt: the draft scores the prompt tokens, whole chunks are
selected, and the target is prefilled with only the kept tokens. Positions: with
``N`` prompt tokens of which ``C`` were cached and ``K`` new ones kept, the cache
ends up holding ``C + K`` entries and decoding continues at cache offset ``C + K``.
Every kept token is rotated at ``original position - S`` with ``S = N - C - K``
(the cached prefix is re-rotated by ``-S`` too), so the last prompt token sits at
``N - 1 - S = C + K - 1`` and decode step ``t`` at ``N + t - S``. RoPE attention
depends only on query-key distances, which are therefore exactly those of the full
prompt with decoding at position ``N + t``; and the cache stays a stock ``KVCache``
that batches, trims and decodes at the speed of its ``C + K`` entries.

A position-free target (:class:`~.sequential.SequentialStack`, Nemotron-H) needs none
of this: its kept tokens simply go through its own forward pass, in order.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.engine.strategies import PrefillGenerator, PrefillResult, PrefillStrategy, PrefillTask
from mlxcore_specprefill.options import Settings, request_settings
from mlxcore_specprefill.scoring import score_tokens, select_chunks
from mlxcore_specprefill.sequential import Target
from mlxcore_specprefill.stack import TextStack, Unsupported

log = logging.getLogger("mlxcore.plugins.specprefill")
"""Under ``mlxcore`` so the CLI's log handler shows it."""


@attrs.define
class _Counters:
    applications: int = 0
    fallbacks: int = 0
    errors: int = 0
    tokens_total: int = 0
    tokens_kept: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    seconds_saved_estimate: float = 0.0


class SpecPrefill(PrefillStrategy):
    """Attention-scored sparse prefill with a draft model.

    Args:
        target: the target model's :class:`TextStack`, or its
            :class:`~.sequential.SequentialStack` when it has no positional encoding.
        draft: the draft model's :class:`TextStack` (same tokenizer).
        settings: server-wide defaults; requests override them.
        step_size: tokens per forward pass (draft prefill and target chunks).
    """

    name = "specprefill"

    def __init__(
        self, target: Target, draft: TextStack, settings: Settings, step_size: int = 512
    ) -> None:
        self.target = target
        self.draft = draft
        self.settings = settings
        self.step_size = step_size
        self.chunked = ChunkedPrefill(target.model, step_size)
        self.counters = _Counters()
        self.last_kept: list[int] = []
        """Prompt positions the latest sparse prefill kept (for tests and debugging)."""

    def stats(self) -> dict[str, float]:
        """Applications, fallbacks, tokens and (estimated) time saved, for /metrics."""
        return {f"specprefill_{k}": float(v) for k, v in attrs.asdict(self.counters).items()}

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        """Sparse prefill when it applies; chunked prefill otherwise or on any error."""
        try:
            settings = request_settings(self.settings, task.request.options)
        except ValueError as exc:  # validated in the front end; never fail here
            log.warning("specprefill: ignoring bad request options: %s", exc)
            settings = self.settings
        new = len(task.request.prompt_tokens) - task.start
        scored = task.request.sampling.prompt_logprobs is not None  # every position needed
        if not settings.enabled or scored or new < max(2, settings.threshold):
            return (yield from self.chunked.prefill(task))
        try:
            self.target.check_cache(task.cache)
            if self.target.window and task.start:
                raise Unsupported("a reused prefix with sliding-window layers")
        except Unsupported as exc:
            log.info("specprefill: falling back to chunked prefill: %s", exc)
            self.counters.fallbacks += 1
            return (yield from self.chunked.prefill(task))
        touched = False
        try:
            t0 = time.perf_counter()
            draft_time = 0.0
            scorer = score_tokens(
                self.draft,
                task.request.prompt_tokens,
                settings.lookahead,
                self.step_size,
                settings.decode,
            )
            while True:
                t = time.perf_counter()
                try:
                    next(scorer)
                except StopIteration as stop:
                    scores = stop.value
                    draft_time += time.perf_counter() - t
                    break
                draft_time += time.perf_counter() - t
                yield task.start  # the draft's chunks fill no target state
            kept = select_chunks(
                scores, task.start, settings.keep, settings.chunk, self._tail(settings)
            )
            self.last_kept = kept
            touched = True
            target_time = 0.0
            gen = self._sparse(task, kept)
            while True:
                t = time.perf_counter()
                try:
                    done = next(gen)
                except StopIteration as stop:
                    logits = stop.value
                    target_time += time.perf_counter() - t
                    break
                target_time += time.perf_counter() - t
                yield done
        except Exception:
            log.exception("specprefill failed; falling back to chunked prefill for this request")
            self.counters.errors += 1
            if touched:  # the target cache is partly filled: start over from scratch
                task.cache[:] = make_prompt_cache(self.target.model)
                task.start = 0
            return (yield from self.chunked.prefill(task))
        total = len(task.request.prompt_tokens)
        self._account(total, task.start, len(kept), draft_time, target_time)
        log.debug(
            "specprefill: kept %d of %d new tokens in %.3fs",
            len(kept),
            new,
            time.perf_counter() - t0,
        )
        return PrefillResult(
            logits=logits,
            reusable=len(kept) == new,
            usage={"prompt_tokens_total": total, "prompt_tokens_kept": task.start + len(kept)},
        )

    def _tail(self, settings: Settings) -> int:
        """Prompt tokens always kept: the setting, and at least the widest sliding
        window, so that a rotating cache ends up holding the last window of real
        positions (what decoding reads)."""
        return max(settings.tail, self.target.window, 1)

    def _sparse(self, task: PrefillTask, kept: list[int]) -> Any:
        """Fill ``task.cache`` with the kept tokens (see the module docstring)."""
        prompt = task.request.prompt_tokens
        n = len(prompt)
        shift = n - task.start - len(kept)
        assert kept and kept[-1] == n - 1, "the last prompt token must be kept"
        self.target.shift_positions(task.cache, task.start, -shift)
        body = kept[:-1]
        placed = mx.array([*range(task.start), *body], dtype=mx.int32) - shift
        bounds = list(range(0, len(body), self.step_size))
        if self.target.window and len(bounds) > 1 and len(body) - bounds[-1] == 1:
            bounds.pop()  # no single-token step through a sliding-window layer
        for a, b in zip(bounds, [*bounds[1:], len(body)][: len(bounds)], strict=True):
            part = body[a:b]
            ids = mx.array([prompt[p] for p in part], dtype=mx.int32)[None]
            positions = placed[task.start + a : task.start + b]
            self.target.forward(ids, positions, task.cache, past=placed[: task.start + a])
            mx.eval([c.state for c in task.cache])
            yield task.start + b
        last = mx.array([[prompt[n - 1]]], dtype=mx.int32)
        logits = self.target.model(last, cache=task.cache)[:, -1, :]
        mx.eval(logits)
        return logits

    def _account(
        self, total: int, start: int, kept: int, draft_time: float, target_time: float
    ) -> None:
        c = self.counters
        new = total - start
        c.applications += 1
        c.tokens_total += new
        c.tokens_kept += kept
        c.draft_seconds += draft_time
        c.target_seconds += target_time
        # Estimate: a dense target prefill costs target_time scaled by new/kept tokens
        # (linear in tokens, so it under-counts attention's quadratic part).
        dense = target_time * new / max(1, kept)
        c.seconds_saved_estimate += dense - draft_time - target_time
