"""A slower tier behind the prefix tree (the ``disk-cache`` plugin's files) as KV blocks
under a medium of its own.

vllm-router keeps each worker's blocks per medium and credits a prefix by the best
medium holding it: ``GPU`` fully, ``CPU`` / ``HOST`` at ``--kv-penalty-host`` (0.8 by
default), ``DISK`` at ``--kv-penalty-disk`` (0.3), found by running vllm-router 0.1.17.
So a replica that holds a session only on disk (evicted from memory, or restarted) still
draws the session's next turn before a replica that holds nothing of it.

The tier is read, not told: every :data:`~mlxcore_kv_events.publisher.TIER_POLL_SECONDS`
the publisher's thread asks :class:`TierMirror` to compare the tier's entries with what
it announced. An entry is a token sequence from the prompt's start; entries share their
prefixes' blocks, so each block is counted, announced when its first entry appears and
removed when its last goes (counted across every mirror of the medium, so the mirror of
a restarted engine's strategy and the one it replaces share them). Since a block's hash
covers its whole prefix, the blocks an entry adds (or leaves behind) are always a run at
its end: one event each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mlxcore_kv_events.blocks import Block, announced, chain_of

if TYPE_CHECKING:
    from mlxcore.engine.prefix_tree import TierEntries
    from mlxcore_kv_events.publisher import EventPublisher


class TierMirror:
    """The blocks of one slower tier (see the module docstring)."""

    def __init__(
        self, publisher: EventPublisher, block_size: int, medium: str, entries: TierEntries
    ) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.medium = medium
        self.entries = entries
        self.tokens: dict[str, Sequence[int]] = {}
        """Entry key -> its tokens (the tier's own array, not a copy), for what was
        announced."""
        self.hashes: dict[str, list[int]] = {}
        """Entry key -> its blocks' hashes (hashed once, when the entry appears)."""
        self.count = publisher.tier_counts(medium)
        """Block hash -> how many announced entries hold it, shared by every mirror of
        this medium: after an engine restart the new strategy's mirror announces the
        same files while the old one's leaves, and a block stays announced throughout."""

    def holds(self) -> bool:
        """Whether this mirror announced any block."""
        return any(self.hashes.values())

    def chains(self) -> list[list[Block]]:
        """Every announced block once, as runs: each entry's blocks not in an earlier
        entry (call under the publisher's lock; nothing is hashed again)."""
        size = self.block_size
        seen: set[int] = set()
        out = []
        for key, hashes in self.hashes.items():
            tokens = self.tokens[key]
            run = []
            for i, digest in enumerate(hashes):
                if digest in seen:
                    continue
                seen.add(digest)
                parent = hashes[i - 1] if i else None
                block_tokens = tuple(int(t) for t in tokens[i * size : (i + 1) * size])
                run.append(Block(digest, parent, (i + 1) * size, block_tokens))
            if run:
                out.append(run)
        return out

    def poll(self) -> None:
        """Announce what the tier gained and lost since the last poll; a tier closed
        for good takes its blocks away. New entries are hashed before the publisher's
        lock is taken (the engine threads take it for every radix-tree change)."""
        now = self.entries()
        fresh = {
            key: chain_of(tokens, self.block_size)
            for key, tokens in (now or {}).items()
            if key not in self.tokens and announced(tokens)
        }
        with self.publisher.lock:
            if now is None:
                for key in list(self.tokens):
                    self._remove(key)
                self.publisher.detach(self)
                return
            for key, chain in fresh.items():  # gains first: an entry replaced by a
                if key not in self.tokens:  # longer one keeps its blocks announced
                    self._add(key, now[key], chain)
            for key in [k for k in self.tokens if k not in now]:
                self._remove(key)

    def _add(self, key: str, tokens: Sequence[int], chain: list[Block]) -> None:
        new = [b for b in chain if b.hash not in self.count]
        for block in chain:
            self.count[block.hash] = self.count.get(block.hash, 0) + 1
        self.tokens[key] = tokens
        self.hashes[key] = [b.hash for b in chain]
        if new:
            self.publisher.stored(new, self.block_size, self.medium)

    def _remove(self, key: str) -> None:
        del self.tokens[key]
        gone = []
        for digest in self.hashes.pop(key):
            left = self.count.get(digest, 0) - 1
            if left > 0:
                self.count[digest] = left
            else:
                self.count.pop(digest, None)
                gone.append(digest)
        if gone:
            self.publisher.removed(gone, self.medium)
