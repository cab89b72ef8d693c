"""The MTP speculative decoder: draft with the head, verify in one pass, roll back exactly.

Design (measured and documented in docs/plugins/qwen35-mtp.md):

* Speculation runs per sequence at batch size 1, so each sequence accepts its own
  number of drafts. Sequences whose request says ``"speculative": false``, and every
  sequence while the batch holds more than ``--speculative-disable-by-batch-size``
  sequences, decode in the wrapped plain batched decoder. A sequence only ever moves from
  speculation to plain decoding (its cache then holds every token but the pending one,
  exactly what the plain decoder takes); never back.
* One round for a sequence with pending token ``x`` (sampled, not yet fed): the head
  drafts ``d1..dk`` from the main model's hidden states, the main model runs once over
  ``[x, d1..dk]``, an acceptance rule (:mod:`.accept`) keeps ``d1..da`` and adds one target
  token. Rejected positions are rolled back in every cache: trimmable KV caches are
  trimmed; the GatedDeltaNet (``ArraysCache``) state, which cannot be trimmed, is restored
  from a snapshot taken before verification and ``[x, d1..da]`` is replayed.
* A sequence's first round drafts nothing (the head needs the main model's hidden state
  at the last position, which prefill does not keep); it doubles as a measurement of the
  plain per-token cost. After a few speculative rounds a sequence whose measured cost per
  emitted token exceeds that plain cost is switched to plain decoding.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from mlxcore.builtin.decoder import PlainDecoder
from mlxcore.engine.sampling import token_with_logprobs
from mlxcore.engine.strategies import Decoder, DecodeSequence, SequenceCache, StepToken
from mlxcore_qwen35_mtp.accept import KeyStream, decide, draft_token, normalize, rule_for
from mlxcore_qwen35_mtp.head import MTPHead

log = logging.getLogger(__name__)

WARMUP_ROUNDS = 6
"""Speculative rounds a sequence runs before the off-switch judges it."""

EMA = 0.3
"""Weight of the newest sample in the cost averages."""


@attrs.define(eq=False)
class _Spec:
    """A sequence decoding speculatively, and its head state and counters."""

    seq: DecodeSequence
    mtp_cache: list[Any]
    keys: KeyStream
    rule: str
    feed_hidden: Any = None
    """Main-model hidden states (1, m, H) the head has not seen yet (``None`` before round 1)."""
    feed_tokens: list[int] = attrs.field(factory=list)
    """The token following each position of ``feed_hidden`` (its last one is ``next_token``)."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    cost: float | None = None
    """Average seconds per emitted token over the speculative rounds."""


def cache_supported(cache: list[Any]) -> bool:
    """True when every layer can be rolled back: trimmable, or an ``ArraysCache`` to snapshot."""
    return all(isinstance(c, ArraysCache) or c.is_trimmable() for c in cache)


