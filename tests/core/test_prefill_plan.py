"""The prefill policy's pure functions: short-first with a bound, shared-prefix leaders."""

from __future__ import annotations

import attrs
import pytest

from mlxcore.engine.prefill_plan import (
    SHARED_PREFIX_MIN_TOKENS,
    SHORT_TURNS,
    cheap_enough,
    common_prefix,
    find_shared_prefix,
    plan_step,
)


@attrs.define(eq=False)
class Item:
    remaining: int
    progress: int = 0
    begun: bool = False


def short(budget: int):
    return lambda item: not item.begun and item.remaining <= budget + 1


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        ((), (1, 2), 0),
        ((1, 2, 3), (1, 2, 3), 3),
        ((1, 2, 3), (1, 2), 2),
        ((1, 2, 3, 4), (1, 2, 9, 4), 2),
        ((5,), (6,), 0),
        (tuple(range(5000)), (*range(4321), -1), 4321),
    ],
)
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n
    assert common_prefix(b, a) == n


def test_padding_and_budget_bound_a_batch():
    assert cheap_enough([100, 100, 100], 512)
    assert not cheap_enough([100, 100, 100, 100, 100, 100], 512)  # 600 padded tokens
    assert not cheap_enough([1000, 10, 10], 10**6)  # 3000 padded for 1020 real
    assert cheap_enough([1000, 10], 10**6)  # 2000 padded for 1010: within the slack


def test_short_prompts_go_ahead_of_a_long_one_in_progress():
    long = Item(8000, begun=True)
    a, b = Item(30), Item(40)
    plan = plan_step([long, a, b], short(512), 512, 8, 0)
    assert plan is not None and plan.short and plan.group == [a, b]


def test_the_long_prompt_advances_after_a_bounded_number_of_short_batches():
    long = Item(8000, begun=True)
    a = Item(30)
    plan = plan_step([long, a], short(512), 512, 8, SHORT_TURNS)
    assert plan is not None and not plan.short and plan.group == [long]
    # with no long prompt waiting, shorts run whatever the count
    plan = plan_step([a], short(512), 512, 8, SHORT_TURNS + 5)
    assert plan is not None and plan.short and plan.group == [a]


def test_a_batch_respects_the_cap_and_the_budget():
    items = [Item(50) for _ in range(12)]
    plan = plan_step(items, short(512), 512, 8, 0)
    assert plan is not None and plan.group == items[:8]  # 8 x 50 = 400 <= 512
    plan = plan_step(items, short(256), 256, 8, 0)
    assert plan is not None and plan.group == items[:5]  # 5 x 50 = 250 <= 256


def test_a_prompt_marked_alone_is_prefilled_by_itself_when_it_comes_first():
    newcomer, *others = [Item(50) for _ in range(4)]
    plan = plan_step([newcomer, *others], short(512), 512, 8, 0, lambda i: i is newcomer)
    assert plan is not None and plan.short and plan.group == [newcomer]
    # behind another short prompt it is batched as before
    plan = plan_step([*others, newcomer], short(512), 512, 8, 0, lambda i: i is newcomer)
    assert plan is not None and plan.group == [*others, newcomer]


def test_a_prompt_longer_than_the_budget_is_chunked():
    big = Item(3000)
    plan = plan_step([big], short(512), 512, 8, 0)
    assert plan is not None and not plan.short and plan.group == [big]
    assert plan_step([], short(512), 512, 8, 0) is None


def test_a_request_waits_for_a_leader_computing_its_prefix():
    prefix = list(range(1000, 5000))
    leader_tokens = [*prefix, 1, 2, 3]
    mine = [*prefix, 7, 8]
    found = find_shared_prefix(mine, [("L", leader_tokens, 0, [])])
    assert found is not None and found.leader == "L" and found.length == len(prefix)
    # the leader already passed the shared part: nothing to wait for
    assert find_shared_prefix(mine, [("L", leader_tokens, len(prefix), [])]) is None
    # too little shared
    few = [*prefix[: SHARED_PREFIX_MIN_TOKENS - 1], -5]
    assert find_shared_prefix(few, [("L", leader_tokens, 0, [])]) is None


def test_followers_reuse_a_nearby_checkpoint_and_pick_the_longest_leader():
    prefix = list(range(4000))
    leader_tokens = [*prefix, 1, 2, 3]
    mine = [*prefix, 1, 2, 9]
    found = find_shared_prefix(mine, [("L", leader_tokens, 0, [3990])])
    assert found is not None and found.length == 3990
    other = [*prefix[:1000], -1]
    found = find_shared_prefix(mine, [("S", other, 0, []), ("L", leader_tokens, 0, [])])
    assert found is not None and found.leader == "L" and found.length == 4001
    # identical prompts: wait for the leader's last checkpoint, all but the last two tokens
    # (a checkpoint lies before the prompt's last token: PrefillTask.checkpoints)
    found = find_shared_prefix(leader_tokens, [("L", leader_tokens, 0, [])])
    assert found is not None and found.length == len(leader_tokens) - 2
