"""The time-sized step budget (engine/prefill_pacer.py): pure arithmetic on step times."""

from __future__ import annotations

import argparse

import pytest

from mlxcore.engine.prefill_pacer import (
    FIRST_CHUNK,
    FIRST_IDLE_CHUNK,
    IDLE_FLOOR,
    MIN_CHUNK,
    PrefillPacer,
    StepBudget,
)
from mlxcore.settings import time_share


def test_a_small_first_chunk_until_the_costs_are_measured() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    assert pacer.budget() == FIRST_CHUNK
    pacer.observe(0.020, 0, decoded=True)  # a decode period, no cost per token yet
    assert pacer.budget() == FIRST_CHUNK and pacer.token_cost is None
    pacer.observe(0.5, 100, decoded=False)  # 5 ms a token with nothing decoding
    assert pacer.budget() == MIN_CHUNK  # 0.5 x 20 ms at 5 ms a token: 2, the floor
    assert PrefillPacer(share=0.5, cap=16).budget() == 16  # never above the cap


def test_the_budget_adds_the_share_of_a_decode_period() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    pacer.observe(0.100, 0, decoded=True)
    pacer.observe(0.100 + 200 * 0.0003, 200, decoded=True)  # 0.3 ms a prefilled token
    assert pacer.token_cost == pytest.approx(0.0003)
    assert pacer.budget() == 167  # 0.5 x 100 ms at 0.3 ms a token
    pacer.share = 3.0  # three decode periods of prefill: the cap
    assert pacer.budget() == 256


def test_a_deeper_context_costs_more_and_shrinks_the_budget_down_to_the_floor() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    assert pacer.floor == MIN_CHUNK
    pacer.observe(0.100, 0, decoded=True)
    budgets = []
    for cost in (0.0001, 0.0002, 0.0004, 0.0016, 0.0064, 0.0256):  # a long prompt's chunks
        pacer.observe(0.100 + 64 * cost, 64, decoded=True)
        budgets.append(pacer.budget())
    assert budgets == sorted(budgets, reverse=True) and budgets[0] == 256
    assert MIN_CHUNK < budgets[3] < 256 and budgets[-1] == MIN_CHUNK


def test_with_nothing_decoding_a_step_is_sized_to_the_target() -> None:
    pacer = PrefillPacer(share=1.0, cap=256, target=1.0, idle_cap=2048)
    assert pacer.idle_budget() == FIRST_IDLE_CHUNK  # nothing measured yet
    pacer.observe(2048 * 0.0002, 2048, decoded=False)  # 0.2 ms a token: 5,000 fit
    assert pacer.idle_budget() == 2048
    for _ in range(20):  # deep into a long prompt: 2 ms a token
        pacer.observe(500 * 0.002, 500, decoded=False)
    assert pacer.idle_cost == pytest.approx(0.002, rel=1e-3)
    assert pacer.idle_budget() == 500
    for _ in range(20):  # 20 ms a token: the floor keeps the prompt moving
        pacer.observe(256 * 0.02, 256, decoded=False)
    assert pacer.idle_budget() == IDLE_FLOOR
    begun = PrefillPacer(share=1.0, cap=256, target=1.0, idle_cap=2048)
    begun.observe(0.050, 0, decoded=True)
    begun.observe(0.050 + 10 * 0.01, 10, decoded=True)  # 10 ms a token beside the streams
    assert begun.idle_budget() == 100  # they ended: the prompt goes on at that cost
    off = PrefillPacer(share=1.0, cap=256, target=0.0, idle_cap=2048)
    off.observe(100.0, 100, decoded=False)
    assert off.idle_budget() == 2048
    assert pacer.budget() == FIRST_CHUNK  # no decode period measured yet


def test_off_cheap_and_small_caps() -> None:
    off = PrefillPacer(share=0.0, cap=256)
    off.observe(0.1, 0, decoded=True)
    off.observe(10.0, 100, decoded=True)
    assert off.budget() == 256
    cheap = PrefillPacer(share=0.5, cap=256)
    cheap.observe(0.1, 0, decoded=True)
    cheap.observe(0.1, 100, decoded=True)  # no measurable cost: the cap
    assert cheap.budget() == 256
    small = PrefillPacer(share=0.5, cap=1)  # the floor is at most the cap
    small.observe(0.1, 0, decoded=True)
    small.observe(5.0, 1, decoded=True)
    assert small.budget() == 1


def test_the_period_follows_the_batch() -> None:
    pacer = PrefillPacer(share=0.5, cap=512)
    for _ in range(30):
        pacer.observe(0.050, 0, decoded=True)
    assert pacer.decode_period == pytest.approx(0.050)
    for _ in range(30):
        pacer.observe(0.200, 0, decoded=True)  # rows joined: steps take longer
    assert pacer.decode_period == pytest.approx(0.200, rel=1e-3)


@pytest.mark.parametrize("text", ["-0.1", "8.5", "nan", "x", "inf"])
def test_the_share_flag_takes_zero_to_eight_decode_steps(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 8"):
        time_share(text)
    assert time_share("0") == 0.0 and time_share("0.5") == 0.5 and time_share("8") == 8.0


def test_the_flags_give_the_budget_and_the_start_up_line_states_it() -> None:
    sized = StepBudget.of(2048, 256, 3.0, 1.0)
    assert (sized.idle_cap, sized.cap, sized.share, sized.target) == (2048, 256, 3.0, 1.0)
    assert sized.describe() == (
        "3x a decode step's time (16-256 tokens) beside decoding streams, "
        "1 s (64-2048 tokens) with nothing decoding"
    )
    assert sized.pacer().budget() == FIRST_CHUNK
    assert sized.pacer().idle_budget() == FIRST_IDLE_CHUNK
    fixed = StepBudget.of(2048, 256, 3.0, 1.0, max_batched_tokens=512)
    words = "512 tokens beside decoding streams, 512 tokens with nothing decoding"
    assert fixed.describe() == words
    pacer = fixed.pacer()
    pacer.observe(10.0, 512, decoded=False)  # however slow: never sized in time
    assert pacer.idle_budget() == 512 and pacer.budget() == 512
    ranks = StepBudget.of(2048, 0, 3.0, 1.0, fixed=True)  # distributed: identical plans
    assert (ranks.idle_cap, ranks.cap, ranks.share, ranks.target) == (2048, 2048, 0.0, 0.0)


def test_a_step_over_twice_the_target_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from mlxcore.engine.stall import DECODING, IDLE
    from mlxcore.engine.step_times import StepTimes

    times = StepTimes(target=1.0)
    times.observe(1.9, IDLE, rows=3)  # within twice the target
    assert times.over == 0 and times.longest == 1.9
    with caplog.at_level("WARNING", logger="mlxcore.engine.step_times"):
        times.observe(2.5, DECODING, rows=3)
    assert times.over == 1 and times.steps == 2
    assert "2.50 s (target 1.00 s): decode beside 3 decoding rows" in caplog.text
    assert times.figures() == {
        "engine_step_seconds_max": 2.5,
        "engine_steps_over_target": 1.0,
        "step_time_target_seconds": 1.0,
    }
