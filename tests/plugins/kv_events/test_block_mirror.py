"""The block mirror against the radix tree it watches: after any mix of stores, splits,
evictions and clears, the blocks it has announced (and not taken back) are exactly the
complete blocks of the tree's paths, each chained to the block before it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from mlxcore.engine.prefix_tree import PrefixTree
from mlxcore_kv_events.blocks import BlockMirror, block_hash

BLOCK = 4


class Recorder:
    """Stands in for the publisher's queue: applies the events to a set of live blocks."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.RLock()
        self.live: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.events: list[str] = []

    def stored(self, blocks: list[Any], block_size: int) -> None:
        assert block_size == BLOCK
        parent = blocks[0].parent
        assert parent is None or parent in self.live, "a chain must hang under a live block"
        for block in blocks:
            assert block.parent == parent
            self.live[block.hash] = (block.parent, block.tokens)
            parent = block.hash
        self.events.append("stored")

    def removed(self, hashes: list[int]) -> None:
        for digest in hashes:
            del self.live[digest]
        self.events.append("removed")

    def cleared(self, mirror: Any, hashes: list[int]) -> None:
        self.live.clear()
        self.events.append("cleared")


def _split(segment: Any, at: int) -> tuple[Any, Any]:
    return (segment[0], segment[0] + at), (segment[0] + at, segment[1])


def expected_blocks(tree: PrefixTree) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """Every complete block of every path in the tree, recomputed from the tokens."""
    out: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for node in tree:
        tokens = node.path_tokens()
        parent = None
        for i in range(len(tokens) // BLOCK):
            run = tokens[i * BLOCK : (i + 1) * BLOCK]
            digest = block_hash(parent, run)
            out[digest] = (parent, tuple(int(t) for t in run))
            parent = digest
    return out


@pytest.mark.parametrize("snapshots", [False, True], ids=["attention", "hybrid"])
@pytest.mark.parametrize("seed", range(4))
def test_the_mirror_holds_exactly_the_trees_complete_blocks(seed: int, snapshots: bool) -> None:
    rng = random.Random(seed)
    recorder = Recorder()
    tree = PrefixTree(_split, needs_snapshots=snapshots)
    mirror = BlockMirror(recorder, BLOCK)  # type: ignore[arg-type]
    tree.watchers.append(mirror)
    histories: list[list[int]] = [[rng.randrange(5) for _ in range(rng.randrange(1, 9))]]
    for step in range(300):
        action = rng.random()
        if action < 0.6:
            base = rng.choice(histories)
            cut = rng.randrange(len(base) + 1)
            tokens = base[:cut] + [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
            histories.append(tokens)
            snapshot = (lambda: ("state", 1)) if snapshots else None
            tree.insert(
                np.array(tokens), lambda start, stop: ((start, stop), stop - start), snapshot
            )
        elif action < 0.95:
            tree.evict_entries(max(0, len(tree.nodes) - rng.randrange(1, 4)))
        else:
            tree.clear()
        assert recorder.live == expected_blocks(tree), f"step {step}"
    assert {"stored", "removed", "cleared"} <= set(recorder.events)


def test_a_tree_closed_for_good_clears_its_blocks() -> None:
    recorder = Recorder()
    tree = PrefixTree(_split, needs_snapshots=False)
    mirror = BlockMirror(recorder, BLOCK)  # type: ignore[arg-type]
    tree.watchers.append(mirror)
    tree.insert(np.arange(10), lambda start, stop: ((start, stop), stop - start))
    assert len(recorder.live) == 2
    mirror.cleared()
    assert recorder.live == {} and mirror.blocks == {}


def test_the_hook_attaches_a_mirror_that_sees_the_engines_stores(tiny_qwen3: Any) -> None:
    """``mlxcore_prefix_cache_watcher``: the kv-events plugin's mirror, attached to the
    engine's radix cache through the real hook, holds a finished request's blocks."""
    from mlxcore.engine.request import GenerationRequest
    from mlxcore.testing.runtime import make_runtime, submit_together
    from mlxcore.testing.server import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    rt = make_runtime(tiny_qwen3, "kv-events", plugin_options={"kv_events_endpoint": address})
    try:
        prompt = list(range(100, 140))
        submit_together(rt, [GenerationRequest(prompt, 4)])
        from mlxcore_kv_events import _publishers

        mirrors = _publishers[address].mirrors
        assert len(mirrors) == 1
        mirror = mirrors[0]
        held = sorted(mirror.held(), key=lambda b: b.end)
        assert [t for b in held[:2] for t in b.tokens] == prompt[:32]
    finally:
        rt.engine.shutdown()
    assert mirror not in _publishers[address].mirrors and not mirror.blocks  # cleared
