"""Server-side conversation state for the Responses API, bounded in bytes and time, and
owned.

Each stored response keeps its own input items, its output items and the id of the
response it continued; a conversation is the chain of those links, so a long chain
costs each turn once. The store is an LRU bounded by the JSON size of what it holds
(``--responses-store-size``) and by time since last use (``--responses-ttl``); resolving a chain
touches every link, so a conversation in use is not evicted from the middle.

Every response has an owner, the API key that stored it (:mod:`mlxcore.server.tenants`;
``None`` without keys), and is filed under ``(owner, id)``: another key's id is not
found, with the 404 of an unknown id. The budget is shared fairly: a key that stores
past its own cap (the keys file's ``max_stored_bytes``) evicts its own oldest responses,
and when the whole store is full the key holding the most bytes gives up its least
recently used one, so one key's flood evicts that key's conversations, never another's
that holds less.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from mlxcore.builtin.openai.responses.items import item_size
from mlxcore.server.errors import APIError


@attrs.define
class StoredResponse:
    """One response: its object, the items it was given and produced, its parent."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    output_items: list[dict[str, Any]]
    previous_id: str | None
    used_at: float
    size: int = 0


def not_found(response_id: str, param: str | None = None) -> APIError:
    """The 404 OpenAI gives for an unknown response id."""
    return APIError(
        404,
        f"no response with id {response_id!r} is stored on this server (it was never "
        "stored, was deleted, or expired)",
        param=param,
        code="response_not_found",
    )


Owner = str | None
Key = tuple[Owner, str]


class ResponseStore:
    """An LRU of :class:`StoredResponse` bounded by bytes and age, filed by owner
    (thread-safe).

    Args:
        max_bytes: the budget of the whole store.
        ttl: seconds unused before a response is forgotten (0: no limit).
        clock: the time source.
        cap: an owner's own byte cap (``None``: only the whole budget bounds it).
    """

    def __init__(
        self,
        max_bytes: int,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        cap: Callable[[Owner], int | None] = lambda owner: None,
    ) -> None:
        self.max_bytes, self.ttl, self._clock, self._cap = max_bytes, ttl, clock, cap
        self._entries: OrderedDict[Key, StoredResponse] = OrderedDict()
        """Every response, least recently used first."""
        self._owned: dict[Owner, OrderedDict[Key, None]] = {}
        """Each owner's responses in the same order."""
        self._owner_bytes: dict[Owner, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes held (JSON size of the stored items and responses)."""
        return self._bytes

    def owner_bytes(self, owner: Owner) -> int:
        """Bytes ``owner``'s responses hold."""
        return self._owner_bytes.get(owner, 0)

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        previous_id: str | None,
        owner: Owner = None,
    ) -> bool:
        """Store a finished response for ``owner``; ``False`` when it alone is larger
        than the budget or the owner's cap."""
        size = item_size(response) + item_size(input_items) + item_size(output_items)
        cap = self._cap(owner)
        limit = self.max_bytes if cap is None else min(cap, self.max_bytes)
        if size > limit:
            return False
        entry = StoredResponse(
            response, input_items, output_items, previous_id, self._clock(), size
        )
        key = (owner, response["id"])
        with self._lock:
            self._drop(key)
            self._expire()
            mine = self._owned.get(owner)
            while mine and self.owner_bytes(owner) + size > limit:
                self._drop(next(iter(mine)))  # over its own cap: its own oldest first
            self._entries[key] = entry
            self._owned.setdefault(owner, OrderedDict())[key] = None
            self._owner_bytes[owner] = self.owner_bytes(owner) + size
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(self._victim(key))
        return True

    def _victim(self, keep: Key) -> Key:
        """The response to evict from a full store: the least recently used of the owner
        holding the most bytes (never ``keep``, the one being stored)."""
        for owner in sorted(self._owned, key=self.owner_bytes, reverse=True):
            for key in self._owned[owner]:
                if key != keep:
                    return key
        return keep

    def get(
        self, response_id: str, param: str | None = None, owner: Owner = None
    ) -> StoredResponse:
        """``owner``'s stored response (touched), or a 404 in OpenAI's shape."""
        key = (owner, response_id)
        with self._lock:
            self._expire()
            entry = self._entries.get(key)
            if entry is None:
                raise not_found(response_id, param)
            self._entries.move_to_end(key)
            self._owned[owner].move_to_end(key)
            entry.used_at = self._clock()
            return entry

    def delete(self, response_id: str, owner: Owner = None) -> None:
        """Forget ``owner``'s response (404 when it has none of this id)."""
        key = (owner, response_id)
        with self._lock:
            if key not in self._entries:
                raise not_found(response_id)
            self._drop(key)

    def conversation(
        self, response_id: str, param: str, owner: Owner = None
    ) -> list[dict[str, Any]]:
        """Every item of ``owner``'s conversation up to and including ``response_id``'s
        output, oldest first (404 naming ``param`` when a link is missing)."""
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current is not None and current not in seen:
            seen.add(current)
            entry = self.get(current, param, owner)
            chain.append(entry)
            current = entry.previous_id
        items: list[dict[str, Any]] = []
        for entry in reversed(chain):
            items.extend(entry.input_items)
            items.extend(entry.output_items)
        return items

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._bytes -= entry.size
        owner = key[0]
        mine = self._owned[owner]
        del mine[key]
        self._owner_bytes[owner] -= entry.size
        if not mine:
            del self._owned[owner], self._owner_bytes[owner]

    def _expire(self) -> None:
        if self.ttl <= 0:
            return
        limit = self._clock() - self.ttl
        while self._entries:
            oldest_key, oldest = next(iter(self._entries.items()))
            if oldest.used_at >= limit:
                break
            self._drop(oldest_key)
