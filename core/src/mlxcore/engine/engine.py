"""The engine: one generation thread that owns MLX, fed through a bounded queue.

Every front end (the CLI's ``generate``, the HTTP server) submits
:class:`~mlxcore.engine.request.GenerationRequest` objects here and receives
events through a sink. The thread runs continuous batching: between decode
steps it admits waiting requests (up to ``max_num_seqs``), advances at most one
prefill chunk (or prefills several short waiting prompts together, in one forward
pass, when the prefill strategy can batch them: ``--prefill-batch-size``), and
retires finished sequences. The strategies (cache, prefill, decoder) come from the
plugin hooks once, at construction.
"""

from __future__ import annotations

import collections
import copy
import itertools
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.config import ServerConfig
from mlxcore.engine.events import Event, EventSink, FinishEvent, RequestHandle, TokenEvent, Usage
from mlxcore.engine.memory import MemoryBudget
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.sampling import make_processors, make_sampler, token_with_logprobs
from mlxcore.engine.strategies import (
    DecodeSequence,
    LogitsProcessor,
    PrefillGenerator,
    PrefillResult,
    PrefillTask,
    Sampler,
    SequenceCache,
    StepToken,
)
from mlxcore.engine.threads import run_job
from mlxcore.errors import MlxcoreError
from mlxcore.hooks import PluginHooks
from mlxcore.model_info import ModelInfo

log = logging.getLogger(__name__)


class EngineOverloaded(MlxcoreError):
    """The waiting queue is full; the caller should retry later (HTTP 503)."""


class RequestRejected(MlxcoreError):
    """The request can never be served as given (e.g. prompt too long); HTTP 400."""


@attrs.define(eq=False)
class _Live:
    """Engine-side state of one admitted request."""

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
    failed: str | None = None
    started: bool = False
    """True once the prefill generator ran a step (the task can no longer be batched)."""
    solo: bool = False
    """True after a batched prefill with this task failed: prefill it alone."""

    @property
    def request(self) -> GenerationRequest:
        return self.handle.request


