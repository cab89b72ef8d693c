"""A radix tree of token runs: the one structure behind prefix reuse.

Every stored prompt is a path from the root; entries that share a prefix share its
nodes (SGLang's RadixAttention). Each node holds the state of its own tokens (an
opaque *segment*: the attention keys and values of those tokens) and, optionally, a
*snapshot* taken after its last token (the fixed-size recurrent state of a hybrid
model, which cannot be cut back; SGLang's Mamba radix cache keeps the same pair). A
prompt resumes from the deepest point its path shares with the tree; when the model
needs snapshots, from the deepest snapshot on that path.

Memory is counted per node, and eviction is least recently used over *units*: a leaf
(its segment and snapshot) or the snapshot of an inner node. A logical clock orders
them, so two trees fed the same operations evict the same units (distributed ranks
rely on it). In a tree that needs snapshots, a leaf left without one is useless and is
removed with its parent's eviction.

With ``protect_reused`` (a segmented LRU), units that a later request resumed from
(:meth:`PrefixTree.touch` with ``reused``: a conversation's history, a shared system
prompt) are evicted after those no request came back to (a side request's own leaf, a
one-off prompt, a turn's generated tail that the next turn re-rendered), as long as the
reused ones hold at most :data:`PROTECTED_SHARE` of the bytes the eviction leaves;
beyond that the least recently used of them (sessions idle longest) lose their place,
the end of a path before its beginning. So a burst of one-off requests cannot push a
live session's history out, and a session too long for the budget keeps its longest
prefix. Distributed ranks evict by plain LRU (``protect_reused=False``): their
evictions must agree, and the protected set depends on when a rank evicts.

The tree knows nothing about MLX: segments are split with the ``split`` function given
to it, and sizes are passed in. :mod:`mlxcore.engine.cache_segments` supplies both for
real caches.

A :class:`TreeWatcher` hears of every change to the tokens the tree holds (a new leaf, a
split, a removed node, everything cleared), under the same lock as the change: a plugin
mirrors the tree's contents from it (the ``kv-events`` plugin publishes them to a
router as vLLM's KV events). A watcher that is also a :class:`TierWatcher` is told of a
slower tier behind the tree (the ``disk-cache`` plugin's files), which it reads itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

Split = Callable[[Any, int], tuple[Any, Any]]
"""``split(segment, at)`` -> the segment's first ``at`` tokens and the rest."""

PROTECTED_SHARE = 0.8
"""The most of the bytes an eviction leaves that reused units may keep ahead of the
others (see the module docstring)."""

UnitKey = tuple[int, int, int, int, "Node"]
"""An eviction unit's order: (protected, last used, inner snapshot after leaf, serial)."""


class TreeWatcher(Protocol):
    """Told of every change to the tokens a :class:`PrefixTree` holds (see the module
    docstring). Called on the thread that changes the tree, under its lock: keep it short
    and never call back into the tree."""

    def stored(self, node: Node) -> None:
        """``node`` is a new leaf: its tokens, after its parent's, were not held before."""

    def split(self, upper: Node, lower: Node) -> None:
        """``lower`` was cut: its first tokens are now the new node ``upper`` (its parent);
        the tokens the tree holds are unchanged."""

    def removed(self, node: Node) -> None:
        """The leaf ``node`` is about to go (its tokens and path are still readable)."""

    def cleared(self) -> None:
        """Everything is gone (or the tree is closed for good)."""


TierEntries = Callable[[], Mapping[str, Sequence[int]] | None]
"""What a slower tier holds now: entry key (stable for the entry's life) -> its tokens
from the prompt's start; None once the tier is closed for good. Cheap, any thread."""


@runtime_checkable
class TierWatcher(Protocol):
    """A :class:`TreeWatcher` that also follows a slower tier behind the tree."""

    def watch_tier(self, medium: str, entries: TierEntries) -> None:
        """The tier ``medium`` (vLLM's medium name, e.g. ``"DISK"``) holds what
        ``entries()`` returns; the watcher reads it when it likes."""


class Node:
    """A run of tokens and its state (see the module docstring)."""

    __slots__ = (
        "children",
        "last_used",
        "parent",
        "reused",
        "segment",
        "segment_bytes",
        "serial",
        "snapshot",
        "snapshot_bytes",
        "start",
        "tokens",
    )

    def __init__(self, parent: Node | None, tokens: np.ndarray, start: int, serial: int) -> None:
        self.parent = parent
        self.tokens = tokens
        self.start = start
        self.serial = serial
        self.children: dict[int, Node] = {}
        self.segment: Any = None
        self.segment_bytes = 0
        self.snapshot: Any = None
        self.snapshot_bytes = 0
        self.last_used = 0
        self.reused = False
        """A lookup after this node was stored resumed from it or below it."""

    @property
    def end(self) -> int:
        """The position after the node's last token (its depth in the tree)."""
        return self.start + int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes the node holds."""
        return self.segment_bytes + self.snapshot_bytes

    def path(self) -> list[Node]:
        """The nodes from the root's first child down to this one."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def path_tokens(self) -> np.ndarray:
        """Every token from the root to this node's end."""
        parts = [n.tokens for n in self.path()]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@attrs.frozen
