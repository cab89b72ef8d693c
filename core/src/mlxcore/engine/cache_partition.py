"""Prefix-cache partitions: whose cached prefixes a request may reuse.

A server shared by several API keys must not let one key's prompt be a cache hit for
another's (the hit, and the time it saves, tell the second key what the first one sent):
vLLM closes that channel with the per-request ``cache_salt``, hashed into the first
block. mlxcore keys every prefix-cache structure (the radix tree, the LRU of whole
entries, the disk tier's files, in-flight prefix sharing, a draft model's prefix store)
by a request's *cache tokens*; a request in a partition has its first two cache tokens
replaced by two ids derived from the partition and from the tokens they stand for
(:func:`partition_tokens`). Negative, so no token id equals one; 31 bits each, so two
partitions meet only if 62 bits of a hash agree (no offline search finds a salt that
lands in another key's partition); within int32, so the disk tier stores them. A first
id already outside int32 (a LoRA adapter's marker, which must never reach the disk
because adapter keys restart with the process) stays outside it.

The partition itself is a string the server makes from the API key's cache group and
the request's ``cache_salt`` (:mod:`mlxcore.server.tenants`); the engine only hashes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

INT32_MIN = -(2**31)
INT32_LIMIT = 2**31

MARKED_POSITIONS = 2
"""How many leading cache tokens a partition replaces."""

_WIDE_BASE = -(1 << 61)
"""Start of the range for a first marker that must stay outside int32 (the adapters'
markers start at ``-(1 << 62)``, the media keys use 60 bits)."""


def _storable(token: int) -> bool:
    return INT32_MIN <= token < INT32_LIMIT


def partition_markers(partition: str, first: Sequence[int]) -> tuple[int, ...]:
    """The ids that stand for ``first`` (a prompt's first cache tokens, at most
    :data:`MARKED_POSITIONS`) in ``partition``."""
    head = tuple(int(t) for t in first[:MARKED_POSITIONS])
    digest = hashlib.blake2b(
        repr((partition, head)).encode("utf-8", "surrogatepass"),
        digest_size=16,
        person=b"mlxcore-partn",
    ).digest()
    markers = []
    for i, token in enumerate(head):
        bits = int.from_bytes(digest[4 * i : 4 * i + 4], "little") & 0x7FFFFFFF
        if _storable(token):
            markers.append(-1 - bits)  # in [-2**31, -1]
        else:
            wide = int.from_bytes(digest[8:15], "little")
            markers.append(_WIDE_BASE - wide)
    return tuple(markers)


def partition_tokens(tokens: tuple[int, ...], partition: str | None) -> tuple[int, ...]:
    """``tokens`` as the prefix cache keys them in ``partition`` (unchanged for ``None``:
    the shared partition of a server without keys)."""
    if partition is None or not tokens:
        return tokens
    markers = partition_markers(partition, tokens[:MARKED_POSITIONS])
    return markers + tokens[len(markers) :]


def partition_name(scope: str | None, salt: str | None) -> str | None:
    """The partition of a request: its API key's cache ``scope`` (the key's cache group,
    or the key itself) and its ``cache_salt``; ``None`` when it has neither."""
    if scope is None and salt is None:
        return None
    return repr((scope, salt))
