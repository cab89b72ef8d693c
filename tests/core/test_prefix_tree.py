"""The radix tree behind prefix reuse, on its own: shared nodes, splits, byte counts,
least-recently-used eviction over leaves and inner snapshots, and the same evictions on
two trees fed the same operations (what distributed ranks rely on).

Segments here are numpy arrays of the tokens themselves (the tree never looks inside
them; :mod:`tests.core.test_radix_cache` runs it on real caches of real models)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from mlxcore.engine.prefix_tree import PrefixTree

BYTES_PER_TOKEN = 10
SNAPSHOT_BYTES = 100


def split(segment: Any, at: int) -> tuple[Any, Any]:
    return segment[:at], segment[at:]


def tree(needs_snapshots: bool = False, protect_reused: bool = True) -> PrefixTree:
    return PrefixTree(split, needs_snapshots=needs_snapshots, protect_reused=protect_reused)


def add(t: PrefixTree, tokens: list[int], snapshot: bool = False) -> Any:
    arr = np.asarray(tokens, dtype=np.int64)

    def segment_for(start: int, stop: int) -> tuple[Any, int]:
        return arr[start:stop].copy(), (stop - start) * BYTES_PER_TOKEN

    def snapshot_for() -> tuple[Any, int]:
        return f"state@{len(tokens)}", SNAPSHOT_BYTES

    return t.insert(arr, segment_for, snapshot_for if snapshot else None)


def check(t: PrefixTree) -> None:
    """Every node's segment is its tokens, bytes add up, children are keyed right."""
    total = 0
    for node in t:
        assert np.array_equal(node.segment, node.tokens)
        assert node.segment_bytes == node.tokens.shape[0] * BYTES_PER_TOKEN
        assert node.start == (node.parent.end if node.parent is not None else 0)
        for first, child in node.children.items():
            assert child.tokens[0] == first and child.parent is node
        total += node.nbytes
    assert total == t.nbytes
    assert t.snapshots == sum(1 for n in t if n.snapshot is not None)


def test_prompts_that_share_a_prefix_share_its_nodes() -> None:
    t = tree()
    system = list(range(100))
    add(t, [*system, 1, 2, 3])
    add(t, [*system, 7, 8])
    add(t, [*system[:50], 9])
    check(t)
    # 100 shared + 3 + 2 + 1 tokens, each held once
    assert t.nbytes == (100 + 3 + 2 + 1) * BYTES_PER_TOKEN
    found = t.match(np.asarray([*system, 7, 8, 9], dtype=np.int64))
    assert found.shared == 102
    assert [n.end for n in found.nodes] == [50, 100, 102]
    assert t.match(np.asarray([5, 6], dtype=np.int64)).shared == 0


def test_a_snapshot_is_kept_once_and_found_at_or_before_a_limit() -> None:
    t = tree(needs_snapshots=True)
    add(t, list(range(40)), snapshot=True)
    add(t, list(range(80)), snapshot=True)
    again = add(t, list(range(40)), snapshot=True)
    assert again.snapshot == "state@40" and t.snapshots == 2
    found = t.match(np.asarray([*range(70), 999], dtype=np.int64))
    assert found.shared == 70
    assert found.deepest_snapshot(limit=70).end == 40
    full = t.match(np.asarray(range(81), dtype=np.int64))
    assert full.deepest_snapshot(limit=80).end == 80
    assert full.deepest_snapshot(limit=79).end == 40


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    t = tree()
    old = add(t, [1, *range(100, 150)])
    add(t, [2, *range(200, 250)])
    t.touch([old])  # used again: the other one is now the oldest
    t.evict_bytes(t.nbytes - 1)
    check(t)
    assert t.match(np.asarray([1, *range(100, 150)], dtype=np.int64)).shared == 51
    assert t.match(np.asarray([2, 200], dtype=np.int64)).shared == 0


def test_leaves_without_snapshots_go_with_their_leaf_in_a_hybrid_tree() -> None:
    t = tree(needs_snapshots=True)
    first = add(t, list(range(60)), snapshot=True)
    add(t, [*range(30), 5, 6, 7], snapshot=True)  # splits the first at 30 (no snapshot)
    check(t)
    assert len(t.nodes) == 3
    t.touch([first])
    # evicting the other branch leaves the split point, which has no snapshot, with one
    # child: it stays (it is the first entry's prefix)
    t.evict_entries(t.entries - 2)
    check(t)
    assert t.match(np.asarray(range(60), dtype=np.int64)).deepest_snapshot(60).end == 60
    # evicting the last leaf removes the now useless split point with it
    t.evict_entries(1)
    assert len(t.nodes) == 0 and t.nbytes == 0 and t.entries == 0


