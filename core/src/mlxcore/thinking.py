"""Thinking budgets: at most N reasoning tokens, then the server closes the think block.

A request's budget (``thinking_token_budget`` and its aliases, Anthropic's
``thinking.budget_tokens``, a Responses ``reasoning.effort``, or ``--thinking-token-budget``)
becomes a :class:`ThinkingBudget` in the engine options (the request builder puts it
there); the built-in plugin :mod:`mlxcore.builtin.thinking` turns it into a
:class:`ThinkingBudgetProcessor`, a logits processor that counts the tokens generated
inside the think block and, once ``budget`` of them were written, forces the block's
closing the way the model's template family writes it (``</think>\\n\\n`` for Qwen,
``<channel|>`` for Gemma 4), after which the model answers freely.

Everything works on token ids (the open and close tags tokenized once per model), so
it costs nothing per step but a comparison. :class:`ThinkingTracker` is the same state
machine the output pipeline uses to report ``reasoning_tokens`` in usage.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.parsers.base import ReasoningParser

OPTION = "thinking_plan"
"""The ``GenerationRequest.options`` key holding the request's :class:`ThinkingBudget`
(set by the request builder only: a body field of this name is dropped)."""

BUDGET_FIELDS = ("thinking_token_budget", "reasoning_max_tokens", "thinking_budget")
"""The request fields that set a budget: vLLM's name, then Rapid-MLX's and oMLX's."""

EFFORT_BUDGETS: dict[str, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
    "xhigh": None,
}
"""The budget of each OpenAI ``reasoning_effort`` / Responses ``reasoning.effort`` value
(``None``: no budget)."""


def effort_budget(effort: str | None) -> int | None:
    """The budget of a reasoning effort (``None`` for no effort or ``xhigh``); raises
    ``ValueError`` for an effort that is not one of :data:`EFFORT_BUDGETS`."""
    if effort is None:
        return None
    if effort not in EFFORT_BUDGETS:
        raise ValueError(f"reasoning effort {effort!r} is not one of {', '.join(EFFORT_BUDGETS)}")
    return EFFORT_BUDGETS[effort]


@attrs.frozen
class ThinkingMarkers:
    """One model's think-block tags as token ids."""

    open_ids: tuple[int, ...]
    """What opens a reasoning block in the output (with Gemma's ``thought`` label)."""
    close_ids: tuple[int, ...]
    forced_close: tuple[int, ...]
    """What the server writes when a budget is spent: the closing tag and what the
    template puts after it."""


def thinking_markers(
    parser: type[ReasoningParser] | None, tokenizer: Any
) -> ThinkingMarkers | None:
    """The markers of a tag-based reasoning parser (``None`` for no parser, or one that
    has no tags)."""
    open_tag = getattr(parser, "open_tag", None)
    close_tag = getattr(parser, "close_tag", None)
    if not isinstance(open_tag, str) or not isinstance(close_tag, str):
        return None
    labels = sorted(getattr(parser, "reasoning_labels", None) or ())
    after = str(getattr(parser, "after_close", ""))

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()

    close_ids = ids(close_tag)
    forced = ids(close_tag + after)
    if forced[: len(close_ids)] != close_ids:  # the suffix merged into the tag's tokens
        forced = close_ids + ids(after)
    opening = ids(open_tag + (labels[0] if labels else ""))
    if not opening or not close_ids:
        return None
    return ThinkingMarkers(opening, close_ids, forced)


@attrs.frozen
class ThinkingBudget:
    """A request's thinking budget, ready for the engine."""

    budget: int
    markers: ThinkingMarkers
    starts_inside: bool
    """The prompt opened the think block (Qwen3.5's template ends with ``<think>\\n``)."""
    tag_only: bool = False
    """Force the closing tag alone (an output constraint starting after it decides what
    comes next)."""

    @property
    def forced(self) -> tuple[int, ...]:
        """The tokens written when the budget is spent."""
        return self.markers.close_ids if self.tag_only else self.markers.forced_close


class ThinkingTracker:
    """Follows generated token ids through a think block: before it, inside it (counting
    the tokens between the tags), after it. A second block is not tracked."""

    def __init__(self, markers: ThinkingMarkers, *, starts_inside: bool = False) -> None:
        self.markers = markers
        self.inside = starts_inside
        self.closed = False
        self.count = 0
        """Tokens written inside the block so far (the tags not counted)."""
        width = max(len(markers.open_ids), len(markers.close_ids))
        self._recent: deque[int] = deque(maxlen=width)

    def feed(self, token: int) -> None:
        """Take the next generated token."""
        self._recent.append(token)
        if self.closed:
            return
        if not self.inside:
            self.inside = self._ends_with(self.markers.open_ids)
            return
        close = self.markers.close_ids
        if self._ends_with(close):
            self.closed = True
            self.count -= len(close) - 1  # its first tokens were counted as thinking
            return
        self.count += 1

    def _ends_with(self, ids: tuple[int, ...]) -> bool:
        n = len(ids)
        recent = self._recent
        if len(recent) < n or recent[-1] != ids[-1]:  # the usual case, per token
            return False
        return n == 1 or tuple(recent)[-n:] == ids


class ThinkingBudgetProcessor:
    """Forces the think block closed once ``plan.budget`` tokens were written inside it.

    A logits processor (``(tokens, logits) -> logits``, ``tokens`` the prompt and what
    was generated): it reads only the tokens new since its last call, and replays from
    the start when the context got shorter (a speculative decoder's rejected draft)."""

    def __init__(self, plan: ThinkingBudget, prompt_length: int) -> None:
        self.plan = plan
        self.prompt_length = prompt_length
        self._reset()

    def _reset(self) -> None:
        self.tracker = ThinkingTracker(self.plan.markers, starts_inside=self.plan.starts_inside)
        self.seen = 0
        self.force_from: int | None = None
        """The generated position where the forced closing starts."""

    def _spent(self) -> bool:
        t = self.tracker
        return t.inside and not t.closed and t.count >= self.plan.budget

    def _advance(self, tokens: mx.array, generated: int) -> None:
        if generated < self.seen:
            self._reset()
        if generated > self.seen:
            start = self.prompt_length + self.seen
            window = tokens.reshape(-1)[start : self.prompt_length + generated]
            new: list[int] = window.tolist()  # type: ignore[assignment]
            for pos, token in enumerate(new, start=self.seen):
                if self.force_from is None and self._spent():
                    self.force_from = pos
                self.tracker.feed(int(token))
            self.seen = generated
        if self.force_from is None and self._spent():
            self.force_from = generated

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        generated = int(tokens.shape[-1]) - self.prompt_length
        self._advance(tokens, generated)
        if self.force_from is None:
            return logits
        index = generated - self.force_from
        forced = self.plan.forced
        if not 0 <= index < len(forced):
            return logits
        # added, not substituted: a token another processor ruled out stays out
        bias = mx.full(logits.shape, -1e9, dtype=logits.dtype).at[..., forced[index]].add(1e9)
        return logits + bias
