"""How many prompt tokens a step may prefill, sized in time: the engine's step budget.

A step is some prefill work and one decode step. Its length is what everyone waiting
feels: running streams feel it as the gap between two of their tokens, a request that
arrives feels it as the wait before it is admitted. A fixed token budget bounds neither,
because what a token costs depends on the model, the batch and how deep into a long
prompt the chunk lies (on the CPU, attention over 8K tokens of context costs three to
four times more per token than over 1K). So the pacer measures:

* the **decode period**: the time of a step that decoded and prefilled nothing (an
  exponential average, so it follows the batch as rows join and leave);
* the **prefill cost per token beside decoding**: how much longer a step with prefill
  work took than the decode period, divided by the tokens it prefilled;
* the **prefill cost per token alone**: a step's time divided by its tokens, for steps
  with nothing decoding.

The averages weigh the newest step most, so a long prompt's cost follows its growing
context. While sequences decode, a step's budget is ``share`` decode periods of prefill
(the running streams' gap stays within ``1 + share`` periods), between
:data:`MIN_CHUNK` tokens and the cap; with nothing decoding, it is the step-time
``target`` worth of tokens, between :data:`IDLE_FLOOR` and the idle cap. Until a cost is
measured, :data:`FIRST_CHUNK` tokens apply beside decoding, :data:`FIRST_IDLE_CHUNK` without. Pure
bookkeeping on numbers the loop passes in, so it is tested alone; the loop owns the clock.

Short prompts (prefilled whole, batched) are paced too (issue 58): while sequences decode,
a batch of them holds at most the step's budget in padded tokens, and the step's time is
measured like a chunk's, so the cost per token includes the join.
"""

from __future__ import annotations

import attrs

MIN_CHUNK = 16
"""The fewest tokens a step prefills beside decoding streams. A chunk's cost is not
proportional to its tokens: each pass also reads the weights and, deep in a long prompt,
the whole KV cache, so tiny chunks pay that again and again (measured on the CPU with the
100M model at 7K tokens of context: 8 tokens 194 ms, 16 tokens 281 ms, 64 tokens 990 ms)."""

IDLE_FLOOR = 64
"""The fewest tokens a step prefills with nothing decoding (a slow model's step may then
run past the target: a prompt still moves at a useful pace). Deep in a long prompt, chunks
of 64 to 2,048 tokens cost about the same per token on the CPU (100M model at 12K tokens
of context: 28 ms a token in 128-token chunks, 37 ms in 512-token ones), so sizing them
to the target loses nothing there."""

FIRST_CHUNK = 32
"""The budget of a step beside decoding streams before any cost is measured (the cap, 256
tokens of a scored prompt on SmolLM2, held a stream for 1.85 s)."""

FIRST_IDLE_CHUNK = 256
"""The budget of a step with nothing decoding before any cost is measured (a fresh
server's first long prompt: 2,048 tokens took 12.6 s on the CPU with the 100M model)."""

WEIGHT = 0.5
"""Weight of the newest observation in the exponential averages (a long prompt's cost per
token grows with every chunk: at 0.3 the average lagged so far behind that idle steps
ran 1.7x the target and the streams' p99 beside them 6x their decode period)."""


