"""The prefix tree's contents as vLLM's KV blocks.

vLLM's KV events speak of *blocks*: runs of ``block_size`` tokens at multiples of it
from the prompt's start, each named by a hash chained to the block before it (so equal
tokens after different prefixes are different blocks). mlxcore's radix tree holds runs
of any length instead. :class:`BlockMirror` keeps, for every node of one model's tree,
the complete blocks that *end* inside it: a new leaf adds the blocks ending in its tokens
(the first may begin in its parent), a removed leaf takes them away, a split hands the
upper part's blocks to the new upper node. Tokens past the last complete block are not
announced, as vLLM announces only full blocks.

A block's hash is 63 bits of BLAKE2b over its parent's hash and its token ids: opaque to
the router, which anchors a block under its parent by this hash and finds the tree
position of a request's tokens by hashing the token ids itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

MEDIUM = "GPU"
"""The medium of blocks in memory: the tier a router credits fully (vLLM's name for the
accelerator's memory; on Apple silicon and on the CPU wheel the cache lives in the
memory the model computes from)."""

if TYPE_CHECKING:
    from mlxcore.engine.prefix_tree import Node, TierEntries
    from mlxcore_kv_events.publisher import EventPublisher


class Block(NamedTuple):
    """One complete block: its hash, its parent's (None for the first), where it ends in
    the prompt, and its token ids."""

    hash: int
    parent: int | None
    end: int
    tokens: tuple[int, ...]


def block_hash(parent: int | None, tokens: np.ndarray) -> int:
    """The chained hash of a block (see the module docstring)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update((parent or 0).to_bytes(8, "little"))
    digest.update(np.asarray(tokens, dtype="<u4").tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


def announced(tokens: Sequence[int] | np.ndarray) -> bool:
    """Whether a path whose first tokens are ``tokens`` is announced: not when it starts
    with a negative id, a cache partition's marker (an API key's or a ``cache_salt``'s,
    :mod:`mlxcore.engine.cache_partition`) or a LoRA adapter's. The router matches the
    token ids it renders for a request against the announced ones, so it would credit
    one key's blocks to another key's request; unannounced, it scores those requests by
    load and session affinity alone."""
    return len(tokens) == 0 or int(tokens[0]) >= 0


def chain_of(tokens: Sequence[int] | np.ndarray, block_size: int) -> list[Block]:
    """The complete blocks of a token sequence from the prompt's start, chained."""
    tokens = np.asarray(tokens)
    blocks: list[Block] = []
    parent: int | None = None
    for end in range(block_size, tokens.shape[0] + 1, block_size):
        run = tokens[end - block_size : end]
        digest = block_hash(parent, run)
        blocks.append(Block(digest, parent, end, tuple(map(int, run))))
        parent = digest
    return blocks


class BlockMirror:
    """One model's prefix tree as blocks (a :class:`~mlxcore.engine.prefix_tree.TreeWatcher`,
    and a :class:`~mlxcore.engine.prefix_tree.TierWatcher` for a disk tier behind it).

    Every change is handed to ``publisher`` as an event, under the publisher's lock, in
    the order the tree made it.
    """

    medium = MEDIUM

    def __init__(self, publisher: EventPublisher, block_size: int) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.blocks: dict[int, list[Block]] = {}
        """Node serial -> the blocks ending inside that node, in order."""

    def held(self) -> list[Block]:
        """Every block held (call under the publisher's lock)."""
        return [block for blocks in self.blocks.values() for block in blocks]

    def holds(self) -> bool:
        """Whether any block is held."""
        return any(self.blocks.values())

    def chains(self) -> list[list[Block]]:
        """The held blocks as chains, each block's parent before it in its chain or in
        a chain ending earlier (call under the publisher's lock)."""
        return [blocks for blocks in self.blocks.values() if blocks]

    def watch_tier(self, medium: str, entries: TierEntries) -> None:
        """A slower tier behind the tree: its blocks are announced under ``medium``."""
        from mlxcore_kv_events.tiers import TierMirror

        self.publisher.add(TierMirror(self.publisher, self.block_size, medium, entries))

    # -- the watcher -------------------------------------------------------------

    def stored(self, node: Node) -> None:
        size = self.block_size
        first, last = node.start // size, node.end // size
        if first >= last:
            return
        parent = self._hash_ending_at(node.parent, first * size) if first else None
        if first and parent is None:
            return  # the block before is not known: its position cannot be told
        tokens = np.concatenate(
            [_tail(node.parent, node.start - first * size), node.tokens[: last * size - node.start]]
        )
        if first == 0 and not announced(tokens):
            return  # nor are the blocks after it: their parent is not known
        blocks: list[Block] = []
        for index in range(last - first):
            run = tokens[index * size : (index + 1) * size]
            digest = block_hash(parent, run)
            blocks.append(Block(digest, parent, (first + index + 1) * size, tuple(map(int, run))))
            parent = digest
        with self.publisher.lock:
            self.blocks[node.serial] = blocks
            self.publisher.stored(blocks, size, self.medium)

    def split(self, upper: Node, lower: Node) -> None:
        with self.publisher.lock:
            blocks = self.blocks.pop(lower.serial, [])
            above = [b for b in blocks if b.end <= upper.end]
            below = blocks[len(above) :]
            if above:
                self.blocks[upper.serial] = above
            if below:
                self.blocks[lower.serial] = below

    def removed(self, node: Node) -> None:
        with self.publisher.lock:
            blocks = self.blocks.pop(node.serial, None)
            if blocks:
                self.publisher.removed([b.hash for b in blocks], self.medium)

    def cleared(self) -> None:
        with self.publisher.lock:
            hashes = [b.hash for b in self.held()]
            self.blocks.clear()
            self.publisher.cleared(self, hashes)

    # -- helpers -----------------------------------------------------------------

    def _hash_ending_at(self, node: Node | None, position: int) -> int | None:
        """The hash of the block ending at ``position`` on the path up from ``node``."""
        while node is not None and node.parent is not None:
            if node.start < position <= node.end:
                with self.publisher.lock:
                    for block in self.blocks.get(node.serial, ()):
                        if block.end == position:
                            return block.hash
                return None
            node = node.parent
        return None


def _tail(node: Node | None, count: int) -> np.ndarray:
    """The last ``count`` tokens of the path ending at ``node``."""
    parts: list[Any] = []
    while count > 0 and node is not None and node.parent is not None:
        take = node.tokens[-count:] if count < node.tokens.shape[0] else node.tokens
        parts.append(take)
        count -= int(take.shape[0])
        node = node.parent
    return np.concatenate(parts[::-1]) if parts else np.zeros(0, dtype=np.int64)
