"""The batch machinery every speculative decoder shares; subclasses only propose.

A :class:`SpeculativeDecoder` keeps the speculating sequences in one batch, held in
mlx-lm's batch caches as the plain decoder holds its own (``BatchKVCache`` for attention,
``ArraysCache`` for recurrent layers), plus an optional side cache per row (a draft head's
or a draft model's). A round feeds every row its pending token ``x`` and up to ``k``
drafts, ``[x, d1..dk]``, in ONE forward pass (:meth:`SpeculativeDecoder.verify`); an
acceptance rule (:mod:`mlxcore.speculative.accept`) keeps ``d1..da`` of each row and adds
one target token; each row is rolled back to its own length without a replay
(:func:`mlxcore.speculative.verify.rollback`); then :meth:`SpeculativeDecoder.propose`
sets every row's drafts for the next round. A row with fewer drafts than the widest one
is padded with its pending token, rejected by construction.

Around that core, the policies that keep speculation from costing more than it gives:

* Sequences whose request says ``"speculative": false``, every sequence while more than
  ``disable_by_batch_size`` run, sequences whose cache cannot roll back per row, media
  sequences with shifted (M-RoPE) positions and sequences the off-switch stopped decode
  in a wrapped plain batched decoder. A sequence moves from speculation to plain decoding
  only, never back.
* Off-switch: the decoder measures what a plain step costs at the current batch size (a
  round now and then that drafts nothing) and what a speculative round costs. A sequence
  whose tokens per round stay below that cost ratio after a warm-up would decode faster
  plainly, and is moved there; so is one that had no draft accepted in its first rounds.
  Rows of the same batch with no accepted draft yet leave with it.
* Cool-down: after several sequences in a row were switched off as slow at some batch
  size, new sequences that would decode in a batch at least that large start in the
  plain decoder (speculation that is too slow with four rows may still pay alone; a
  sequence that never had a draft accepted counts at every size);
  every ``REPROBE_EVERY``-th of them speculates again, and one that finishes speculating
  with accepted drafts ends the cool-down for its batch size and smaller ones.
"""

from __future__ import annotations

import abc
import functools
import time
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from mlxcore.defaults.decoder import PlainDecoder
from mlxcore.engine.sampling import tokens_with_logprobs
from mlxcore.engine.strategies import Decoder, DecodeSequence, SequenceCache, StepToken
from mlxcore.speculative.accept import KeyStream, decide, normalize, rule_for
from mlxcore.speculative.verify import RecurrentStates, TargetVerifier, rollback

WARMUP_ROUNDS = 16
"""Speculative rounds a sequence runs before the off-switch compares costs."""

MARGIN = 0.9
"""A sequence is switched off when its tokens per round fall below this share of the
break-even (round cost / plain step cost): a noisy average near break-even keeps going."""

HOPELESS_ROUNDS = 3
"""Speculative rounds after which a sequence with no accepted draft at all is switched off."""

EMA = 0.3
"""Weight of the newest sample in the averages."""

COOLDOWN_AFTER = 3
"""Sequences switched off as slow in a row after which new sequences start plain."""

REPROBE_EVERY = 16
"""During a cool-down, every this-many-th new sequence speculates to measure again."""

PROBE_EVERY = 48
"""Speculative rounds at one batch size between two plain (draft-free) timing rounds."""


@attrs.define(eq=False)
class SpecRow:
    """A speculating sequence: its drafts for the next round, its random keys and counters."""

    seq: DecodeSequence
    keys: KeyStream
    rule: str
    drafts: list[Any] = attrs.field(factory=list)
    """Lazy (1,) token arrays: the drafts of the next round."""
    draft_q: list[Any] = attrs.field(factory=list)
    """For the rejection rule, the head's log-probabilities each draft was drawn from."""
    rounds: int = 0
    """Rounds this sequence took part in (its prime step included)."""
    spec_rounds: int = 0
    """Rounds that verified drafts (the off-switch's warm-up counts these)."""
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    spec_emitted: int = 0
    """Tokens emitted by the rounds that verified drafts."""

    @property
    def per_round(self) -> float:
        """Average tokens emitted per round that verified drafts."""
        return self.spec_emitted / self.spec_rounds if self.spec_rounds else 0.0