@attrs.define
class PrefillPacer:
    """Sizes each step's prefill budget from measured step times (module docstring).

    Args:
        share: decode periods a step's prefill work may add while sequences decode; 0
            turns that pacing off (the cap always applies).
        cap: the most tokens a step prefills while sequences decode.
        target: seconds a step with nothing decoding aims at; 0 turns that pacing off.
        idle_cap: the most tokens a step prefills with nothing decoding.
    """

    share: float
    cap: int
    target: float = 0.0
    idle_cap: int = 2048
    decode_period: float | None = None
    """Seconds of a step without prefill work (average)."""
    token_cost: float | None = None
    """Seconds a prefilled token adds to a decode step (average)."""
    idle_cost: float | None = None
    """Seconds a prefilled token takes in a step with nothing decoding (average)."""

    def budget(self) -> int:
        """This step's prefill token budget while sequences decode."""
        if self.share <= 0:
            return self.cap
        cost = self.token_cost if self.token_cost is not None else self.idle_cost
        if self.decode_period is None or cost is None:
            return min(FIRST_CHUNK, self.cap)
        if cost <= 0:
            return self.cap  # prefill adds nothing measurable to a step
        tokens = round(self.share * self.decode_period / cost)
        return max(self.floor, min(self.cap, tokens))

    def idle_budget(self) -> int:
        """This step's prefill token budget with nothing decoding."""
        if self.target <= 0:
            return self.idle_cap
        cost = self.idle_cost or self.token_cost  # a prompt begun beside decoding streams
        if not cost:
            return min(FIRST_IDLE_CHUNK, self.idle_cap)
        tokens = round(self.target / cost)
        return max(min(IDLE_FLOOR, self.idle_cap), min(self.idle_cap, tokens))

    @property
    def floor(self) -> int:
        """The smallest chunk beside decoding (:data:`MIN_CHUNK`, at most the cap)."""
        return smallest_chunk(self.cap)

    def observe(self, seconds: float, prefilled: int, decoded: bool) -> None:
        """Record one engine step: its duration, the paced prompt tokens it prefilled
        (negative: other prefill work, not measured), and whether it ran a decode step."""
        if seconds <= 0 or prefilled < 0:
            return
        if not decoded:
            if prefilled > 0:
                self.idle_cost = _average(self.idle_cost, seconds / prefilled)
            return
        if prefilled <= 0:
            self.decode_period = _average(self.decode_period, seconds)
        elif self.decode_period is not None:
            extra = max(seconds - self.decode_period, 0.0) / prefilled
            self.token_cost = _average(self.token_cost, extra)


def smallest_chunk(cap: int) -> int:
    """The smallest chunk beside decoding streams under ``cap``: :data:`MIN_CHUNK`."""
    return max(1, min(MIN_CHUNK, cap))


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - WEIGHT) * old + WEIGHT * new


@attrs.frozen
class StepBudget:
    """The settings of a step's prefill budget, from the server's flags.

    Attributes:
        idle_cap: the most prompt tokens a step with nothing decoding prefills.
        cap: the most prompt tokens a step prefills beside decoding streams.
        share: decode steps' time a step's prefill may add beside them (0: the cap).
        target: seconds a step with nothing decoding is sized to (0: the idle cap).
    """

    idle_cap: int
    cap: int
    share: float
    target: float

    @classmethod
    def of(
        cls,
        prefill_step_size: int,
        decode_chunk: int,
        share: float,
        target: float,
        max_batched_tokens: int | None = None,
        fixed: bool = False,
    ) -> StepBudget:
        """The budget the flags give: time-sized within ``--prefill-step-size`` and
        ``--prefill-decode-chunk`` (0: the step size), or ``max_batched_tokens`` a step
        with no time sizing (vLLM's fixed budget); ``fixed`` (a distributed engine,
        whose ranks must plan identical steps from different clocks): no time sizing."""
        if max_batched_tokens is not None:
            return cls(max_batched_tokens, max_batched_tokens, 0.0, 0.0)
        cap = min(decode_chunk or prefill_step_size, prefill_step_size)
        if fixed:
            return cls(prefill_step_size, cap, 0.0, 0.0)
        return cls(prefill_step_size, cap, share, target)

    def describe(self) -> str:
        """The start-up line's words for it."""
        if self.share:
            beside = f"{self.share:g}x a decode step's time ({self.floor()}-{self.cap} tokens)"
        else:
            beside = f"{self.cap} tokens"
        if self.target:
            low = min(IDLE_FLOOR, self.idle_cap)
            alone = f"{self.target:g} s ({low}-{self.idle_cap} tokens)"
        else:
            alone = f"{self.idle_cap} tokens"
        return f"{beside} beside decoding streams, {alone} with nothing decoding"

    def floor(self) -> int:
        """The smallest chunk beside decoding streams."""
        return smallest_chunk(self.cap)

    def pacer(self) -> PrefillPacer:
        """A fresh pacer for these settings (one per batch loop)."""
        return PrefillPacer(self.share, self.cap, self.target, self.idle_cap)
