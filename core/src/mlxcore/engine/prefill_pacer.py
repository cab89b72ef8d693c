"""How many tokens of a long prompt a step may prefill while other sequences decode,
sized in time.

Running streams feel a step's prefill work as a longer gap between two of their tokens.
A fixed token budget (``--prefill-decode-chunk``) stretches that gap by whatever those
tokens cost, which depends on the model, the batch and how deep into a long prompt the
chunk lies (attention over 8K tokens of context costs more per token than over 100). The
pacer measures instead:

* the **decode period**: the time of an engine step that did no prefill work (an
  exponential average, so it follows the batch as rows join and leave);
* the **prefill cost per token**: how much longer a step with prefill work took than the
  decode period, divided by the tokens it prefilled (averaged the same way; the newest
  chunk of a long prompt weighs most, so the cost follows its growing context).

A step's budget is then ``share`` of the decode period divided by the cost per token,
between :data:`FLOOR_SHARE` of the cap (prefill keeps moving) and the cap. Until both figures
are measured the cap applies. Pure bookkeeping on numbers the loop passes in, so it is
tested alone; the loop owns the clock.

Short prompts (prefilled whole, batched) are paced too (issue 58): while sequences decode,
a batch of them holds at most the step's budget in padded tokens, and the step's time is
measured like a chunk's, so the cost per token includes the join. On a ~100M-parameter
model a join of six 40-token chats stretched a 64-row step from 0.16 to ~0.5 s (the
64-stream inter-token p99); paced, the p99 fell to 0.39-0.42 s and the aggregate rose
(the running streams lose less time to each join). The floor (:data:`FLOOR_SHARE` of the
cap: 3 or 4 chat prompts) keeps a join from being split so fine that its fixed cost is
paid per prompt (measured earlier: 16 arriving chats paced at 32 tokens a step lost a third
of the aggregate throughput).
"""

from __future__ import annotations

import attrs

FLOOR_SHARE = 0.5
"""The smallest chunk, as a share of the cap (128 of the default 256 tokens). A chunk's cost
is not proportional to its tokens: deep in a long prompt each pass also reads the whole
KV cache, so small chunks cost nearly as much as large ones. Measured (8 streams
decoding, a cold 8K prompt): with 32-token chunks the prompt's TTFT went from 25.5 s to
61 s for an inter-token p99 of 0.51 s instead of 1.72 s."""

WEIGHT = 0.3
"""Weight of the newest observation in the exponential averages."""


@attrs.define
class PrefillPacer:
    """Sizes each step's prefill budget from measured step times (module docstring).

    Args:
        share: the fraction of a decode period a step's prefill work may add; 0 turns
            the pacing off (the cap always applies).
        cap: the most tokens a step prefills while sequences decode.
    """

    share: float
    cap: int
    decode_period: float | None = None
    """Seconds of a step without prefill work (average)."""
    token_cost: float | None = None
    """Seconds a prefilled token adds to a step (average)."""

    def budget(self) -> int:
        """This step's prefill token budget while sequences decode."""
        if self.share <= 0 or self.decode_period is None or not self.token_cost:
            return self.cap
        tokens = round(self.share * self.decode_period / self.token_cost)
        return max(self.floor, min(self.cap, tokens))

    @property
    def floor(self) -> int:
        """The smallest chunk (:data:`FLOOR_SHARE` of the cap, at least one token)."""
        return max(1, int(self.cap * FLOOR_SHARE))

    def observe(self, seconds: float, prefilled: int, decoded: bool) -> None:
        """Record one engine step: its duration, the paced prompt tokens it prefilled
        (negative: other prefill work, not measured), and whether it ran a decode step.
        Steps that did not decode tell nothing about the gap streams feel and are
        ignored."""
        if not decoded or seconds <= 0 or prefilled < 0:
            return
        if prefilled <= 0:
            self.decode_period = _average(self.decode_period, seconds)
        elif self.decode_period is not None:
            extra = max(seconds - self.decode_period, 0.0) / prefilled
            self.token_cost = _average(self.token_cost, extra)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - WEIGHT) * old + WEIGHT * new