def cache_supported(cache: list[Any]) -> bool:
    """True when every layer can join the batch and roll back per row (KV or arrays cache)."""
    return all(type(c) in (KVCache, ArraysCache) for c in cache)


class SpeculativeDecoder(Decoder):
    """Speculative batched decoding; plain batched decoding as the fallback.

    Subclasses implement :meth:`verify` (the target's forward pass over the round's
    inputs) and :meth:`propose` (the next round's drafts), and may keep a side cache per
    row (:meth:`make_side_cache`, merged, filtered and rolled back with the batch).

    Args:
        model: the target model.
        num_speculative_tokens: most drafts per row and round (``k``).
        disable_by_batch_size: above this many sequences every sequence decodes plainly.
        auto_off: switch a sequence to plain decoding when speculation measures slower.
    """

    supports_position_offset = True
    """Shifted (media) sequences decode in the wrapped plain decoder, which honours it."""
    hopeless_rounds: int = HOPELESS_ROUNDS
    """Rounds with drafts after which a row with none accepted is switched off (a
    proposer whose first drafts are often wrong, e.g. prompt lookup before the copying
    starts, raises it)."""

    def __init__(
        self,
        model: Any,
        num_speculative_tokens: int = 1,
        disable_by_batch_size: int = 4,
        auto_off: bool = True,
    ) -> None:
        self.model = model
        self.k = num_speculative_tokens
        self.disable_by_batch_size = disable_by_batch_size
        self.auto_off = auto_off
        self.plain = PlainDecoder(model)
        self.rows: list[SpecRow] = []
        self.cache: list[Any] = []
        self.side_cache: list[Any] = []
        """The rows' side caches, batched (e.g. a draft head's KV cache)."""
        self.joining: list[DecodeSequence] = []
        self.plain_cost: dict[int, float] = {}
        """Seconds of a draft-free step, by batch size."""
        self.round_cost: dict[int, float] = {}
        """Seconds of a speculative round, by batch size."""
        self._since_probe: dict[int, int] = {}
        self._totals = {"rounds": 0, "drafted": 0, "accepted": 0, "emitted": 0}
        self._moved = {"request": 0, "batch": 0, "slow": 0, "cache": 0, "offset": 0}
        self._slow_streak: dict[int, int] = {}
        """By batch size: sequences switched off as slow there since the last one that
        speculated usefully at that size or a larger one."""
        self._cooled = 0
        """New sequences seen during the current cool-down."""

    # -- what a subclass provides ---------------------------------------------------

    @abc.abstractmethod
    def verify(self, inputs: mx.array) -> tuple[mx.array, list[RecurrentStates | None], Any]:
        """Run the target over ``inputs`` (B, 1 + k) on :attr:`cache`.

        Returns the logits (B, 1 + k, V), per layer the recurrent states after each
        position that :func:`~mlxcore.speculative.verify.rollback` selects from (``None``
        for attention layers), and anything :meth:`propose` needs (e.g. hidden states).
        """

    @abc.abstractmethod
    def propose(
        self, rows: list[SpecRow], emitted: list[list[int]], kept: list[int], width: int, extra: Any
    ) -> None:
        """Set each row's ``drafts`` (lazy (1,) token arrays, at most ``k``) and, for the
        rejection rule, ``draft_q`` (the log-probabilities each draft was drawn from; a
        deterministic draft has a one-hot ``q``). Called after the round's acceptance:
        ``emitted[b]`` are row ``b``'s new tokens (not yet in ``seq.tokens``), ``kept[b]``
        the positions of the ``width`` fed that it kept, ``extra`` what :meth:`verify`
        returned. A subclass with a side cache rolls it back here."""

    def make_side_cache(self, seq: DecodeSequence) -> list[Any]:
        """The side cache of a joining sequence (none by default); a draft model's would
        hold ``seq.tokens[:-1]``, as the sequence's own cache does."""
        return []

    # -- membership -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self.rows) + len(self.joining) + len(self.plain)

    # -- membership -----------------------------------------------------------

    def add(self, seq: DecodeSequence) -> None:
        reason = None
        if seq.request.options.get("speculative") is False:
            reason = "request"
        elif len(self) + 1 > self.disable_by_batch_size:
            reason = "batch"
        elif not cache_supported(seq.cache):
            reason = "cache"
        elif seq.position_offset:
            # A media sequence on a vision-language checkpoint: its rotary positions are
            # shifted (M-RoPE), which the verification pass does not carry.
            reason = "offset"
        elif self._cooling_down():
            reason = "slow"
            seq.usage["speculative_switched_off"] = "slow"
        if reason is not None:
            self._moved[reason] += 1
            self.plain.add(seq)
            return
        self.joining.append(seq)

    def _cooling_down(self) -> bool:
        """True when a new sequence should start plain (see the module's cool-down)."""
        if not self.auto_off:
            return False
        size = len(self) + 1
        if not any(n >= COOLDOWN_AFTER for s, n in self._slow_streak.items() if s <= size):
            return False
        self._cooled += 1
        return self._cooled % REPROBE_EVERY != 0

    def remove(self, uid: int) -> SequenceCache | None:
        for i, seq in enumerate(self.joining):
            if seq.uid == uid:
                del self.joining[i]
                return SequenceCache(seq.cache, len(seq.tokens) - 1)
        for i, row in enumerate(self.rows):
            if row.seq.uid == uid:
                if row.accepted:  # finished speculating with drafts accepted: it pays
                    size = len(self.rows)
                    self._slow_streak = {s: n for s, n in self._slow_streak.items() if s > size}
                    self._cooled = 0
                return SequenceCache(self._take(i), len(row.seq.tokens) - 1)
        return self.plain.remove(uid)

    def _take(self, idx: int) -> list[Any]:
        """Take row ``idx`` out of the batch; return its own main-model cache."""
        own = [layer.extract(idx) for layer in self.cache]
        del self.rows[idx]
        keep = [i for i in range(len(self.rows) + 1) if i != idx]
        if self.rows:
            for layer in (*self.cache, *self.side_cache):
                layer.filter(keep)
        else:
            self.cache, self.side_cache = [], []
        return own

    def _to_plain(self, row: SpecRow, reason: str, size: int = 0) -> None:
        """Hand a speculating sequence to the plain decoder (for good); ``size``: the
        batch size it was measured slow at."""
        row.seq.cache = self._take(self.rows.index(row))
        self._moved[reason] += 1
        if reason == "slow":
            self._slow_streak[size] = self._slow_streak.get(size, 0) + 1
        row.seq.usage["speculative_switched_off"] = reason
        self.plain.add(row.seq)

    def _join(self, row: SpecRow, side_cache: list[Any]) -> None:
        """Merge a joining sequence's caches into the batch."""
        for mine, theirs in ((self.cache, row.seq.cache), (self.side_cache, side_cache)):
            merged = [layer.merge([layer]) for layer in theirs]
            if mine:
                for batch_layer, new in zip(mine, merged, strict=True):
                    batch_layer.extend(new)
            else:
                mine.extend(merged)
        row.seq.cache = []  # the batch cache owns the state now
        self.rows.append(row)

    # -- stepping -------------------------------------------------------------

    def step(self) -> dict[int, list[StepToken]]:
        if (self.rows or self.joining) and len(self) > self.disable_by_batch_size:
            for row in list(self.rows):
                self._to_plain(row, "batch")
            for seq in self.joining:
                self._moved["batch"] += 1
                seq.usage["speculative_switched_off"] = "batch"
                self.plain.add(seq)
            self.joining = []
        joining, self.joining = self.joining, []
        for seq in joining:
            row = SpecRow(seq, KeyStream(seq.request.sampling.seed), rule_for(seq.sampler))
            self._join(row, self.make_side_cache(seq))
        out: dict[int, list[StepToken]] = {}
        if self.rows:
            out.update(self._round())
            slow = [row for row in self.rows if self._too_slow(row)]
            if slow:  # rows that never had a draft accepted leave with them
                slow += [
                    r for r in self.rows if r not in slow and r.spec_rounds > 1 and not r.accepted
                ]
            size = len(self.rows)
            for row in slow:
                # no draft accepted at all is a matter of the drafts, not of the batch:
                # it counts as slow at every size; a cost verdict holds from this size up
                self._to_plain(row, "slow", size if row.accepted else 1)
        timed = not self.rows and len(self.plain) > 0
        started = time.perf_counter()
        out.update(self.plain.step())
        if timed:
            self._note(self.plain_cost, len(self.plain), time.perf_counter() - started)
        return out

    def _too_slow(self, row: SpecRow) -> bool:
        if not self.auto_off:
            return False
        if row.spec_rounds >= self.hopeless_rounds and not row.accepted:
            return True
        if row.spec_rounds < WARMUP_ROUNDS:
            return False
        size = len(self.rows)
        plain = self.plain_cost.get(size)
        spec = self.round_cost.get(size)
        if plain is None or spec is None:
            return False
        return row.per_round < MARGIN * spec / plain

    @staticmethod
    def _note(costs: dict[int, float], size: int, seconds: float) -> None:
        prev = costs.get(size)
        costs[size] = seconds if prev is None else (1 - EMA) * prev + EMA * seconds

    def _round(self) -> dict[int, list[StepToken]]:
        """Verify every row's drafts in one pass, accept, roll back, propose the next round."""
        started = time.perf_counter()
        rows = self.rows
        size = len(rows)
        since = self._since_probe.get(size, PROBE_EVERY)
        probe = self.auto_off and since >= PROBE_EVERY
        self._since_probe[size] = 0 if probe else since + 1
        ks = [0 if probe else min(self.k, len(row.drafts)) for row in rows]
        k = max(ks, default=0)
        pending = mx.array([[row.seq.next_token] for row in rows], dtype=mx.int32)
        # a row with fewer drafts (one that just joined has none) is padded with its
        # pending token; its padding is rejected by construction
        if k:
            drafts = mx.stack(
                [
                    mx.concatenate([*row.drafts[: ks[b]], mx.repeat(pending[b], k - ks[b])]).astype(
                        mx.int32
                    )
                    for b, row in enumerate(rows)
                ]
            )
        else:
            drafts = mx.zeros((size, 0), dtype=mx.int32)
        inputs = mx.concatenate([pending, drafts], axis=1)
        logits, recurrent, extra = self.verify(inputs)
        targets = [
            normalize(self._process(row.seq, logits[b, : ks[b] + 1], drafts[b]))
            for b, row in enumerate(rows)
        ]
        mx.eval(targets)
        draft_lists: list[list[int]] = drafts.tolist()  # type: ignore[assignment]
        emitted = [
            decide(
                row.rule,
                row.seq.request.sampling,
                row.seq.sampler,
                targets[b],
                draft_lists[b][: ks[b]],
                row.draft_q[: ks[b]],
                row.keys,
            )
            for b, row in enumerate(rows)
        ]
        if probe:
            self._note(self.plain_cost, size, time.perf_counter() - started)
        kept = [len(e) for e in emitted]
        rollback(self.cache, recurrent, kept, k + 1)
        self.propose(rows, emitted, kept, k + 1, extra)
        out: dict[int, list[StepToken]] = {}
        for b, row in enumerate(rows):
            row.seq.tokens.extend(emitted[b])
            row.seq.next_token = emitted[b][-1]
            out[row.seq.uid] = self._report(row.seq, emitted[b], targets[b])
        mx.eval([d for row in rows for d in row.drafts])
        if not probe:
            self._note(self.round_cost, size, time.perf_counter() - started)
        for b, (row, tokens) in enumerate(zip(rows, emitted, strict=True)):
            self._account(row, ks[b], len(tokens))
        return out

    def _process(self, seq: DecodeSequence, rows: Any, drafts: Any) -> Any:
        """Apply the sequence's logits processors to each verified row, with its own context.

        Row ``i`` is conditioned on ``drafts[:i]``. When the processed row ``i`` forbids
        ``drafts[i]`` (a grammar that does not allow the copied or drafted token), that
        draft is rejected whatever the rule, so the rows after it are never used: they are
        not processed (a processor would refuse the forbidden token in their context) and
        repeat row ``i``.
        """
        if not seq.logits_processors:
            return rows
        base = seq.context.array(seq.tokens)
        out = []
        for i in range(rows.shape[0]):
            context = base if i == 0 else mx.concatenate([base, drafts[:i].astype(base.dtype)])
            row = rows[i : i + 1]
            for proc in seq.logits_processors:
                row = proc(context, row)
            out.append(row)
            last = i + 1 == rows.shape[0]
            if not last and not bool(mx.isfinite(row[0, drafts[i]]).item()):
                out.extend([row] * (rows.shape[0] - i - 1))
                break
        return mx.concatenate(out, axis=0)

    def _report(self, seq: DecodeSequence, emitted: list[int], target: Any) -> list[StepToken]:
        sampling = seq.request.sampling
        if not sampling.logprobs:
            return [StepToken(t) for t in emitted]
        rows = target[: len(emitted)]
        return tokens_with_logprobs(emitted, rows, [sampling.top_logprobs] * len(emitted))

    def _account(self, row: SpecRow, k: int, emitted: int) -> None:
        """Update the sequence's usage and the totals."""
        accepted = emitted - 1
        row.rounds += 1
        if k:
            row.spec_rounds += 1
            row.spec_emitted += emitted
        row.drafted += k
        row.accepted += accepted
        row.emitted += emitted
        self._totals["rounds"] += 1
        self._totals["drafted"] += k
        self._totals["accepted"] += accepted
        self._totals["emitted"] += emitted
        usage = row.seq.usage
        acceptance = row.accepted / row.drafted if row.drafted else 0.0
        usage["speculative_acceptance"] = round(acceptance, 4)
        usage["speculative_tokens_per_step"] = round(row.emitted / row.rounds, 4)

    def stats(self) -> dict[str, float]:
        """Totals for /metrics: rounds, drafts, acceptance, tokens per step, fallbacks."""
        t = self._totals
        out: dict[str, float] = {f"speculative_{k}": float(v) for k, v in t.items()}
        out["speculative_acceptance"] = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
        out["speculative_tokens_per_step"] = t["emitted"] / t["rounds"] if t["rounds"] else 0.0
        out.update({f"speculative_plain_{k}": float(v) for k, v in self._moved.items()})
        out["speculative_active"] = float(len(self.rows))
        cooling = any(n >= COOLDOWN_AFTER for n in self._slow_streak.values())
        out["speculative_cooldown"] = float(cooling and self.auto_off)
        return out


class TargetVerifiedDecoder(SpeculativeDecoder):
    """A speculative decoder whose verification is the target model's own forward pass.

    For proposers that have no trunk of their own (prompt lookup, a separate draft model):
    :class:`~mlxcore.speculative.verify.TargetVerifier` runs the model (per-position
    recurrent states for Qwen3.5 hybrids), and a sequence whose cache it cannot roll back
    decodes plainly. :attr:`vocab` is the width of the target's logits once a round ran.
    """

    vocab: int = 0

    @functools.cached_property
    def verifier(self) -> TargetVerifier:
        """The target model's verification pass."""
        return TargetVerifier(self.model)

    def add(self, seq: DecodeSequence) -> None:
        if not self.verifier.supports(seq.cache):
            self._moved["cache"] += 1
            self.plain.add(seq)
            return
        super().add(seq)

    def verify(self, inputs: mx.array) -> tuple[mx.array, list[RecurrentStates | None], Any]:
        logits, recurrent = self.verifier(inputs, self.cache)
        self.vocab = int(logits.shape[-1])
        return logits, recurrent, None
