"""The batch loop: admitted requests, their prefill and the running decode batch.

One :class:`BatchLoop` owns one set of strategies (cache, prefill, decoder) and the
requests admitted into it. The :class:`~mlxcore.engine.engine.Engine` runs one loop at
a time on its generation thread and replaces it with a fresh one (fresh strategies,
fresh caches) after a fault it cannot contain, so nothing half-updated survives.

Containment rules:

* a failure in one request's set-up, prefill, first sampling, logits processors or
  hand-over to the decoder ends that request alone (``error``);
* a decode step that fails is retried without half of its suspects when the decoder
  gives the sequences back intact (:mod:`mlxcore.engine.quarantine`), until the one at
  fault fails alone; otherwise its sequences fail and the decoder is rebuilt (its batch
  state is unknown after the failure);
* a request waiting for another's prefill of their shared prefix (see
  :mod:`mlxcore.engine.prefill_plan`) starts on its own when that one ends, however it ends;
* anything else that raises out of :meth:`BatchLoop.iterate` is a fault: the engine
  fails every request and replaces the loop.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from mlxcore.engine.admitted import (
    AdmittedRequest,
    DecodeTally,
    Parked,
    first_sequence,
    snapshot_callback,
    unbuilt_sampler,
)
from mlxcore.engine.cache_explain import EXPLAIN_OPTION, CacheExplanation
from mlxcore.engine.events import (
    EngineStep,
    Event,
    FinishEvent,
    RequestHandle,
    TokenEvent,
    Usage,
    send,
)
from mlxcore.engine.handoff import release_held
from mlxcore.engine.parking import park, unpark
from mlxcore.engine.parts import EngineParts
from mlxcore.engine.prefill_pacer import StepBudget
from mlxcore.engine.prefill_plan import plan_step
from mlxcore.engine.quarantine import Quarantine, recover_failed_step
from mlxcore.engine.sampling import (
    make_processors,
    make_sampler,
    repair_random_state,
)
from mlxcore.engine.stall import DECODING, IDLE, StallReport, StepWork, report
from mlxcore.engine.step_times import StepTimes
from mlxcore.engine.strategies import (
    DecodeSequence,
    PrefillResult,
    PrefillTask,
    SequenceCache,
    StepToken,
)
from mlxcore.engine.turns import newcomer_waits, take_turns
from mlxcore.errors import MlxcoreError, RequestFault

log = logging.getLogger(__name__)


class BatchLoop:
    """Admission, prefill and decoding over one set of strategies (engine thread only).

    Args:
        parts: the strategy factories and the plugins' processors.
        eos_token_ids: the model's end-of-sequence ids.
        prefill_batch_size: most prompts prefilled together (1: never batch).
        budget: the step budget's settings (:mod:`mlxcore.engine.prefill_pacer`).
        counters: totals kept across loops (``prompt_tokens_processed``).
        step_times: the steps' durations against the target (kept across loops).
    """

    def __init__(
        self,
        parts: EngineParts,
        eos_token_ids: frozenset[int],
        prefill_batch_size: int,
        budget: StepBudget,
        counters: collections.Counter[str] | None = None,
        step_times: StepTimes | None = None,
    ) -> None:
        self.parts = parts
        self.eos_token_ids = eos_token_ids
        self.prefill_batch_size = prefill_batch_size
        self.budget = budget
        self.step_times = step_times or StepTimes(budget.target)
        self.pacer = budget.pacer()
        """Sizes each step's prefill work in time (:mod:`mlxcore.engine.prefill_pacer`)."""
        self.counters: collections.Counter[str] = (
            counters if counters is not None else collections.Counter()
        )
        self.cache = parts.cache()
        self.prefill = parts.prefill()
        self.decoder = parts.decoder()
        self.live: dict[int, AdmittedRequest] = {}
        self.prefilling: collections.deque[AdmittedRequest] = collections.deque()
        self.parked: list[Parked] = []
        self.quarantine = Quarantine()
        """Sequences held out of the batch while a failing step's cause is looked for."""
        self.paused: dict[int, DecodeSequence] = {}
        """Background sequences held out of the batch while interactive work runs."""
        self.ended: collections.deque[int] = collections.deque()
        """Uids of admitted requests ended early (cancelled, stopped) since the last step,
        told by their handles (``on_end``) from any thread."""
        self._ending: set[int] = set()
        """Ended requests not retired yet (still prefilling: that path ends them)."""
        self.shorts_in_a_row = 0
        self.prefetched: set[int] = set()
        self.abandoned = False
        self.work = IDLE
        """The step in progress, for the watchdog's report of a stall."""
        self.waiting: Callable[[], Iterable[str | None]] | None = None
        """The tenants waiting for admission (:meth:`iterate`)."""
        self._closer: int | None = None
        """The thread ending this loop's requests once it is abandoned (:meth:`abandon`)."""
        """Set when the engine gave up on this loop (a hung step): it sends nothing more."""

    def __len__(self) -> int:
        return len(self.live)

    def has_work(self) -> bool:
        """Something to prefill or decode (paused sequences wait; they are not work)."""
        return bool(self.prefilling or self.parked or len(self.decoder) or self.quarantine)

    # -- one iteration ---------------------------------------------------------

    def iterate(
        self,
        admitted: list[RequestHandle],
        pause: Callable[[RequestHandle], bool] | None = None,
        waiting: Callable[[], Iterable[str | None]] | None = None,
    ) -> None:
        """Admit ``admitted``, do one step's prefill work, run one decode step (``pause``:
        which decoding requests sit this step out, see :meth:`pause_rows`; ``waiting``:
        the tenants of the requests waiting now, read mid-step)."""
        self.waiting = waiting
        for handle in admitted:
            self.admit(handle)
        self.retire_cancelled()
        self.pause_rows(pause)
        unpark(self)
        started = time.perf_counter()
        chunk = self.prefill_step() if self.prefilling else 0
        prefill_work, self.work = self.work, IDLE
        decoded = bool(len(self.decoder) or self.quarantine)
        if decoded:
            self.work = DECODING
            self.decode_step()
        self.work = IDLE
        seconds = time.perf_counter() - started
        self.pacer.observe(seconds, chunk, decoded)
        if chunk or decoded:
            self.step_times.observe(seconds, prefill_work, len(self.decoder))

    def pause_rows(self, pause: Callable[[RequestHandle], bool] | None) -> None:
        """Take the decoding requests that ``pause`` picks out of the batch (background
        work sitting out while interactive work runs; the ones already out stay out).
        The decoder's :meth:`~mlxcore.engine.strategies.Decoder.hold` gives each back with
        its own cache and the token it had sampled but not reported (sent now); they go
        on with exactly the tokens they would have produced. With ``pause`` ``None``, or
        a decoder that cannot hold sequences, every paused one goes back in."""
        if pause is None or not self.decoder.supports_hold:
            for uid in list(self.paused):
                seq = self.paused.pop(uid)
                if uid in self.live:
                    self.decoder.add(seq)
            return
        chosen = {
            uid
            for uid, live in self.live.items()
            if live.seq is not None and uid not in self.paused and pause(live.handle)
        }
        for item in self.decoder.hold(chosen) if chosen else []:
            live = self.live[item.seq.uid]
            live.seq = item.seq
            if item.unreported and self.emit(live, item.unreported):
                self.retire(live, item.seq.own_cache())
            else:
                self.paused[item.seq.uid] = item.seq

    def admit(self, handle: RequestHandle) -> None:
        req = handle.request
        usage = Usage(prompt_tokens=len(req.prompt_tokens))
        live = AdmittedRequest(handle, unbuilt_sampler, [], frozenset(), usage)
        self.live[handle.uid] = live
        handle.on_end = lambda h: self.ended.append(h.uid)
        if handle.cancel_reason is not None:  # ended before it was told where to say so
            self.ended.append(handle.uid)
        try:
            live.sampler = make_sampler(req.sampling)
            eos = frozenset() if req.sampling.ignore_eos else self.eos_token_ids
            live.stop_ids = eos | req.stop_token_ids
            live.processors = make_processors(req, self.eos_token_ids | req.stop_token_ids)
            live.processors += self.parts.processors_for(req)
            if req.cache_key is not None and len(req.cache_key) != len(req.prompt_tokens):
                raise ValueError("cache_key must be as long as the prompt")
        except Exception as exc:
            self.fail(live, exc)
            return
        if not park(self, live):
            self.start_prefill(live)
        # Told after the prefix-cache lookup, so the front end reads the final
        # ``cached_tokens`` (Anthropic's message_start reports it).
        if handle.on_admitted is not None and handle.uid in self.live:
            try:
                handle.on_admitted()
            except Exception:
                log.exception("request %s: the admission callback failed", handle.uid)

    def prefetch(self, waiting: list[RequestHandle]) -> None:
        """Tell the cache strategy, once each, about requests still queued."""
        for handle in waiting:
            if handle.uid in self.prefetched:
                continue
            try:
                self.cache.prefetch(handle.request)
            except Exception:
                log.exception("cache strategy %s failed to prefetch", self.cache.name)
        self.prefetched = {handle.uid for handle in waiting}

    def start_prefill(self, live: AdmittedRequest) -> None:
        """Look the prompt up in the prefix cache and queue its prefill."""
        req = live.request
        try:  # prompt logprobs need every position computed: no cached prefix then
            scored = req.sampling.prompt_logprobs is not None
            lookup = self.cache.lookup(req.cache_tokens[:1] if scored else req.cache_tokens)
            live.usage.cached_tokens = live.handle.cached_tokens = lookup.cached_tokens
            self.explain(live, lookup.explanation)
            live.task = PrefillTask(req, lookup.cache, lookup.cached_tokens)
            live.task.extra_checkpoints.extend(
                self.cache.snapshot_points(req, lookup.cached_tokens)
            )
            live.task.snapshot = snapshot_callback(self.cache, live.task)
            live.prefill = self.prefill.prefill(live.task)
        except Exception as exc:
            self.fail(live, exc)
            return
        self.prefilling.append(live)

    def explain(self, live: AdmittedRequest, explanation: CacheExplanation | None) -> None:
        """Log a lookup's explanation; hand it to a request that asked for it
        (``"explain_cache": true``: ``usage.mlxcore.cache``)."""
        if explanation is None:
            return
        rid = live.request.request_id or live.handle.uid
        log.debug("request %s: prefix cache %s", rid, explanation.summary())
        if live.request.options.get(EXPLAIN_OPTION) is True:
            live.usage.extra["mlxcore"] = {"cache": explanation.as_dict()}

    def _batchable(self, live: AdmittedRequest) -> bool:
        if live.prefill_begun or live.solo or live.handle.cancel_reason is not None:
            return False
        if live.task is None:
            return False
        try:
            return self.prefill.can_batch(live.task)
        except Exception:
            log.exception("prefill strategy %s: can_batch failed", self.prefill.name)
            live.solo = True
            return False

    def prefill_step(self) -> int:
        """One step's prefill work, chosen by :func:`~mlxcore.engine.prefill_plan.plan_step`:
        short prompts whole (together when they can; with nothing decoding, batch after
        batch up to the step's budget, so a burst's streams start together), or the next
        chunk of a long one, sized by the pacer (:mod:`mlxcore.engine.prefill_pacer`): in
        time beside decoding streams (a batch of short ones too: the pacer's budget bounds
        its padded tokens, so the running streams wait about the same for a join as for
        a chunk), to the step-time target with nothing decoding. Returns the tokens
        planned (the pacer's measurement)."""
        self._drop_cancelled_prefills()
        decoding = len(self.decoder) > 0
        budget = self.budget.cap if decoding else self.budget.idle_cap
        paced = min(budget, self.pacer.budget() if decoding else self.pacer.idle_budget())

        whole = budget if decoding else paced  # a chat prompt joins decoding streams whole

        def is_short(item: Any) -> bool:
            return not item.prefill_begun and item.remaining <= whole + 1

        newcomer = self._newcomer_rows() if decoding else None
        spent = 0
        while True:
            queue = take_turns(self.prefilling, lambda live: live.request.tenant)
            if newcomer is not None:
                queue.sort(key=lambda live: not newcomer(live))  # stable: turns kept
            plan = plan_step(
                queue, is_short, paced, self.prefill_batch_size, self.shorts_in_a_row, newcomer
            )
            if plan is None or (spent and not plan.short):
                return spent
            group: list[AdmittedRequest] = plan.group  # type: ignore[assignment]
            if not plan.short:
                self.shorts_in_a_row = 0
                planned = min(paced, group[0].remaining)
                self.advance_prefill(group[0], paced)
                return planned
            spent += sum(live.remaining for live in group)
            self._prefill_short(group)
            if decoding:
                if newcomer is not None and newcomer(group[0]):
                    release_held()  # its first token leaves now, not after the decode step
                return spent
            if spent >= paced or self._newcomer():
                return spent

    def _newcomer(self) -> bool:
        """A key with nothing admitted here has a request waiting (it came during this
        opening prefill of another key's burst): the step ends after this batch, so it is
        admitted at the next one instead of after the whole burst (decision 0029)."""
        if self.waiting is None:
            return False
        return newcomer_waits(self.waiting(), (x.request.tenant for x in self.live.values()))

    def _newcomer_rows(self) -> Callable[[Any], bool] | None:
        """While others decode: True for a prompt of a key with no row decoding (its first
        is prefilled first and alone, decision 0029); None on a server without keys."""
        if not any(x.request.tenant for x in self.prefilling):
            return None  # no key waits to prefill (always so on a server without keys)
        decoding = {x.request.tenant for x in self.live.values() if x.seq is not None}
        return lambda live: live.request.tenant is not None and live.request.tenant not in decoding

    def _prefill_short(self, group: list[AdmittedRequest]) -> None:
        """Prefill the short prompts ``group`` whole (in one batch where they can be)."""
        more = len(self.prefilling) > len(group)
        self.shorts_in_a_row = self.shorts_in_a_row + 1 if more else 0
        together = [live for live in group if self._batchable(live)] if len(group) > 1 else []
        if len(together) > 1 and self.prefill_together(together):
            group = [live for live in group if live not in together]
        for live in group:
            self.prefill_whole(live)

    def _drop_cancelled_prefills(self) -> None:
        for live in [x for x in self.prefilling if x.handle.cancel_reason is not None]:
            self.prefilling.remove(live)
            self._close_prefill(live)
            self.finish(live, live.handle.cancel_reason or "cancelled")

    def prefill_together(self, group: list[AdmittedRequest]) -> bool:
        """Prefill ``group`` in one batch; False (and each marked solo) if it failed."""
        tasks = [live.task for live in group if live.task is not None]
        self.work = StepWork("prefill", tuple(group))
        started = time.time_ns()
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
            self.prefilling.remove(live)
            self._close_prefill(live)
            self.prefilled(live, result)
            self._timed_chunk(live, started, live.processed)
        return True

    def _close_prefill(self, live: AdmittedRequest) -> None:
        if live.prefill is not None:
            try:
                live.prefill.close()
            except Exception:
                log.exception("prefill strategy %s: closing a prefill failed", self.prefill.name)
            live.prefill = None

    def advance_prefill(self, live: AdmittedRequest, step_tokens: int | None = None) -> bool:
        """Run one chunk of ``live``'s prefill (at most ``step_tokens`` tokens when the
        strategy honours it); True when the prefill ended (finished or failed)."""
        assert live.prefill is not None and live.task is not None
        live.prefill_begun = True
        live.task.step_tokens = step_tokens
        self.work = StepWork("prefill", (live,))
        before, started = live.processed, time.time_ns()
        try:
            live.processed = int(next(live.prefill))
            self._timed_chunk(live, started, live.processed - before)
            return False
        except StopIteration as done:
            result = done.value
        except Exception as exc:
            self.prefilling.remove(live)
            self.fail(live, exc)
            return True
        self.prefilling.remove(live)
        self.prefilled(live, result)
        self._timed_chunk(live, started, live.processed - before)
        return True

    def _timed_chunk(self, live: AdmittedRequest, started: int, tokens: int) -> None:
        """Note one prefill chunk of ``live`` (the tokens it computed; the prompt's reused
        from the cache before any chunk)."""
        figures = {"tokens": max(0, tokens), "cached_tokens": live.handle.cached_tokens}
        live.usage.steps.append(EngineStep("prefill_chunk", started, time.time_ns(), figures))

    def prefill_whole(self, live: AdmittedRequest) -> None:
        """Run a short prompt's prefill to its end in this step."""
        while not self.advance_prefill(live):
            pass

    def prefilled(self, live: AdmittedRequest, result: PrefillResult) -> None:
        """A prefill finished: sample the first token and hand the sequence to the decoder."""
        assert live.task is not None
        live.processed = len(live.request.prompt_tokens) - live.task.start
        self.counters["prompt_tokens_processed"] += live.processed
        try:
            seq, first = first_sequence(live, result, self.decoder, self.prefill.name)
        except Exception as exc:
            self.fail(live, exc)
            return
        live.task = None
        live.prefill = None
        live.seq = seq
        if self.emit(live, [first]):
            self.retire(live, seq.own_cache())
            return
        try:
            self.decoder.add(seq)
        except Exception as exc:
            self.fail(live, exc)

    def decode_step(self) -> None:
        if self.quarantine and not len(self.decoder):
            self._rejoin()
        started = time.time_ns()
        try:
            produced = self.decoder.step()
        except Exception as exc:
            recover_failed_step(self, exc)
            return
        ended = time.time_ns()
        if self.quarantine or self.quarantine.suspects is not None:
            self._rejoin()  # the step went through: the next held group may come back
        for uid, tokens in produced.items():
            found = self.live.get(uid)
            if found is None:
                continue
            live = found
            if live.failed is not None:
                self.decoder.remove(uid)
                self.fail(live, live.failed)
            elif self.emit(live, tokens, (started, ended)):
                self.retire(live, self.decoder.remove(uid))

    def _rejoin(self) -> None:
        for seq in self.quarantine.release(lambda uid: uid in self.live):
            self.decoder.add(seq)

    def emit(
        self, live: AdmittedRequest, tokens: list[StepToken], step: tuple[int, int] | None = None
    ) -> bool:
        """Send tokens to the client; True when the request is now finished (``step``: the
        decode step's start and end that gave them, for its tally)."""
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
        if step is not None and kept:
            live.decoding = live.decoding or DecodeTally(step[0])
            live.decoding.add(step[1], len(kept))
        self.send(live.handle, TokenEvent(kept, live.prompt_logprobs))
        live.prompt_logprobs = None  # sent with the first tokens
        if reason is not None:
            live.handle.end_early(reason)
            return True
        return False

    def retire_cancelled(self) -> None:
        """Retire the decoding requests ended early (per cancellation, not a scan of every
        request each step; prefilling and parked ones are ended by their own paths)."""
        while self.ended:
            self._ending.add(self.ended.popleft())
        for uid in list(self._ending):
            live = self.live.get(uid)
            if live is None:
                self._ending.discard(uid)
            elif live.seq is not None and live.handle.cancel_reason is not None:
                self._ending.discard(uid)
                seq = self.paused.pop(uid, None)
                own = self.decoder.remove(uid) if seq is None else seq.own_cache()
                self.retire(live, own)

    def retire(self, live: AdmittedRequest, own: SequenceCache | None) -> None:
        """Finish ``live``; offer its cache for prefix reuse."""
        if own is not None and live.seq is not None and live.reusable and own.length > 0:
            prompt = live.request.cache_tokens
            tokens = [*prompt, *live.seq.tokens[len(prompt) :]]
            try:
                self.cache.store(tokens[: own.length], own.cache)
            except Exception:
                log.exception("cache strategy %s failed to store a prefix", self.cache.name)
        self.finish(live, live.handle.cancel_reason or "stop")

    def finish(
        self,
        live: AdmittedRequest,
        reason: str,
        error: str | None = None,
        code: str | None = None,
    ) -> None:
        """End ``live`` with ``reason`` (``error``/``code`` as in :class:`FinishEvent`)."""
        self.live.pop(live.handle.uid, None)
        if live.seq is not None:
            live.usage.extra.update(live.seq.usage)
        if live.decoding is not None:
            live.usage.steps.append(live.decoding.as_step())
        self.send(live.handle, FinishEvent(reason, live.usage, error, code))

    def fail(self, live: AdmittedRequest, exc: BaseException) -> None:
        """End one request with an error (the detail goes to the log, not the client,
        unless the request itself was at fault: a :class:`RequestFault`)."""
        rid = live.request.request_id or live.handle.uid
        tag = {"request_id": live.request.trace_id or None}  # the HTTP request's id
        if isinstance(exc, RequestFault):
            log.warning("request %s refused during generation: %s", rid, exc, extra=tag)
            self.finish(live, "error", str(exc), exc.code)
            return
        log.error(
            "request %s failed: %s: %s", rid, type(exc).__name__, exc, exc_info=exc, extra=tag
        )
        self.finish(live, "error", f"{type(exc).__name__}: {exc}")
        repair_random_state()

    def fail_all(self, error: str, code: str | None = None) -> None:
        """End every admitted request with ``error`` (a fault, a hung step, shutdown)."""
        for live in list(self.live.values()):
            self.finish(live, "error", error, code)
        self.prefilling.clear()
        self.parked.clear()
        self.quarantine.clear()
        self.paused.clear()

    def abandon(self, reason: str, code: str | None = None) -> None:
        """Give this loop up (its thread hung): it is marked abandoned first, so whatever
        its thread sends from now on (a late token of the hung step) is dropped, and only
        then is every request ended, from the calling thread, with ``reason``."""
        self._closer = threading.get_ident()
        self.abandoned = True
        self.fail_all(reason, code)

    def stall_report(self, seconds: float) -> StallReport:
        """What the step in progress is doing, named (the watchdog's thread reads it)."""
        return report(self.work, self._decoding_rows(), seconds)

    def _decoding_rows(self) -> list[AdmittedRequest]:
        return [live for live in list(self.live.values()) if live.seq is not None]

    def send(self, handle: RequestHandle, event: Event) -> None:
        """Deliver ``event`` unless the loop was abandoned (then only :meth:`abandon`'s
        finishes go out)."""
        if not self.abandoned or threading.get_ident() == self._closer:
            send(handle, event)