class Engine:
    """Continuous-batching generation over one model.

    Args:
        model: the loaded mlx-lm model.
        info: facts about the model.
        hooks: the plugin facade, asked once for the strategies.
        config: server configuration (batch and queue bounds).
    """

    def __init__(
        self, model: Any, info: ModelInfo, hooks: PluginHooks, config: ServerConfig
    ) -> None:
        self.model = model
        self.info = info
        self.hooks = hooks
        self.config = config
        self.memory = MemoryBudget.for_model(model, config.gpu_memory_utilization)
        self.max_context: int | None = config.max_model_len or info.context_length
        """The most tokens a sequence may hold: ``--max-model-len``, else the model's own."""
        self.cache = hooks.cache_strategy(model, info, config)
        self.prefill = hooks.prefill_strategy(model, info, config)
        self.decoder = hooks.decoder(model, info, config)
        self._waiting: collections.deque[RequestHandle] = collections.deque()
        self._live: dict[int, _Live] = {}
        self._prefilling: collections.deque[_Live] = collections.deque()
        self._wake = threading.Condition()
        self._uids = itertools.count(1)
        self._running: threading.Event | None = None
        self._stopping = False
        log.info(
            "engine strategies: cache=%s prefill=%s decoder=%s",
            self.cache.name,
            self.prefill.name,
            self.decoder.name,
        )

    # -- caller side (any thread) -------------------------------------------

    def start(self) -> None:
        """Start the generation thread (idempotent)."""
        with self._wake:
            if self._running is None:
                self._stopping = False
                self._running = run_job(self._run)

    def shutdown(self) -> None:
        """Stop the thread; requests still running finish with ``cancelled``."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
            running, self._running = self._running, None
        if running is not None:
            running.wait(timeout=30)

    def submit(self, request: GenerationRequest, sink: EventSink) -> RequestHandle:
        """Queue ``request``; events go to ``sink`` on the engine thread.

        Raises :class:`RequestRejected` for a request that can never run and
        :class:`EngineOverloaded` when the waiting queue is full.
        """
        self._validate(request)
        handle = RequestHandle(next(self._uids), request, sink)
        with self._wake:
            self._drop_cancelled_waiting()
            if len(self._waiting) >= self.config.max_queue_size:
                raise EngineOverloaded(
                    f"server busy: {len(self._waiting)} requests already waiting"
                )
            self._waiting.append(handle)
            self._wake.notify()
        self.start()
        return handle

    def stream(self, request: GenerationRequest) -> Iterator[Event]:
        """Submit ``request`` and yield its events in order (blocking; for the CLI)."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        handle = self.submit(request, events.put)
        try:
            while True:
                event = events.get()
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            handle.cancel()

    def stats(self) -> dict[str, float]:
        """Load and strategy counters (read from any thread; values are snapshots)."""
        cache = self.cache.stats()
        out: dict[str, float] = {
            "requests_running": len(self._live),
            "requests_waiting": len(self._waiting),
            "prefix_cache_hits": cache.hits,
            "prefix_cache_misses": cache.misses,
            "prefix_cache_reused_tokens": cache.reused_tokens,
            "prefix_cache_entries": cache.entries,
            "prefix_cache_bytes": cache.nbytes,
        }
        out.update({f"decoder_{k}": v for k, v in self.decoder.stats().items()})
        out.update({f"prefill_{k}": v for k, v in self.prefill.stats().items()})
        return out

    def _validate(self, request: GenerationRequest) -> None:
        n = len(request.prompt_tokens)
        if n == 0:
            raise RequestRejected("the prompt is empty")
        limit = self.max_context
        if limit is not None and n + request.max_tokens > limit:
            raise RequestRejected(
                f"prompt ({n} tokens) plus max_tokens ({request.max_tokens}) exceeds the "
                f"model's context length of {limit} tokens"
            )
        fits = self.memory.max_context()
        if fits is not None and n + request.max_tokens > fits:
            raise RequestRejected(
                f"prompt ({n} tokens) plus max_tokens ({request.max_tokens}) needs more memory "
                f"than this server has: at most {fits} tokens of context fit"
            )

    # -- engine thread ----------------------------------------------------

    def _run(self, stream: Any) -> None:
        with mx.stream(stream):
            while True:
                with self._wake:
                    while not self._stopping and not self._waiting and not self._live:
                        self._wake.wait()
                    if self._stopping:
                        break
                    admitted = self._take_waiting()
                for handle in admitted:
                    self._admit(handle)
                self._retire_cancelled()
                if self._prefilling and not self._prefill_together():
                    self._advance_prefill()
                if len(self.decoder):
                    self._decode_step()
        for live in list(self._live.values()):
            self._finish(live, "cancelled")

    def _take_waiting(self) -> list[RequestHandle]:
        """Pop admissible requests (caller holds the lock); drop cancelled ones."""
        self._drop_cancelled_waiting()
        room = self.config.max_num_seqs - len(self._live)
        taken = []
        while room > 0 and self._waiting:
            taken.append(self._waiting.popleft())
            room -= 1
        return taken

    def _drop_cancelled_waiting(self) -> None:
        """Requests cancelled while queued leave the queue at once (caller holds the lock)."""
        if not any(h.cancel_reason is not None for h in self._waiting):
            return
        keep: collections.deque[RequestHandle] = collections.deque()
        for handle in self._waiting:
            if handle.cancel_reason is None:
                keep.append(handle)
            else:
                handle.finished.set()
                handle.sink(
                    FinishEvent(handle.cancel_reason, Usage(len(handle.request.prompt_tokens)))
                )
        self._waiting = keep

    def _admit(self, handle: RequestHandle) -> None:
        req = handle.request
        usage = Usage(prompt_tokens=len(req.prompt_tokens))
        live = _Live(handle, make_sampler(req.sampling), [], frozenset(), usage)
        self._live[handle.uid] = live
        try:
            live.processors = make_processors(req.sampling) + self.hooks.logits_processors(
                req, self.info
            )
            live.stop_ids = self.info.eos_token_ids | req.stop_token_ids
            if req.cache_key is not None and len(req.cache_key) != len(req.prompt_tokens):
                raise ValueError("cache_key must be as long as the prompt")
            lookup = self.cache.lookup(req.cache_tokens)
            usage.cached_tokens = lookup.cached_tokens
            live.task = PrefillTask(req, lookup.cache, lookup.cached_tokens)
            live.task.snapshot = self._snapshotter(live.task)
            live.prefill = self.prefill.prefill(live.task)
        except Exception as exc:
            self._fail(live, exc)
            return
        self._prefilling.append(live)

    def _snapshotter(self, task: PrefillTask) -> Any:
        """The ``snapshot`` callback: keep a copy of the cache at a checkpoint."""

        def snapshot(n: int) -> None:
            try:
                self.cache.store(task.request.cache_tokens[:n], copy.deepcopy(task.cache))
            except Exception:
                log.exception("cache strategy %s failed to store a snapshot", self.cache.name)

        return snapshot

    def _batchable(self, live: _Live) -> bool:
        return (
            not live.started
            and not live.solo
            and live.handle.cancel_reason is None
            and live.task is not None
            and self.prefill.can_batch(live.task)
        )

    def _prefill_together(self) -> bool:
        """Prefill the waiting head and the not-yet-started prompts that can join it in
        one batch (``--prefill-batch-size``); False when there was nothing to batch."""
        cap, budget = self.config.prefill_batch_size, self.config.prefill_step_size
        if cap < 2 or not self._batchable(self._prefilling[0]):
            return False
        group = [self._prefilling[0]]
        for live in itertools.islice(self._prefilling, 1, None):
            if len(group) >= cap:
                break
            if self._batchable(live) and _cheap_enough([*group, live], budget):
                group.append(live)
        if len(group) < 2:
            return False
        tasks = [live.task for live in group if live.task is not None]
        try:
            results = self.prefill.prefill_batch(tasks)
            if len(results) != len(group):
                raise MlxcoreError(f"{len(results)} results for {len(group)} prompts")
        except Exception:
            log.exception("batched prefill failed; prefilling these prompts one by one")
            for live in group:
                live.solo = True
            return False
        for live, result in zip(group, results, strict=True):
            self._prefilling.remove(live)
            if live.prefill is not None:
                live.prefill.close()
            self._prefilled(live, result)
        return True

    def _advance_prefill(self) -> None:
        live = self._prefilling[0]
        assert live.prefill is not None and live.task is not None
        if live.handle.cancel_reason is not None:
            self._prefilling.popleft()
            self._finish(live, live.handle.cancel_reason)
            return
        live.started = True
        try:
            next(live.prefill)
            return
        except StopIteration as done:
            result = done.value
        except Exception as exc:
            self._prefilling.popleft()
            self._fail(live, exc)
            return
        self._prefilling.popleft()
        self._prefilled(live, result)

    def _prefilled(self, live: _Live, result: PrefillResult) -> None:
        """A prefill finished: sample the first token and hand the sequence to the decoder."""
        assert live.task is not None
        live.reusable = result.reusable
        live.usage.extra.update(result.usage)
        if result.position_offset and not self.decoder.supports_position_offset:
            self._fail(
                live,
                MlxcoreError(
                    f"decoder {self.decoder.name!r} cannot continue a sequence with a "
                    "position offset (a media request on an M-RoPE model)"
                ),
            )
            return
        prompt = list(live.request.prompt_tokens)
        try:
            first = self._sample_first(live, result.logits, prompt)
        except Exception as exc:
            self._fail(live, exc)
            return
        seq = DecodeSequence(
            uid=live.handle.uid,
            request=live.request,
            cache=live.task.cache,
            tokens=[*prompt, first.token],
            next_token=first.token,
            sampler=live.sampler,
            logits_processors=[_guard(live, p) for p in live.processors],
            position_offset=result.position_offset,
        )
        live.task = None
        live.prefill = None
        live.seq = seq
        if self._emit(live, [first]):
            self._retire(live, SequenceCache(seq.cache, len(seq.tokens) - 1))
        else:
            self.decoder.add(seq)

    def _sample_first(self, live: _Live, logits: Any, prompt: list[int]) -> StepToken:
        if live.processors:
            context = mx.array(prompt)
            for proc in live.processors:
                logits = proc(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = int(live.sampler(logprobs).item())
        sampling = live.request.sampling
        if sampling.logprobs:
            return token_with_logprobs(token, logprobs[0], sampling.top_logprobs)
        return StepToken(token)

    def _decode_step(self) -> None:
        try:
            produced = self.decoder.step()
        except Exception as exc:
            log.exception("decode step failed; failing the sequences in the batch")
            for uid in list(self._live):
                live = self._live[uid]
                if live.prefill is None:
                    self.decoder.remove(uid)
                    self._fail(live, exc)
            return
        for uid, tokens in produced.items():
            found = self._live.get(uid)
            if found is None:
                continue
            live = found
            if live.failed is not None:
                self.decoder.remove(uid)
                self._fail(live, RuntimeError(live.failed))
            elif self._emit(live, tokens):
                self._retire(live, self.decoder.remove(uid))

    def _emit(self, live: _Live, tokens: list[StepToken]) -> bool:
        """Send tokens to the client; True when the request is now finished."""
        kept: list[StepToken] = []
        reason = None
        for tok in tokens:
            kept.append(tok)
            live.generated += 1
            if tok.token in live.stop_ids:
                reason = "stop"
                break
            if live.generated >= live.request.max_tokens:
                reason = "length"
                break
        live.usage.completion_tokens = live.generated
        live.handle.sink(TokenEvent(kept))
        if reason is not None:
            live.handle.cancel(reason)
            return True
        return False

    def _retire_cancelled(self) -> None:
        for uid, live in list(self._live.items()):
            if live.prefill is None and live.handle.cancel_reason is not None:
                self._retire(live, self.decoder.remove(uid))

    def _retire(self, live: _Live, own: SequenceCache | None) -> None:
        """Finish ``live``; offer its cache for prefix reuse."""
        if own is not None and live.seq is not None and live.reusable and own.length > 0:
            prompt = live.request.cache_tokens
            tokens = [*prompt, *live.seq.tokens[len(prompt) :]]
            try:
                self.cache.store(tokens[: own.length], own.cache)
            except Exception:
                log.exception("cache strategy %s failed to store a prefix", self.cache.name)
        self._finish(live, live.handle.cancel_reason or "stop")

    def _finish(self, live: _Live, reason: str, error: str | None = None) -> None:
        self._live.pop(live.handle.uid, None)
        if live.seq is not None:
            live.usage.extra.update(live.seq.usage)
        live.handle.finished.set()
        live.handle.sink(FinishEvent(reason, live.usage, error))

    def _fail(self, live: _Live, exc: BaseException) -> None:
        log.error("request %s failed: %s", live.request.request_id or live.handle.uid, exc)
        self._finish(live, "error", f"{type(exc).__name__}: {exc}")


_PADDING_SLACK = 256
"""Padded tokens a batch may always waste (short prompts cost little either way)."""


def _cheap_enough(group: list[_Live], budget: int) -> bool:
    """Batch only while the padded batch (every row as long as the longest remaining
    prompt) is at most ``budget`` tokens, one prefill chunk, so running streams wait
    no longer for a batch than for a chunk; and while padding at most doubles the work,
    give or take :data:`_PADDING_SLACK` tokens."""
    lengths = [len(live.task.remaining) for live in group if live.task is not None]
    padded = len(lengths) * max(lengths)
    return padded <= budget and padded <= 2 * sum(lengths) + _PADDING_SLACK


def _guard(live: _Live, proc: LogitsProcessor) -> LogitsProcessor:
    """Wrap a processor so its exception fails only its own request, not the batch."""

    def guarded(tokens: Any, logits: Any) -> Any:
        if live.failed is not None:
            return logits
        try:
            return proc(tokens, logits)
        except Exception as exc:
            live.failed = f"logits processor {getattr(proc, '__name__', proc)!r} failed: {exc}"
            return logits

    return guarded
