"""Speculative decoding with a separate draft model that shares the target's tokenizer.

The draft runs beside the target on every speculating sequence, with a cache of its own
(the shared decoder's side cache: mlx-lm's batch caches of the draft, merged, filtered
and rolled back with the batch). The bookkeeping that keeps the two in step:

* A joining sequence's draft cache is prefilled with its context minus the pending
  token (``seq.tokens[:-1]``), as the target's own cache holds it. A prefix-cache hit
  on the target is therefore a full prefill of the draft (the draft is small).
* After a round, the target holds ``L`` positions and the pending token sits at ``L``.
  The draft is rolled back per row to ``L - 1`` positions (the rejected drafts and one
  more), then fed ``[context[L - 1], pending]`` for all rows at once: every row is fed
  the same width whatever it accepted, so one batched draft pass serves them all. The
  logits at the pending token give the first draft; ``k - 1`` single-token passes chain
  the rest. A round thus costs one target pass and ``k`` draft passes for the batch.
* Attention layers roll back by dropping entries (left padding of the batch cache);
  a recurrent draft (Qwen3.5's GatedDeltaNet) keeps the state after every position it
  was fed in the last chain, and a row takes the one at its kept length.

Acceptance: greedy rows emit exactly the target's argmax; sampled rows draw drafts from
the draft's filtered, tempered distribution ``q`` and the shared rejection rule keeps the
output distribution the target's own.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from mlxcore.engine.memory import kv_bytes_per_token
from mlxcore.engine.strategies import DecodeSequence, SequenceCache
from mlxcore.speculative.accept import GREEDY, draft_token
from mlxcore.speculative.decoder import SpecRow, TargetVerifiedDecoder
from mlxcore.speculative.verify import RecurrentStates, TargetVerifier, drop_kv
from mlxcore_draft.prefixes import DraftPrefixes, trimmed

Snapshot = list[RecurrentStates | None]
"""Per draft layer, one row's recurrent states after each position of the last chain
(``None`` for attention layers)."""


class DraftDecoder(TargetVerifiedDecoder):
    """Speculative decoding whose drafts come from a small model with the same tokenizer.

    Args:
        model: the target model.
        draft: the draft model (mlx-lm), loaded beside the target.
        num_speculative_tokens: drafts per round (``k``).
        disable_by_batch_size: above this many sequences every sequence decodes plainly.
        auto_off: switch a sequence to plain decoding when speculation measures slower.
        prefill_step: tokens per draft forward pass when a sequence joins.
    """

    name = "draft"

    def __init__(
        self,
        model: Any,
        draft: Any,
        num_speculative_tokens: int = 3,
        disable_by_batch_size: int = 8,
        auto_off: bool = True,
        prefill_step: int = 2048,
        prefixes: DraftPrefixes | None = None,
    ) -> None:
        super().__init__(model, num_speculative_tokens, disable_by_batch_size, auto_off)
        self.draft = draft
        self.drafter = TargetVerifier(draft)
        self.prefill_step = prefill_step
        self.recurrent = any(isinstance(c, ArraysCache) for c in make_prompt_cache(draft))
        self.prefixes = None if self.recurrent else prefixes
        """Finished sequences' draft caches (attention-only drafts: a recurrent state
        cannot be cut back to a shorter prefix); shared across restarts of the decoder."""
        self.draft_prefilled = 0
        """Context tokens the draft was prefilled with (what the store did not cover)."""
        self._held: dict[int, int] = {}
        """Per sequence uid, the positions its draft cache holds."""
        self._verified: dict[int, int] = {}
        """Per sequence uid, how many leading positions of its draft cache hold the
        sequence's own tokens (the rest are this round's drafts)."""
        self._snaps: dict[int, Snapshot] = {}
        """Per sequence uid (recurrent drafts), the states after its last chain's positions."""
        self._side_per_token = kv_bytes_per_token(draft)

    def side_cache_bytes_per_token(self) -> int:
        """The draft's KV per token of context: every speculating sequence holds one."""
        return self._side_per_token

    # -- membership -----------------------------------------------------------

    def make_side_cache(self, seq: DecodeSequence) -> list[Any]:
        context = seq.tokens[:-1]
        keyed = seq.request.keyed(context)  # each cache partition finds only its own
        reused, stored = (0, None) if self.prefixes is None else self.prefixes.take(keyed)
        cache = stored if stored is not None else make_prompt_cache(self.draft)
        trunk = self.drafter.trunk
        self.draft_prefilled += len(context) - reused
        for start in range(reused, len(context), self.prefill_step):
            chunk = mx.array(context[start : start + self.prefill_step])[None]
            if trunk is not None:
                trunk(chunk, cache=cache)  # no output projection for the prefill
            else:
                self.draft(chunk, cache=cache)
            mx.eval([c.state for c in cache])
        self._held[seq.uid] = self._verified[seq.uid] = len(context)
        return cache

    def remove(self, uid: int) -> SequenceCache | None:
        if self.prefixes is not None:
            self._keep_prefix(uid)
        self._forget(uid)
        return super().remove(uid)

    def _keep_prefix(self, uid: int) -> None:
        """Store a leaving row's draft cache, cut to the positions that hold its tokens."""
        idx = next((i for i, row in enumerate(self.rows) if row.seq.uid == uid), None)
        if idx is None or not self.side_cache or self.prefixes is None:
            return
        seq = self.rows[idx].seq
        valid = min(self._verified.get(uid, 0), len(seq.tokens))
        extracted = [layer.extract(idx) for layer in self.side_cache]
        if any(layer.offset < valid for layer in extracted):
            return  # not the shape this decoder keeps: store nothing rather than guess
        layers = [trimmed(layer, valid) for layer in extracted]
        if self.prefixes.put(seq.request.keyed(seq.tokens[:valid]), layers):
            # computed now, beside the batch: an entry must not hold a graph on this
            # thread's stream (a restarted engine runs on another)
            mx.async_eval(*(a for layer in layers for a in (layer.keys, layer.values)))

    def held_bytes(self) -> int:
        """The draft prefix store's bytes."""
        return self.prefixes.nbytes if self.prefixes is not None else 0

    def release(self, nbytes: int) -> int:
        """Drop stored draft caches (least recently used first)."""
        return self.prefixes.release(nbytes) if self.prefixes is not None else 0

    def stats(self) -> dict[str, float]:
        """The shared speculative totals, the draft's prefill and its prefix store."""
        out = super().stats()
        out["draft_prefilled_tokens"] = self.draft_prefilled
        if self.prefixes is not None:
            out["draft_prefix_bytes"] = self.prefixes.nbytes
            out["draft_prefix_entries"] = len(self.prefixes)
            out["draft_prefix_hits"] = self.prefixes.hits
            out["draft_prefix_reused_tokens"] = self.prefixes.reused_tokens
        return out

    def _to_plain(self, row: SpecRow, reason: str, size: int = 0) -> None:
        self._forget(row.seq.uid)
        super()._to_plain(row, reason, size)

    def _forget(self, uid: int) -> None:
        self._held.pop(uid, None)
        self._verified.pop(uid, None)
        self._snaps.pop(uid, None)

    # -- proposing ------------------------------------------------------------

    def propose(
        self, rows: list[SpecRow], emitted: list[list[int]], kept: list[int], width: int, extra: Any
    ) -> None:
        # the draft must hold L - 1 positions, L being the target's length after this round
        pairs = list(zip(rows, emitted, strict=True))
        wanted = [len(row.seq.tokens) + len(new) - 2 for row, new in pairs]
        drop = [self._held[row.seq.uid] - n for row, n in zip(rows, wanted, strict=True)]
        if any(d < 0 for d in drop):
            raise RuntimeError(f"draft cache behind the target: {drop}")
        if any(drop):
            self._roll_back(rows, drop)
        previous = [new[-2] if len(new) > 1 else row.seq.tokens[-1] for row, new in pairs]
        fed = mx.array([[p, new[-1]] for p, new in zip(previous, emitted, strict=True)])
        logits, states = self.drafter(fed, self.side_cache)
        chain: list[list[RecurrentStates | None]] = [states]
        for row in rows:
            row.drafts, row.draft_q = [], []
        for j in range(self.k):
            tokens = self._pick(rows, self._target_width(logits[:, -1:]))
            if j + 1 < self.k:
                logits, states = self.drafter(tokens[:, None], self.side_cache)
                chain.append(states)
        for row, n in zip(rows, wanted, strict=True):
            self._held[row.seq.uid] = n + 1 + self.k
            self._verified[row.seq.uid] = n + 2  # the context, then the pending token
        if self.recurrent:
            self._keep_snapshots(rows, chain)

    def _pick(self, rows: list[SpecRow], logits: mx.array) -> mx.array:
        """Each row's next draft from the draft's logits (B, 1, V); appended to the rows."""
        if all(row.rule == GREEDY for row in rows):
            tokens = mx.argmax(logits[:, -1], axis=-1)
            for b, row in enumerate(rows):
                row.drafts.append(tokens[b : b + 1])
            return tokens
        picked = []
        for b, row in enumerate(rows):
            token, q = draft_token(row.rule, row.seq.request.sampling, logits[b, -1:], row.keys)
            row.drafts.append(token)
            if q is not None:
                row.draft_q.append(q)
            picked.append(token)
        return mx.concatenate(picked)

    def _target_width(self, logits: mx.array) -> mx.array:
        """The draft's logits cut or padded (with -inf) to the target's vocabulary width:
        the tokenizers are the same, but checkpoints pad their embedding tables differently."""
        width = logits.shape[-1]
        if not self.vocab or width == self.vocab:
            return logits
        if width > self.vocab:
            return logits[..., : self.vocab]
        pad = mx.full((*logits.shape[:-1], self.vocab - width), -mx.inf, dtype=logits.dtype)
        return mx.concatenate([logits, pad], axis=-1)

    # -- rolling the draft back ----------------------------------------------------

    def _roll_back(self, rows: list[SpecRow], drop: list[int]) -> None:
        """Drop the last ``drop[b]`` positions of row ``b``'s draft cache."""
        for i, layer in enumerate(self.side_cache):
            if not isinstance(layer, ArraysCache):
                drop_kv(layer, drop)
                continue
            conv, delta = [], []
            for b, (row, d) in enumerate(zip(rows, drop, strict=True)):
                if d == 0:  # fed nothing since (joined this round): its state is current
                    conv.append(layer[0][b])
                    delta.append(layer[1][b])
                    continue
                snap = self._snaps[row.seq.uid][i]
                assert snap is not None
                windows, deltas = snap
                at = windows.shape[0] - d - 1  # the state after the last kept position
                conv.append(windows[at])
                delta.append(deltas[at])
            layer[0] = mx.stack(conv)
            layer[1] = mx.stack(delta)

    def _keep_snapshots(
        self, rows: list[SpecRow], chain: list[list[RecurrentStates | None]]
    ) -> None:
        """Store, per row and recurrent layer, the states after every position just fed."""
        per_layer: list[RecurrentStates | None] = []
        for layer_states in zip(*chain, strict=True):
            if layer_states[0] is None:
                per_layer.append(None)
                continue
            windows = mx.concatenate([s[0] for s in layer_states if s is not None], axis=1)
            deltas = mx.concatenate([s[1] for s in layer_states if s is not None], axis=1)
            per_layer.append((windows, deltas))
        for b, row in enumerate(rows):
            self._snaps[row.seq.uid] = [
                None if s is None else (s[0][b], s[1][b]) for s in per_layer
            ]
