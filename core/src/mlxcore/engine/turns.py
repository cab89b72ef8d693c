"""Taking turns across tenants: the order a queue is served in when several API keys
share it (admission's waiting requests, the batch loop's pending prefills).

Each tenant's first item in the queue, in the order of their first arrivals, then each
tenant's second, and so on; a tenant's own items keep their order. With one tenant (or
none: a server without keys) the order is the queue's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def newcomer_waits(waiting: Iterable[str | None], admitted: Iterable[str | None]) -> bool:
    """Whether a key with nothing ``admitted`` has a request ``waiting`` (tenants; ``None``
    is a server without keys, never a newcomer)."""
    return bool(set(waiting) - {None} - set(admitted))


def take_turns(items: Sequence[T], tenant_of: Callable[[T], str | None]) -> list[T]:
    """``items`` (in arrival order) in turns across their tenants (see the module
    docstring)."""
    turn: dict[str | None, int] = {}
    keyed = []
    for index, item in enumerate(items):
        tenant = tenant_of(item)
        keyed.append((turn.get(tenant, 0), index, item))
        turn[tenant] = turn.get(tenant, 0) + 1
    if len(turn) < 2:
        return list(items)
    keyed.sort(key=lambda entry: entry[:2])
    return [entry[2] for entry in keyed]
