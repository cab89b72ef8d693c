"""The block mirror against the radix tree it watches: after any mix of stores, splits,
evictions and clears, the blocks it has announced (and not taken back) are exactly the
complete blocks of the tree's paths, each chained to the block before it. The same for
a slower tier's mirror (the disk) under its own medium, entries appearing and going."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from mlxcore.engine.prefix_tree import PrefixTree
from mlxcore_kv_events.blocks import BlockMirror, block_hash

BLOCK = 4


Live = dict[int, tuple[int | None, tuple[int, ...]]]


class Recorder:
    """Stands in for the publisher's queue: applies the events to the live blocks of
    each medium (:attr:`live` is the memory's, ``GPU``)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.RLock()
        self.media: dict[str, Live] = {"GPU": {}}
        self.events: list[str] = []
        self.counts: dict[str, dict[int, int]] = {}

    @property
    def live(self) -> Live:
        return self.media["GPU"]

    def stored(self, blocks: list[Any], block_size: int, medium: str) -> None:
        assert block_size == BLOCK
        live = self.media.setdefault(medium, {})
        parent = blocks[0].parent
        assert parent is None or parent in live, "a chain must hang under a live block"
        for block in blocks:
            assert block.parent == parent and block.hash not in live, "stored twice"
            live[block.hash] = (block.parent, block.tokens)
            parent = block.hash
        self.events.append("stored")

    def removed(self, hashes: list[int], medium: str) -> None:
        for digest in hashes:
            del self.media[medium][digest]
        self.events.append("removed")

    def cleared(self, mirror: Any, hashes: list[int]) -> None:
        self.media[mirror.medium].clear()
        self.events.append("cleared")

    def tier_counts(self, medium: str) -> dict[int, int]:
        return self.counts.setdefault(medium, {})

    def detach(self, mirror: Any) -> None:
        self.events.append("detached")


def _split(segment: Any, at: int) -> tuple[Any, Any]:
    return (segment[0], segment[0] + at), (segment[0] + at, segment[1])


def expected_blocks(tree: PrefixTree) -> Live:
    """Every complete block of every path in the tree, recomputed from the tokens."""
    return blocks_of(node.path_tokens() for node in tree)


def blocks_of(sequences: Any) -> Live:
    """Every complete block of every token sequence, chained from its start."""
    out: Live = {}
    for tokens in sequences:
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


@pytest.mark.parametrize("seed", range(3))
def test_a_tier_mirror_announces_exactly_its_entries_blocks_under_its_medium(seed: int) -> None:
    """Entries sharing prefixes appear and go between polls; the DISK blocks announced
    (each once, a new run hung under a live block) are always those of the entries
    held, and the memory's are untouched; a tier closed for good takes them away."""
    from mlxcore_kv_events.tiers import TierMirror

    rng = random.Random(seed)
    recorder = Recorder()
    held: dict[str, list[int]] = {}
    closed = False
    tier = TierMirror(recorder, BLOCK, "DISK", lambda: None if closed else dict(held))  # type: ignore[arg-type]
    recorder.media["GPU"][7] = (None, (1, 2, 3, 4))  # a block in memory stays as it is
    histories: list[list[int]] = [[rng.randrange(4) for _ in range(6)]]
    for step in range(200):
        for _ in range(rng.randrange(4)):
            if rng.random() < 0.6 or not held:
                base = rng.choice(histories)
                tokens = base[: rng.randrange(len(base) + 1)]
                tokens += [rng.randrange(4) for _ in range(rng.randrange(1, 14))]
                histories.append(tokens)
                held[f"k{step}-{len(held)}"] = tokens
            else:
                del held[rng.choice(sorted(held))]
        tier.poll()
        assert recorder.media.get("DISK", {}) == blocks_of(held.values()), f"step {step}"
        again = Recorder()  # a resynchronisation: every block once, parents first
        for run in sorted(tier.chains(), key=lambda r: r[0].end):
            again.stored(run, BLOCK, "DISK")
        assert again.media.get("DISK", {}) == recorder.media.get("DISK", {})
    assert recorder.media["GPU"] == {7: (None, (1, 2, 3, 4))}
    closed = True
    tier.poll()
    assert recorder.media["DISK"] == {} and not tier.holds()
    assert recorder.events[-1] == "detached"


def test_a_restarted_engines_tier_mirror_takes_over_without_a_gap() -> None:
    """After an engine restart the new strategy's mirror reads the same files while the
    old one's strategy closes: the blocks stay announced, each once, until the last
    mirror holding them lets go."""
    from mlxcore_kv_events.tiers import TierMirror

    recorder = Recorder()
    files = {"a": list(range(12)), "b": [*range(8), 9, 9, 9, 9]}
    old_open, new_open = [True], [True]
    old = TierMirror(recorder, BLOCK, "DISK", lambda: dict(files) if old_open[0] else None)  # type: ignore[arg-type]
    new = TierMirror(recorder, BLOCK, "DISK", lambda: dict(files) if new_open[0] else None)  # type: ignore[arg-type]
    old.poll()
    new.poll()  # Recorder.stored refuses a block stored twice
    assert recorder.media["DISK"] == blocks_of(files.values())
    old_open[0] = False
    old.poll()
    assert recorder.media["DISK"] == blocks_of(files.values()) and new.holds()
    new_open[0] = False
    new.poll()
    assert recorder.media["DISK"] == {}


def test_the_disk_tier_is_announced_and_still_is_after_a_restart(
    tiny_qwen3: Any, tmp_path: Any
) -> None:
    """With the disk-cache plugin the engine's cache hands the mirror its disk tier: a
    finished request's blocks are announced under ``DISK`` too, and a server started
    again on the same folder announces them before it serves anything."""
    from mlxcore.engine.request import GenerationRequest
    from mlxcore.testing.runtime import make_runtime, submit_together
    from mlxcore.testing.server import free_port
    from mlxcore_kv_events import _publishers

    address = f"tcp://127.0.0.1:{free_port()}"
    options = {
        "kv_events_endpoint": address,
        "disk_cache_dir": str(tmp_path),
        "disk_cache_min_tokens": 16,
    }
    prompt = list(range(200, 240))

    def disk_blocks() -> list[tuple[int, ...]]:
        publisher = _publishers[address]
        publisher.poll_tiers()
        with publisher.lock:
            tiers = [m for m in publisher.mirrors if m.medium == "DISK"]
            assert len(tiers) == 1
            return sorted(b.tokens for run in tiers[0].chains() for b in run)

    rt = make_runtime(tiny_qwen3, "kv-events", "disk-cache", plugin_options=options)
    try:
        submit_together(rt, [GenerationRequest(prompt, 4)])
        assert rt.engine.cache.writer.flush(30)  # type: ignore[attr-defined]
        first = disk_blocks()
        assert tuple(prompt[:16]) in first and tuple(prompt[16:32]) in first
    finally:
        rt.engine.shutdown()
    _publishers[address].poll_tiers()  # the thread's next look: the tier is closed
    assert not any(m.medium == "DISK" for m in _publishers[address].mirrors)
    restarted = make_runtime(tiny_qwen3, "kv-events", "disk-cache", plugin_options=options)
    try:
        assert disk_blocks() == first  # known before any request
    finally:
        restarted.engine.shutdown()


@pytest.mark.parametrize("seed", range(3))
def test_partitioned_paths_are_never_announced(seed: int) -> None:
    """A path that starts with a cache partition's marker (an API key's or a salt's,
    negative ids) is not announced, nor is anything below it: the router would credit one
    key's blocks to another key's prompt. Unpartitioned paths still are, exactly."""
    rng = random.Random(seed)
    recorder = Recorder()
    tree = PrefixTree(_split, needs_snapshots=False)
    mirror = BlockMirror(recorder, BLOCK)  # type: ignore[arg-type]
    tree.watchers.append(mirror)
    markers = [-7, -1 - 2**30]
    for step in range(200):
        if rng.random() < 0.85:
            head = [rng.choice(markers), -3] if rng.random() < 0.5 else []
            tokens = head + [rng.randrange(5) for _ in range(rng.randrange(1, 14))]
            tree.insert(np.array(tokens), lambda start, stop: ((start, stop), stop - start))
        else:
            tree.evict_entries(max(0, len(tree.nodes) - rng.randrange(1, 4)))
        shared = [n.path_tokens() for n in tree if n.path_tokens()[0] >= 0]
        assert recorder.live == blocks_of(shared), f"step {step}"
        assert all(token >= 0 for _, run in recorder.live.values() for token in run)
