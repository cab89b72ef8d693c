"""The MTP speculative decoder: Qwen3.5's multi-token-prediction head drafts, the shared
machinery verifies (:class:`mlxcore.speculative.decoder.SpeculativeDecoder`).

Design (measured and documented in docs/plugins/qwen35-mtp.md):

* Verification runs the Qwen3.5 trunk with per-position recurrent states
  (:func:`mlxcore.speculative.verify.forward_verify`) and keeps its hidden states: the
  head drafts from them. The head has a ``BatchKVCache`` of its own (the side cache),
  rolled back with the batch after each round.
* After each round the head runs once over the verified positions of all rows, with the
  token that followed each, and drafts ``k`` tokens per row, chaining its own hidden
  states for the drafts after the first.
* A joining sequence enters the batch at once, with no drafts for its first round
  (prefill keeps no hidden state for the head): in that round its draft slots are padding,
  rejected by construction, so it costs no extra forward pass.
* Batch limits, the off-switch and the cool-down are the shared decoder's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxcore.engine.strategies import DecodeSequence
from mlxcore.speculative.accept import GREEDY, draft_token
from mlxcore.speculative.decoder import SpecRow, SpeculativeDecoder, cache_supported
from mlxcore.speculative.verify import RecurrentStates, drop_kv, rollback
from mlxcore_qwen35_mtp.head import MTPHead

__all__ = ["MTPDecoder", "cache_supported"]


class MTPDecoder(SpeculativeDecoder):
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
        super().__init__(model, num_speculative_tokens, disable_by_batch_size, auto_off)
        self.head = head

    @property
    def mtp_cache(self) -> list[Any]:
        """The head's batched KV cache."""
        return self.side_cache

    def make_side_cache(self, seq: DecodeSequence) -> list[Any]:
        return self.head.make_cache()

    def verify(self, inputs: mx.array) -> tuple[mx.array, list[RecurrentStates | None], Any]:
        hidden, logits, recurrent = self.head.verify(inputs, self.cache)
        return logits, recurrent, hidden

    def propose(
        self, rows: list[SpecRow], emitted: list[list[int]], kept: list[int], width: int, extra: Any
    ) -> None:
        # the head sees every verified position with the token that followed it; rows
        # keep only their accepted ones (the rest is padding, dropped right after)
        following = [e + [e[-1]] * (width - len(e)) for e in emitted]
        h, head_logits = self.head.draft(
            mx.array(following), extra, self.side_cache, mx.array([n - 1 for n in kept])
        )
        rollback(self.side_cache, [None] * len(self.side_cache), kept, width)
        self._draft(rows, h, head_logits, self.side_cache)

    def _draft(self, rows: list[SpecRow], h: Any, logits: Any, cache: list[Any]) -> None:
        """Draft ``k`` tokens per row from the head's first logits (B, 1, V), chaining."""
        for row in rows:
            row.drafts, row.draft_q = [], []
        for j in range(self.k):
            if all(row.rule == GREEDY for row in rows):
                tokens = mx.argmax(logits[:, -1], axis=-1)
                for b, row in enumerate(rows):
                    row.drafts.append(tokens[b : b + 1])
            else:
                picked = []
                for b, row in enumerate(rows):
                    token, q = draft_token(
                        row.rule, row.seq.request.sampling, logits[b, -1:], row.keys
                    )
                    row.drafts.append(token)
                    row.draft_q.append(q)
                    picked.append(token)
                tokens = mx.concatenate(picked)
            if j + 1 < self.k:
                h, logits = self.head.draft(tokens[:, None], h, cache)
        if self.k > 1:  # the chained positions used the head's own hidden states: drop them
            for layer in cache:
                if isinstance(layer, KVCache):
                    layer.trim(self.k - 1)
                else:
                    drop_kv(layer, [self.k - 1] * len(rows))