def test_inner_snapshots_are_evicted_before_a_more_recent_leaf() -> None:
    t = tree(needs_snapshots=True)
    inner = add(t, list(range(50)), snapshot=True)
    add(t, list(range(90)), snapshot=True)
    add(t, [7, *range(20)], snapshot=True)  # a newer, unrelated entry
    assert inner.children
    t.touch([t.match(np.asarray([7, 1], dtype=np.int64)).nodes[0]])
    before = t.nbytes
    t.evict_bytes(before - 1)  # one unit: the oldest is the long entry's leaf
    assert t.match(np.asarray(range(90), dtype=np.int64)).deepest_snapshot(90).end == 50
    check(t)


def test_two_trees_fed_the_same_operations_evict_the_same_entries() -> None:
    """A distributed rank other than 0 follows rank 0's evictions by count only."""
    rng = random.Random(7)
    # a distributed group evicts by plain LRU (prefix_cache_for(..., distributed=True))
    leader = tree(needs_snapshots=True, protect_reused=False)
    follower = tree(needs_snapshots=True, protect_reused=False)
    follower_budget = 1 << 62
    for step in range(300):
        base = rng.randrange(4)
        tokens = [base, *[rng.randrange(3) for _ in range(rng.randrange(1, 40))]]
        for t in (leader, follower):
            add(t, tokens, snapshot=True)
        if rng.random() < 0.3:
            for t in (leader, follower):
                t.touch([t.match(np.asarray(tokens, dtype=np.int64)).nodes[-1]], reused=True)
        leader.evict_bytes(2000)  # rank 0 evicts by bytes
        follower.evict_bytes(follower_budget)
        follower.evict_entries(leader.entries)  # the others by rank 0's count
        assert follower.entries == leader.entries, step
        mine = sorted((tuple(n.path_tokens()), n.snapshot) for n in leader)
        theirs = sorted((tuple(n.path_tokens()), n.snapshot) for n in follower)
        assert mine == theirs, step
        check(leader)


def session(t: PrefixTree, first: int, length: int, every: int) -> list[int]:
    """A conversation of ``length`` tokens stored as a prefill stores it (an entry at
    every ``every`` tokens), then resumed by its next turn (touched as reused)."""
    tokens = [first, *range(1000, 1000 + length - 1)]
    for stop in range(every, length + 1, every):
        add(t, tokens[:stop])
    t.touch([t.match(np.asarray(tokens, dtype=np.int64)).nodes[-1]], reused=True)
    return tokens


def held(t: PrefixTree, tokens: list[int]) -> int:
    return t.match(np.asarray(tokens, dtype=np.int64)).shared


def test_a_burst_of_one_off_prompts_cannot_push_out_a_resumed_history() -> None:
    """Twenty one-off prompts arrive after a session's last turn (side requests, another
    client's single questions): plain LRU evicts the session's history, the older one;
    with reused units protected the one-offs evict each other."""
    limit = 1_500 * BYTES_PER_TOKEN
    outcome = {}
    for protect in (True, False):
        t = tree(protect_reused=protect)
        history = session(t, 1, 1_000, 250)
        for n in range(20):
            add(t, [2 + n, *range(5_000, 5_099)])
            t.evict_bytes(limit)
            check(t)
        outcome[protect] = held(t, history)
    assert outcome == {True: 1_000, False: 0}


def test_past_the_protected_share_the_session_idle_longest_goes_end_first() -> None:
    """Two resumed sessions of 600 tokens under a budget of 1,000: the one used longest
    ago loses its end, not its beginning; the recent one stays whole."""
    t = tree()
    idle = session(t, 1, 600, 150)
    recent = session(t, 2, 600, 150)
    t.evict_bytes(1_000 * BYTES_PER_TOKEN)
    check(t)
    assert held(t, recent) == 600
    assert held(t, idle) == 300  # its first two entries: the longest prefix that fits


def test_a_session_longer_than_the_budget_keeps_its_longest_prefix() -> None:
    """A side request, then the session's next turn resumes it: the side request's leaf
    goes first, then the session's end; what stays is its beginning, as much as the
    protected share holds (its entries are 250 tokens apart)."""
    t = tree()
    tokens = session(t, 1, 2_000, 250)
    side = [9, *range(100)]
    add(t, side)
    t.touch([t.match(np.asarray(tokens, dtype=np.int64)).nodes[-1]], reused=True)
    t.evict_bytes(1_000 * BYTES_PER_TOKEN)
    check(t)
    assert held(t, side) == 0
    assert held(t, tokens) == 1_000
    t.evict_bytes(900 * BYTES_PER_TOKEN)
    assert held(t, tokens) == 750  # the end goes first: a prefix stays, never a middle
