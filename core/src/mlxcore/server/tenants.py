"""Tenants: what each API key owns, may see and shares (docs/security.md).

On a server with API keys every key is a tenant, named by the key's name. The one rule
of this module: **every stored thing has an owner**, the tenant of the request that
made it, and a store files each record under ``(owner, id)`` (:func:`owned`) so that
another key's id is found nowhere: its 404 is the very 404 of an unknown id. On a
server without keys the owner is ``None`` for everyone, which keeps one tenant.

A background task that works for a tenant (the batch runner) sends its in-process
requests *on behalf of* the record's owner (:func:`on_behalf_of_header`): they are that
key's requests in every respect (ownership, cache partition, limits, fairness).

The prefix cache is partitioned the same way: a request's cache scope is its key's
cache group, else the key itself (:meth:`~mlxcore.server.keys.ApiKey.cache_scope`), and
its ``cache_salt`` partitions further (:mod:`mlxcore.engine.cache_partition`).
"""

from __future__ import annotations

from mlxcore.server.keys import ApiKey, current_key

Owner = str | None
"""A tenant: an API key's name, or ``None`` on a server without keys."""

ON_BEHALF_HEADER = "x-mlxcore-on-behalf-of"
"""The header an in-process request names its tenant in (honoured only beside the
app's in-process secret, :mod:`mlxcore.server.internal`)."""


def current_owner() -> Owner:
    """The tenant of the request being served: the owner of what it stores, the only
    one whose records it finds."""
    key = current_key.get()
    return key.name if key is not None else None


def owned(record_id: str) -> tuple[Owner, str]:
    """The key a store files ``record_id`` under for the current request's tenant (and
    finds it by: another tenant's key for the same id is another key)."""
    return (current_owner(), record_id)


def cache_scope(key: ApiKey | None = None) -> str | None:
    """Whose prefix cache a request uses: ``key``'s (default: the current request's)
    cache scope, ``None`` without keys (one shared cache)."""
    key = current_key.get() if key is None else key
    return key.cache_scope if key is not None else None


def on_behalf_of_header(owner: Owner) -> dict[str, str]:
    """Headers that make an in-process request one of ``owner``'s (none for ``None``)."""
    return {ON_BEHALF_HEADER: owner} if owner is not None else {}
