"""Engine-side state of an admitted request, the guard around its logits processors and
its prefill's snapshot callback.

Kept apart from :mod:`mlxcore.engine.loop` (which owns these records) so the loop reads
as the request's path: admit, prefill, decode, finish.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.engine.events import EngineStep, RequestHandle, Usage
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.sampling import sample_first
from mlxcore.engine.strategies import (
    CacheStrategy,
    Decoder,
    DecodeSequence,
    LogitsProcessor,
    PrefillGenerator,
    PrefillResult,
    PrefillTask,
    Sampler,
    StepToken,
    is_stateless,
    stateless,
)
from mlxcore.errors import MlxcoreError, RequestFault

log = logging.getLogger(__name__)


class DecodeTally:
    """A request's decode steps: when the first began and the last ended (wall-clock
    nanoseconds), how many, the tokens they gave it, and how many gave more than one (a
    speculative decoder's rounds with accepted drafts)."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.steps = 0
        self.tokens = 0
        self.multi_token_steps = 0

    def add(self, end_ns: int, tokens: int) -> None:
        """One more step, ended at ``end_ns``, that gave ``tokens`` tokens."""
        self.end_ns = end_ns
        self.steps += 1
        self.tokens += tokens
        self.multi_token_steps += tokens > 1

    def as_step(self) -> EngineStep:
        figures = {"steps": self.steps, "tokens": self.tokens}
        figures["multi_token_steps"] = self.multi_token_steps
        return EngineStep("decode", self.start_ns, self.end_ns, figures)


@attrs.define(eq=False)
class AdmittedRequest:
    """Engine-side state of one admitted request (owned by the batch loop)."""

    handle: RequestHandle
    sampler: Sampler
    processors: list[LogitsProcessor]
    stop_ids: frozenset[int]
    usage: Usage
    prefill: PrefillGenerator | None = None
    task: PrefillTask | None = None
    seq: DecodeSequence | None = None
    reusable: bool = True
    generated: int = 0
    failed: Exception | None = None
    """What a logits processor raised (:func:`guard`); the request ends after the step."""
    prefill_begun: bool = False
    """True once the prefill generator ran a step (the task can no longer be batched)."""
    solo: bool = False
    """True after a batched prefill with this task failed: prefill it alone."""
    processed: int = 0
    """Prompt tokens the prefill processed so far (after the cached ``task.start``)."""
    prompt_logprobs: list[StepToken] | None = None
    """Computed by the prefill, sent with the first tokens."""
    decoding: DecodeTally | None = None
    """Its decode steps so far (for observers: :class:`~mlxcore.engine.events.EngineStep`)."""

    @property
    def request(self) -> GenerationRequest:
        return self.handle.request

    @property
    def progress(self) -> int:
        """Prompt tokens the request's cache holds now."""
        return (self.task.start if self.task is not None else 0) + self.processed

    @property
    def remaining(self) -> int:
        """Prompt tokens still to process."""
        return len(self.request.prompt_tokens) - self.progress


@attrs.frozen
class Parked:
    """A request waiting until ``leader``'s prefill holds its first ``length`` tokens."""

    follower: AdmittedRequest
    leader: AdmittedRequest
    length: int


def unbuilt_sampler(logprobs: Any) -> Any:
    """Stands in until the request's own sampler is built (building may fail)."""
    raise MlxcoreError("the request's sampler was never built")


def guard(live: AdmittedRequest, proc: LogitsProcessor) -> LogitsProcessor:
    """Wrap a processor so its exception fails only its own request, not the batch."""

    def guarded(tokens: Any, logits: Any) -> Any:
        if live.failed is not None:
            return logits
        try:
            return proc(tokens, logits)
        except RequestFault as exc:
            live.failed = exc
        except Exception as exc:
            name = getattr(proc, "__name__", proc)
            live.failed = RuntimeError(f"logits processor {name!r} failed: {exc}")
        return logits

    return stateless(guarded) if is_stateless(proc) else guarded


def snapshot_callback(cache: CacheStrategy, task: PrefillTask) -> Callable[[int], None]:
    """A prefill task's ``snapshot`` callback: offer ``cache`` the task's cache at a
    checkpoint (the strategy copies what it keeps). It holds the task weakly: a task
    holding its own callback would be a reference cycle, and its sequence's whole cache
    would wait for Python's cycle collector after the request ended (measured: every
    turn of a long session stayed in memory until a full collection)."""
    ref = weakref.ref(task)

    def snapshot(n: int) -> None:
        held = ref()
        if held is None:
            return
        try:
            cache.store_checkpoint(held.request.cache_tokens[:n], held.cache)
        except Exception:
            log.exception("cache strategy %s failed to store a snapshot", cache.name)

    return snapshot


def first_sequence(
    live: AdmittedRequest, result: PrefillResult, decoder: Decoder, prefill_name: str
) -> tuple[DecodeSequence, StepToken]:
    """``live``'s sequence for the decoder once its prefill gave ``result``: the first
    token sampled (with the request's processors), the prompt's logprobs kept for the
    first event. Raises where the request cannot go on (the loop fails it alone)."""
    assert live.task is not None
    live.reusable = result.reusable
    live.usage.extra.update(result.usage)
    if result.position_offset and not decoder.supports_position_offset:
        raise MlxcoreError(
            f"decoder {decoder.name!r} cannot continue a sequence with a "
            "position offset (a media request on an M-RoPE model)"
        )
    if live.request.sampling.prompt_logprobs is not None:
        if result.prompt_logprobs is None:
            raise MlxcoreError(f"{prefill_name} prefill computes no prompt logprobs")
        live.prompt_logprobs = result.prompt_logprobs
    prompt = list(live.request.prompt_tokens)
    sampling = live.request.sampling
    first = sample_first(live.sampler, live.processors, result.logits, prompt, sampling)
    seq = DecodeSequence(
        uid=live.handle.uid,
        request=live.request,
        cache=live.task.cache,
        tokens=[*prompt, first.token],
        next_token=first.token,
        sampler=live.sampler,
        logits_processors=[guard(live, p) for p in live.processors],
        position_offset=result.position_offset,
    )
    return seq, first
