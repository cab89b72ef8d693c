"""Chunked prefill, the default prefill strategy: the prompt in chunks of
``--prefill-step-size`` tokens, and short prompts of several requests together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from mlxcore.engine.adapters import forward
from mlxcore.engine.batch_prefill import cache_is_batchable, prefill_together
from mlxcore.engine.kv_quant import KVQuantization
from mlxcore.engine.sampling import prompt_token_logprobs
from mlxcore.engine.strategies import (
    PrefillGenerator,
    PrefillResult,
    PrefillStrategy,
    PrefillTask,
    StepToken,
)

SCORED_ELEMENTS = 1 << 25
"""Most logits (``tokens x vocabulary``) one chunk materialises when a request asks for
its prompt's logprobs: 33.5 M float32 values, 134 MB (221 tokens of a 151,936-token
vocabulary; a chunk holds at least 16 tokens and at most ``step_size``)."""

FIRST_SCORED_CHUNK = 16
"""The first scored chunk's size, before the vocabulary is known from its logits."""

BATCH_OPTION = "batched_prefill"
"""Request option: ``{"batched_prefill": false}`` keeps a request out of batched prefill."""


class ChunkedPrefill(PrefillStrategy):
    """Processes the prompt in chunks of ``step_size`` tokens, then the last token
    alone for its logits (the same split as ``mlx_lm.generate``). A request that asks
    for prompt logprobs has them computed from each chunk's logits, in the same pass.

    Prompts whose remaining part fits in one chunk can also be prefilled together
    (:meth:`prefill_batch`, mlx-lm's batched prompt processing, see
    :mod:`mlxcore.engine.batch_prefill`).
    """

    name = "chunked"
    runs_in_lockstep = True
    supports_adapters = True

    def __init__(
        self, model: Any, step_size: int = 2048, kv_quant: KVQuantization | None = None
    ) -> None:
        self.model = model
        self.step_size = step_size
        self.kv_quant = kv_quant
        """Quantize the cache after the chunk that reaches its start (``--kv-cache-dtype``)."""
        self._batches = 0
        self._batched_requests = 0

    @property
    def stops_at_checkpoints(self) -> bool:
        return type(self).prefill is ChunkedPrefill.prefill  # not a subclass's own prefill

    def can_batch(self, task: PrefillTask) -> bool:
        if type(self).prefill is not ChunkedPrefill.prefill:
            return False  # a subclass changed how a prompt is filled
        request = task.request
        if request.media is not None or request.options.get(BATCH_OPTION) is False:
            return False
        if request.sampling.prompt_logprobs is not None:
            return False  # scored chunk by chunk in prefill()
        if len(task.remaining) > self.step_size + 1:
            return False
        if self.kv_quant is not None and len(request.prompt_tokens) - 1 >= self.kv_quant.start:
            return False  # quantized after its body: prefilled alone, as mlx-lm does
        return cache_is_batchable(task.cache, len(request.prompt_tokens))

    def prefill_batch(self, tasks: Sequence[PrefillTask]) -> list[PrefillResult]:
        results = prefill_together(self.model, tasks)
        self._batches += 1
        self._batched_requests += len(tasks)
        return results

    def stats(self) -> dict[str, float]:
        return {"batches": self._batches, "batched_requests": self._batched_requests}

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        tokens = mx.array(list(task.remaining))[None]
        body = tokens.shape[1] - 1
        done = 0
        top = task.request.sampling.prompt_logprobs
        scored: list[StepToken] | None = None if top is None else []
        step = self.step_size if top is None else min(self.step_size, FIRST_SCORED_CHUNK)
        while done < body:
            stops = [c - task.start for c in task.checkpoints]  # may grow between chunks
            n = min(task.step_tokens or step, step, body - done)
            upcoming = [s for s in stops if done < s < done + n]
            if upcoming:
                n = upcoming[0] - done
            out = forward(self.model, tokens[:, done : done + n], task.cache, [task.request])
            if self.kv_quant is not None:
                self.kv_quant.quantize_prefill(task.cache)
            mx.eval([c.state for c in task.cache])
            if scored is not None and top is not None:
                targets = tokens[0, done + 1 : done + n + 1]
                scored += prompt_token_logprobs(out[0], targets, top)
                vocab = int(out.shape[-1])
                step = min(self.step_size, max(FIRST_SCORED_CHUNK, SCORED_ELEMENTS // vocab))
            done += n
            if done in stops and task.snapshot is not None:
                task.snapshot(task.start + done)
            yield done
        logits = forward(self.model, tokens[:, body:], task.cache, [task.request])[:, -1, :]
        return PrefillResult(logits=logits, prompt_logprobs=scored)