class MTPDecoder(Decoder):
    """Speculative decoding with a Qwen3.5 MTP head; plain batched decoding as the fallback.

    Args:
        model: the loaded model (its ``mlxcore_mtp`` head attached).
        head: the bound MTP head.
        num_speculative_tokens: drafts per round (``--num-speculative-tokens``).
        disable_by_batch_size: above this many sequences every sequence decodes plainly.
        auto_off: switch a sequence to plain decoding when speculation measures slower.
    """

    name = "qwen35-mtp"

    def __init__(
        self,
        model: Any,
        head: MTPHead,
        num_speculative_tokens: int = 1,
        disable_by_batch_size: int = 4,
        auto_off: bool = True,
    ) -> None:
        self.head = head
        self.k = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.auto_off = auto_off
        self.plain = PlainDecoder(model)
        self.spec: list[_Spec] = []
        self.plain_cost: float | None = None
        """Average seconds of a round without drafts (one plain token at batch size 1)."""
        self._totals = {"rounds": 0, "drafted": 0, "accepted": 0, "emitted": 0}
        self._moved = {"request": 0, "batch": 0, "slow": 0, "cache": 0}

    def __len__(self) -> int:
        return len(self.spec) + len(self.plain)

    # -- membership -----------------------------------------------------------

    def add(self, seq: DecodeSequence) -> None:
        reason = None
        if seq.request.options.get("speculative") is False:
            reason = "request"
        elif len(self) + 1 > self.disable_by_batch_size:
            reason = "batch"
        elif not cache_supported(seq.cache):
            reason = "cache"
        if reason is not None:
            self._moved[reason] += 1
            self.plain.add(seq)
            return
        params = seq.request.sampling
        self.spec.append(
            _Spec(seq, self.head.make_cache(), KeyStream(params.seed), rule_for(seq.sampler))
        )

    def remove(self, uid: int) -> SequenceCache | None:
        for i, spec in enumerate(self.spec):
            if spec.seq.uid == uid:
                del self.spec[i]
                return SequenceCache(spec.seq.cache, len(spec.seq.tokens) - 1)
        return self.plain.remove(uid)

    def _to_plain(self, spec: _Spec, reason: str) -> None:
        """Hand a speculating sequence to the plain decoder (for good)."""
        self.spec.remove(spec)
        self._moved[reason] += 1
        spec.seq.usage["speculative_switched_off"] = reason
        self.plain.add(spec.seq)

    # -- stepping -------------------------------------------------------------

    def step(self) -> dict[int, list[StepToken]]:
        if self.spec and len(self) > self.disable_by_batch_size:
            for spec in list(self.spec):
                self._to_plain(spec, "batch")
        out: dict[int, list[StepToken]] = {}
        for spec in list(self.spec):
            out[spec.seq.uid] = self._round(spec)
            if self._too_slow(spec):
                self._to_plain(spec, "slow")
        out.update(self.plain.step())
        return out

    def _too_slow(self, spec: _Spec) -> bool:
        if not self.auto_off or spec.rounds < WARMUP_ROUNDS + 1 or self.plain_cost is None:
            return False
        return spec.cost is not None and spec.cost > self.plain_cost

    def _round(self, spec: _Spec) -> list[StepToken]:
        """Draft, verify, accept, roll back: one main-model pass (plus a replay on rejection)."""
        started = time.perf_counter()
        seq = spec.seq
        params = seq.request.sampling
        k = self.k if spec.feed_hidden is not None else 0
        drafts: list[Any] = []
        draft_q: list[Any] = []
        if k:
            fed = mx.array([spec.feed_tokens])
            h, logits = self.head.draft(fed, spec.feed_hidden, spec.mtp_cache)
            logits = logits[:, -1]
            for j in range(k):
                token, q = draft_token(spec.rule, params, logits, spec.keys)
                drafts.append(token)
                draft_q.append(q)
                if j + 1 < k:
                    h, logits = self.head.draft(token[None], h, spec.mtp_cache)
                    logits = logits[:, -1]
            if k > 1:  # the chained positions used the head's own hidden states: drop them
                for c in spec.mtp_cache:
                    c.trim(k - 1)
        draft_tokens = mx.concatenate(drafts) if drafts else mx.array([], dtype=mx.int32)
        inputs = mx.concatenate(
            [mx.array([seq.next_token], dtype=draft_tokens.dtype), draft_tokens]
        )
        snapshot = [list(c.cache) if isinstance(c, ArraysCache) else None for c in seq.cache]
        hidden, logits = self.head.forward_main(inputs[None], seq.cache)
        target = normalize(self._process(seq, logits[0], draft_tokens))
        mx.eval(draft_tokens, target, hidden)
        draft_list: list[int] = draft_tokens.tolist()  # type: ignore[assignment]
        emitted = decide(spec.rule, params, seq.sampler, target, draft_list, draft_q, spec.keys)
        accepted = len(emitted) - 1
        spec.feed_hidden = self._rollback(seq, snapshot, inputs, hidden, accepted, k)
        spec.feed_tokens = list(emitted)
        seq.tokens.extend(emitted)
        seq.next_token = emitted[-1]
        out = self._report(seq, emitted, target)
        mx.async_eval(spec.feed_hidden)
        self._account(spec, k, accepted, len(emitted), time.perf_counter() - started)
        return out

    def _process(self, seq: DecodeSequence, rows: Any, drafts: Any) -> Any:
        """Apply the sequence's logits processors to each verified row, with its own context."""
        if not seq.logits_processors:
            return rows
        base = mx.array(seq.tokens)
        out = []
        for i in range(rows.shape[0]):
            context = base if i == 0 else mx.concatenate([base, drafts[:i].astype(base.dtype)])
            row = rows[i : i + 1]
            for proc in seq.logits_processors:
                row = proc(context, row)
            out.append(row)
        return mx.concatenate(out, axis=0)

    def _rollback(
        self,
        seq: DecodeSequence,
        snapshot: list[Any],
        inputs: Any,
        hidden: Any,
        accepted: int,
        k: int,
    ) -> Any:
        """Make ``seq.cache`` hold exactly ``[.., x, d1..da]``; return their hidden states."""
        if accepted == k:
            return hidden
        rejected = k - accepted
        if all(s is None for s in snapshot):
            for c in seq.cache:
                c.trim(rejected)
            return hidden[:, : accepted + 1]
        for c, saved in zip(seq.cache, snapshot, strict=True):
            if saved is None:
                c.trim(k + 1)
            else:
                c.cache = saved
        replay, _ = self.head.forward_main(inputs[None, : accepted + 1], seq.cache)
        return replay

    def _report(self, seq: DecodeSequence, emitted: list[int], target: Any) -> list[StepToken]:
        sampling = seq.request.sampling
        if not sampling.logprobs:
            return [StepToken(t) for t in emitted]
        return [
            token_with_logprobs(t, target[i], sampling.top_logprobs) for i, t in enumerate(emitted)
        ]

    def _account(self, spec: _Spec, k: int, accepted: int, emitted: int, seconds: float) -> None:
        """Update the sequence's usage, the totals and the cost estimates."""
        spec.rounds += 1
        self._totals["rounds"] += 1
        if k == 0:
            prev = self.plain_cost
            self.plain_cost = seconds if prev is None else (1 - EMA) * prev + EMA * seconds
        else:
            per_token = seconds / emitted
            spec.cost = per_token if spec.cost is None else (1 - EMA) * spec.cost + EMA * per_token
        spec.drafted += k
        spec.accepted += accepted
        spec.emitted += emitted
        self._totals["drafted"] += k
        self._totals["accepted"] += accepted
        self._totals["emitted"] += emitted
        usage = spec.seq.usage
        acceptance = spec.accepted / spec.drafted if spec.drafted else 0.0
        usage["speculative_acceptance"] = round(acceptance, 4)
        usage["speculative_tokens_per_step"] = round(spec.emitted / spec.rounds, 4)

    def stats(self) -> dict[str, float]:
        """Totals for /metrics: rounds, drafts, acceptance, tokens per step, fallbacks."""
        t = self._totals
        out: dict[str, float] = {f"speculative_{k}": float(v) for k, v in t.items()}
        out["speculative_acceptance"] = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
        out["speculative_tokens_per_step"] = t["emitted"] / t["rounds"] if t["rounds"] else 0.0
        out.update({f"speculative_plain_{k}": float(v) for k, v in self._moved.items()})
        out["speculative_active"] = float(len(self.spec))
        return out
