"""The time-sized prefill budget (engine/prefill_pacer.py): pure arithmetic on step times."""

from __future__ import annotations

import pytest

from mlxcore.engine.prefill_pacer import PrefillPacer
from mlxcore.settings import fraction


def test_the_cap_applies_until_both_figures_are_measured() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    assert pacer.budget() == 256
    pacer.observe(0.020, 0, decoded=True)  # a decode period, no cost per token yet
    assert pacer.budget() == 256
    pacer.observe(0.5, 100, decoded=False)  # prefill with nothing decoding: ignored
    assert pacer.budget() == 256 and pacer.token_cost is None


def test_the_budget_adds_the_share_of_a_decode_period() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    pacer.observe(0.100, 0, decoded=True)
    pacer.observe(0.100 + 200 * 0.0003, 200, decoded=True)  # 0.3 ms a prefilled token
    assert pacer.token_cost == pytest.approx(0.0003)
    assert pacer.budget() == 167  # 0.5 x 100 ms at 0.3 ms a token


def test_a_deeper_context_costs_more_and_shrinks_the_budget_down_to_the_floor() -> None:
    pacer = PrefillPacer(share=0.5, cap=256)
    assert pacer.floor == 128
    pacer.observe(0.100, 0, decoded=True)
    budgets = []
    for cost in (0.0001, 0.0002, 0.0003, 0.0004, 0.0008, 0.0016):  # a long prompt's chunks
        pacer.observe(0.100 + 64 * cost, 64, decoded=True)
        budgets.append(pacer.budget())
    assert budgets == sorted(budgets, reverse=True) and budgets[0] == 256
    assert 128 < budgets[3] < 256 and budgets[-1] == 128


def test_off_cheap_and_small_caps() -> None:
    off = PrefillPacer(share=0.0, cap=256)
    off.observe(0.1, 0, decoded=True)
    off.observe(10.0, 100, decoded=True)
    assert off.budget() == 256
    cheap = PrefillPacer(share=0.5, cap=256)
    cheap.observe(0.1, 0, decoded=True)
    cheap.observe(0.1, 100, decoded=True)  # no measurable cost: the cap
    assert cheap.budget() == 256
    small = PrefillPacer(share=0.5, cap=1)  # the floor is at least one token
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


@pytest.mark.parametrize("text", ["-0.1", "1.5", "nan", "x", "inf"])
def test_the_share_flag_takes_a_fraction(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 1"):
        fraction(text)
    assert fraction("0") == 0.0 and fraction("0.5") == 0.5 and fraction("1") == 1.0
