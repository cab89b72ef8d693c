"""Prompt-lookup speculative decoding: drafts are copied from the context itself.

After each round a sequence's context (prompt and output so far) is searched for the
latest earlier occurrence of its own ending (:class:`~mlxcore_prompt_lookup.ngram.NgramIndex`,
longest n-gram first); the tokens that followed it there are the next round's drafts.
Nothing else runs: no draft model, no extra memory beyond the index. Verification,
acceptance, rollback, batch limits and the off-switch are the shared
:class:`~mlxcore.speculative.decoder.SpeculativeDecoder`'s; drafts are deterministic, so
the rejection rule sees a one-hot draft distribution and accepts a draft ``d`` with
probability ``p(d)``, resampling from ``p`` without ``d`` otherwise: the output
distribution is the model's own.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcore.engine.strategies import SequenceCache
from mlxcore.speculative.accept import REJECTION
from mlxcore.speculative.decoder import SpecRow, TargetVerifiedDecoder
from mlxcore_prompt_lookup.ngram import NgramIndex


class PromptLookupDecoder(TargetVerifiedDecoder):
    """Speculative decoding with drafts looked up in the sequence's own context.

    Args:
        model: the target model.
        num_speculative_tokens: most drafts per round.
        max_ngram: longest ending searched for (``--lookup-ngram``).
        min_ngram: shortest ending that may propose.
        disable_by_batch_size: above this many sequences every sequence decodes plainly.
        auto_off: switch a sequence to plain decoding when speculation measures slower.
    """

    name = "prompt-lookup"
    hopeless_rounds = 12
    """Text before the copying starts (``Here is the file:``) often draws wrong drafts."""

    def __init__(
        self,
        model: Any,
        num_speculative_tokens: int = 4,
        max_ngram: int = 3,
        min_ngram: int = 2,
        disable_by_batch_size: int = 2,
        auto_off: bool = True,
    ) -> None:
        super().__init__(model, num_speculative_tokens, disable_by_batch_size, auto_off)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index: dict[int, NgramIndex] = {}
        """Per sequence uid, its context's n-gram index."""

    def remove(self, uid: int) -> SequenceCache | None:
        self._index.pop(uid, None)
        return super().remove(uid)

    def _to_plain(self, row: SpecRow, reason: str, size: int = 0) -> None:
        self._index.pop(row.seq.uid, None)
        super()._to_plain(row, reason, size)

    def propose(
        self, rows: list[SpecRow], emitted: list[list[int]], kept: list[int], width: int, extra: Any
    ) -> None:
        for row, new in zip(rows, emitted, strict=True):
            index = self._index.get(row.seq.uid)
            if index is None:  # joined this round: its context so far, then the new tokens
                index = self._index[row.seq.uid] = NgramIndex(self.max_ngram, self.min_ngram)
                index.extend(row.seq.tokens)
            index.extend(new)
            drafts = index.propose(self.k)
            row.drafts = [mx.array([t]) for t in drafts]
            row.draft_q = (
                [self._one_hot(t) for t in drafts] if row.rule == REJECTION and drafts else []
            )

    def _one_hot(self, token: int) -> mx.array:
        """Log-probabilities of a deterministic draft: 0 at ``token``, -inf elsewhere."""
        return mx.where(mx.arange(self.vocab) == token, 0.0, -mx.inf)[None]
