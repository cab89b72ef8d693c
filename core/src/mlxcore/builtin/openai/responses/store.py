"""Server-side conversation state for the Responses API, bounded in bytes and time.

Each stored response keeps its own input items, its output items and the id of the
response it continued; a conversation is the chain of those links, so a long chain
costs each turn once. The store is an LRU bounded by the JSON size of what it holds
(``--responses-store-size``) and by time since last use (``--responses-ttl``); resolving a chain
touches every link, so a conversation in use is not evicted from the middle.
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


class ResponseStore:
    """An LRU of :class:`StoredResponse` bounded by bytes and age (thread-safe)."""

    def __init__(
        self, max_bytes: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes, self.ttl, self._clock = max_bytes, ttl, clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes held (JSON size of the stored items and responses)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        output_items: list[dict[str, Any]],
        previous_id: str | None,
    ) -> bool:
        """Store a finished response; ``False`` when it alone is larger than the budget."""
        size = item_size(response) + item_size(input_items) + item_size(output_items)
        if size > self.max_bytes:
            return False
        entry = StoredResponse(
            response, input_items, output_items, previous_id, self._clock(), size
        )
        with self._lock:
            self._drop(response["id"])
            self._entries[response["id"]] = entry
            self._bytes += size
            self._expire()
            while self._bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response (touched), or a 404 in OpenAI's shape."""
        with self._lock:
            self._expire()
            entry = self._entries.get(response_id)
            if entry is None:
                raise not_found(response_id, param)
            self._entries.move_to_end(response_id)
            entry.used_at = self._clock()
            return entry

    def delete(self, response_id: str) -> None:
        """Forget a response (404 when unknown)."""
        with self._lock:
            if response_id not in self._entries:
                raise not_found(response_id)
            self._drop(response_id)

    def conversation(self, response_id: str, param: str) -> list[dict[str, Any]]:
        """Every item of the conversation up to and including ``response_id``'s output,
        oldest first (404 naming ``param`` when a link is missing)."""
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current is not None and current not in seen:
            seen.add(current)
            entry = self.get(current, param)
            chain.append(entry)
            current = entry.previous_id
        items: list[dict[str, Any]] = []
        for entry in reversed(chain):
            items.extend(entry.input_items)
            items.extend(entry.output_items)
        return items

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size

    def _expire(self) -> None:
        if self.ttl <= 0:
            return
        limit = self._clock() - self.ttl
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.used_at >= limit:
                break
            self._drop(oldest_id)
