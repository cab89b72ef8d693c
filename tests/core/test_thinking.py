"""Thinking budgets on token ids: the tracker's counting, the processor's forced close
(also after a rollback), the markers of real tokenizers, effort budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxcore.parsers.think import ThinkReasoningParser
from mlxcore.thinking import (
    EFFORT_BUDGETS,
    ThinkingBudget,
    ThinkingBudgetProcessor,
    ThinkingMarkers,
    ThinkingTracker,
    effort_budget,
    thinking_markers,
)

OPEN, CLOSE_A, CLOSE_B, NL = 90, 91, 92, 93
MARKERS = ThinkingMarkers((OPEN,), (CLOSE_A, CLOSE_B), (CLOSE_A, CLOSE_B, NL))
VOCAB = 100
PROMPT = [1, 2, 3]


def test_the_tracker_counts_between_the_tags_only() -> None:
    tracker = ThinkingTracker(MARKERS)
    for token in [5, 6, OPEN, 7, 8, 9, CLOSE_A, CLOSE_B, 10, 11, OPEN, 12]:
        tracker.feed(token)
    assert tracker.count == 3 and tracker.closed
    inside = ThinkingTracker(MARKERS, starts_inside=True)
    for token in [7, CLOSE_A, 8]:  # a first half of the closing tag is thinking too
        inside.feed(token)
    assert inside.count == 3 and not inside.closed


def run(processor: ThinkingBudgetProcessor, choose: Any, steps: int) -> list[int]:
    """Decode ``steps`` tokens: each the forced one, else ``choose(position)``."""
    out: list[int] = []
    for pos in range(steps):
        logits = processor(mx.array([PROMPT + out]), mx.zeros((1, VOCAB)))
        best = int(mx.argmax(logits, axis=-1).item())
        out.append(best if float(mx.min(logits)) < -1 else choose(pos))  # forced: all else -1e9
    return out


def test_the_processor_closes_the_block_when_the_budget_is_spent() -> None:
    plan = ThinkingBudget(4, MARKERS, starts_inside=False)
    out = run(ThinkingBudgetProcessor(plan, len(PROMPT)), lambda p: OPEN if p == 1 else 40, 12)
    assert out == [40, OPEN, 40, 40, 40, 40, CLOSE_A, CLOSE_B, NL, 40, 40, 40]
    zero = ThinkingBudgetProcessor(ThinkingBudget(0, MARKERS, starts_inside=True), len(PROMPT))
    assert run(zero, lambda p: 40, 5) == [CLOSE_A, CLOSE_B, NL, 40, 40]
    tag_only = ThinkingBudget(1, MARKERS, starts_inside=True, tag_only=True)
    assert run(ThinkingBudgetProcessor(tag_only, len(PROMPT)), lambda p: 40, 5) == [
        40, CLOSE_A, CLOSE_B, 40, 40,
    ]  # fmt: skip


def test_a_block_closed_by_the_model_is_left_alone() -> None:
    plan = ThinkingBudget(5, MARKERS, starts_inside=True)
    script = [40, 41, CLOSE_A, CLOSE_B, 40, 40, 40, 40, 40, 40]
    out = run(ThinkingBudgetProcessor(plan, len(PROMPT)), lambda p: script[p], 10)
    assert out == script


def test_a_shorter_context_replays_from_the_start() -> None:
    """A speculative decoder's rejected draft: the processor sees fewer tokens than
    before and must count again from what is really there."""
    plan = ThinkingBudget(3, MARKERS, starts_inside=True)
    proc = ThinkingBudgetProcessor(plan, len(PROMPT))
    logits = mx.zeros((1, VOCAB))
    proc(mx.array([[*PROMPT, 40, 40, 40]]), logits)  # the draft: budget spent
    assert proc.force_from == 3
    forced = proc(mx.array([[*PROMPT, 40]]), logits)  # only one token was accepted
    assert proc.force_from is None and float(mx.max(forced)) == 0.0
    forced = proc(mx.array([[*PROMPT, 40, 41, 42]]), logits)
    assert int(mx.argmax(forced).item()) == CLOSE_A


@pytest.fixture(scope="module")
def qwen_tokenizer(tiny_qwen3: Path) -> Any:
    from mlxcore.models.loader import load_model

    return load_model(tiny_qwen3).tokenizer


def test_markers_of_a_real_tokenizer(qwen_tokenizer: Any) -> None:
    markers = thinking_markers(ThinkReasoningParser, qwen_tokenizer)
    assert markers is not None
    enc = qwen_tokenizer.encode
    assert markers.open_ids == tuple(enc("<think>", add_special_tokens=False))
    assert len(markers.close_ids) == 1  # a special token
    assert qwen_tokenizer.decode(list(markers.forced_close)) == "</think>\n\n"
    assert thinking_markers(None, qwen_tokenizer) is None


def test_effort_budgets() -> None:
    assert effort_budget(None) is None and effort_budget("xhigh") is None
    assert effort_budget("none") == 0
    assert [EFFORT_BUDGETS[e] for e in ("minimal", "low", "medium", "high")] == sorted(
        EFFORT_BUDGETS[e]
        for e in ("minimal", "low", "medium", "high")  # type: ignore[misc]
    )
    with pytest.raises(ValueError, match="not one of"):
        effort_budget("extreme")