class PathMatch:
    """Where a prompt meets the tree.

    Attributes:
        nodes: the nodes the prompt runs through, the last one possibly only partly.
        shared: how many leading tokens of the prompt the tree holds.
    """

    nodes: list[Node]
    shared: int

    def deepest_snapshot(self, limit: int) -> Node | None:
        """The deepest node on the path with a snapshot, wholly shared, ending at or
        before ``limit``."""
        for node in reversed(self.nodes):
            if node.snapshot is not None and node.end <= min(limit, self.shared):
                return node
        return None

    @property
    def last(self) -> Node | None:
        """The deepest node the prompt reaches."""
        return self.nodes[-1] if self.nodes else None


def _shared_run(edge: np.ndarray, tokens: np.ndarray, at: int) -> int:
    """How many leading tokens of ``edge`` equal ``tokens[at:]``."""
    n = min(edge.shape[0], tokens.shape[0] - at)
    differ = np.flatnonzero(edge[:n] != tokens[at : at + n])
    return int(differ[0]) if differ.size else n


class PrefixTree:
    """The tree; see the module docstring.

    Args:
        split: splits a segment (see :data:`Split`).
        needs_snapshots: the state is usable only at snapshots (hybrid models).
        on_evict: called with each leaf before it is removed (its tokens are still there).
        protect_reused: evict reused units after the others (see the module docstring).
        size: a segment's bytes, to account for a split's two halves exactly (a split
            costs more than the whole when each half carries a fixed cost); without it
            the bytes are shared in proportion to the tokens.
    """

    def __init__(
        self,
        split: Split,
        *,
        needs_snapshots: bool,
        on_evict: Callable[[Node], None] | None = None,
        size: Callable[[Any], int] | None = None,
        protect_reused: bool = True,
    ) -> None:
        self.split = split
        self.protect_reused = protect_reused
        self.size = size
        self.needs_snapshots = needs_snapshots
        self.on_evict = on_evict
        self.root = Node(None, np.zeros(0, dtype=np.int64), 0, 0)
        self._serial = 0
        self.clock = 0
        self.nbytes = 0
        self.nodes: dict[int, Node] = {}
        self.snapshots = 0
        self.watchers: list[TreeWatcher] = []
        """Told of every change (:class:`TreeWatcher`)."""

    # -- reading -------------------------------------------------------------------

    @property
    def entries(self) -> int:
        """Evictable units held: nodes plus snapshots."""
        return len(self.nodes) + self.snapshots

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self.nodes.values()))

    def match(self, tokens: np.ndarray) -> PathMatch:
        """Where ``tokens`` meets the tree."""
        nodes: list[Node] = []
        node, at = self.root, 0
        while at < tokens.shape[0]:
            child = node.children.get(int(tokens[at]))
            if child is None:
                break
            run = _shared_run(child.tokens, tokens, at)
            nodes.append(child)
            at += run
            if run < child.tokens.shape[0]:
                break
            node = child
        return PathMatch(nodes, at)

    def touch(self, nodes: list[Node], *, reused: bool = False) -> None:
        """Mark ``nodes`` (and their ancestors) as used now; ``reused``: by a request
        that resumes from them (not the one that stored them)."""
        self.clock += 1
        for node in nodes:
            up: Node | None = node
            while up is not None and (up.last_used != self.clock or (reused and not up.reused)):
                up.last_used = self.clock
                up.reused = up.reused or reused
                up = up.parent

    # -- writing -------------------------------------------------------------------

    def insert(
        self,
        tokens: np.ndarray,
        segment_for: Callable[[int, int], tuple[Any, int]],
        snapshot_for: Callable[[], tuple[Any, int]] | None = None,
    ) -> Node | None:
        """Make ``tokens`` a path of the tree ending at a node; returns that node.

        ``segment_for(start, stop)`` gives the segment of tokens ``[start, stop)`` and
        its size, for the part the tree does not hold yet; ``snapshot_for()`` gives the
        snapshot (state, size) to keep at the path's end, asked only when no snapshot is
        there already.
        """
        if tokens.shape[0] == 0:
            return None
        found = self.match(tokens)
        last = found.last
        if last is not None and found.shared < last.end:
            last = self._split(last, found.shared - last.start)
        parent = last if last is not None else self.root
        if found.shared < tokens.shape[0]:
            segment, nbytes = segment_for(found.shared, int(tokens.shape[0]))
            node = self._new(parent, np.array(tokens[found.shared :], dtype=np.int64))
            node.segment, node.segment_bytes = segment, nbytes
            self.nbytes += nbytes
            for watcher in self.watchers:
                watcher.stored(node)
            parent = node
        if snapshot_for is not None and parent.snapshot is None:
            parent.snapshot, parent.snapshot_bytes = snapshot_for()
            self.nbytes += parent.snapshot_bytes
            self.snapshots += 1
        self.touch([parent])
        return parent

    def _new(self, parent: Node, tokens: np.ndarray) -> Node:
        self._serial += 1
        node = Node(parent, tokens, parent.end, self._serial)
        parent.children[int(tokens[0])] = node
        self.nodes[node.serial] = node
        return node

    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node`` after its first ``at`` tokens; returns the new upper part."""
        assert node.parent is not None and 0 < at < node.tokens.shape[0]
        head_seg, tail_seg = self.split(node.segment, at)
        if self.size is not None:
            head_bytes, tail_bytes = self.size(head_seg), self.size(tail_seg)
        else:
            head_bytes = node.segment_bytes * at // node.tokens.shape[0]
            tail_bytes = node.segment_bytes - head_bytes
        self.nbytes += head_bytes + tail_bytes - node.segment_bytes
        upper = self._new(node.parent, node.tokens[:at].copy())
        upper.segment, upper.segment_bytes = head_seg, head_bytes
        upper.last_used, upper.reused = node.last_used, node.reused
        node.tokens = node.tokens[at:].copy()
        node.start += at
        node.segment, node.segment_bytes = tail_seg, tail_bytes
        node.parent = upper
        upper.children[int(node.tokens[0])] = node
        for watcher in self.watchers:
            watcher.split(upper, node)
        return upper

    # -- eviction --------------------------------------------------------------------

    def _protected(self, keep_bytes: int | None) -> set[int]:
        """Serials of the reused nodes that keep their place: the most recently used
        first (a path's beginning before its end) while they hold at most
        :data:`PROTECTED_SHARE` of ``keep_bytes``."""
        if not self.protect_reused or not keep_bytes:
            return set()
        reused = sorted(
            (n for n in self.nodes.values() if n.reused),
            key=lambda n: (-n.last_used, n.start, n.serial),
        )
        room, held, out = int(keep_bytes * PROTECTED_SHARE), 0, set()
        for node in reused:
            held += node.nbytes
            if held > room:
                break
            out.add(node.serial)
        return out

    def evict(self, done: Callable[[], bool], keep_bytes: int | None = None) -> int:
        """Evict units until ``done()``; returns how many. Least recently used first; on
        a tie a leaf before an inner snapshot (a path is touched as a whole, and its end
        is the most specific part of it); reused units after the others while they hold
        at most :data:`PROTECTED_SHARE` of ``keep_bytes`` (the bytes the eviction aims
        to leave; None: plain LRU)."""
        protected = self._protected(keep_bytes)

        def unit(node: Node) -> UnitKey:
            kept = 1 if node.serial in protected else 0
            return (kept, node.last_used, 1 if node.children else 0, node.serial, node)

        units = [
            unit(node)
            for node in self.nodes.values()
            if not node.children or node.snapshot is not None
        ]
        heapq.heapify(units)
        count = 0
        while units and not done():
            node = heapq.heappop(units)[-1]
            if node.serial not in self.nodes:
                continue
            if node.children:
                if node.snapshot is None:
                    continue
                self._drop_snapshot(node)
            else:
                parent = self._remove_leaf(node, logged=True)
                while (
                    self.needs_snapshots  # a leaf without a snapshot is of no use
                    and parent is not None
                    and not parent.children
                    and parent.snapshot is None
                ):
                    parent = self._remove_leaf(parent, logged=False)
                if parent is not None and not parent.children:
                    heapq.heappush(units, unit(parent))
            count += 1
        return count

    def evict_bytes(self, limit: int) -> int:
        """Evict until at most ``limit`` bytes are held."""
        return self.evict(lambda: self.nbytes <= limit, keep_bytes=max(0, limit))

    def evict_entries(self, limit: int) -> int:
        """Evict until at most ``limit`` units are held."""
        return self.evict(lambda: self.entries <= limit)

    def _drop_snapshot(self, node: Node) -> None:
        self.nbytes -= node.snapshot_bytes
        node.snapshot, node.snapshot_bytes = None, 0
        self.snapshots -= 1

    def _remove_leaf(self, node: Node, *, logged: bool) -> Node | None:
        if logged and self.on_evict is not None:
            self.on_evict(node)
        for watcher in self.watchers:
            watcher.removed(node)
        if node.snapshot is not None:
            self._drop_snapshot(node)
        self.nbytes -= node.segment_bytes
        parent = node.parent
        assert parent is not None
        del parent.children[int(node.tokens[0])]
        del self.nodes[node.serial]
        node.segment = None
        return parent if parent is not self.root else None

    def clear(self) -> None:
        """Drop everything."""
        self.root.children.clear()
        self.nodes.clear()
        self.nbytes = self.snapshots = 0
        for watcher in self.watchers:
            watcher.cleared()
