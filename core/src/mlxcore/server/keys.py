"""API keys: several of them, each a tenant with a role, a cache group and limits.

Keys come from ``--api-key`` (repeatable; admin keys without limits: one user, one key)
and ``--api-keys-file FILE``, a TOML file with one table per key (its fields:
:mod:`mlxcore.server.keys_file`). The file is read again on SIGHUP and on
``POST /admin/reload-keys`` (:meth:`KeyTable.reload`): a removed key is refused from its
next request on, a key kept by name keeps its counters.

A request must carry one of the keys (``Authorization: Bearer KEY`` or ``x-api-key``)
on every route but the open ones. A key over its limit gets a 429 in the API's own error
shape with ``Retry-After``: the seconds until the oldest request (or enough tokens) of
the last minute leaves the window. Requests are counted when they arrive, tokens when a
generation finishes (the key's identity travels with the request in a context variable),
so a key can go over its token limit by the requests already running; the next one waits.
Per-key counters are in ``/metrics`` under a hash of the key, never the key itself.
What each key owns and may see is :mod:`mlxcore.server.tenants`.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import hmac
import math
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from mlxcore.errors import UsageError
from mlxcore.server.keys_file import read_keys_file

WINDOW = 60.0
"""Seconds the limits are counted over."""

PRIORITY_LEVELS = {"high": -1, "normal": 0, "low": 1}
"""A key's ``priority`` as a request priority (vLLM's convention: lower starts first)."""

current_key: contextvars.ContextVar[ApiKey | None] = contextvars.ContextVar(
    "mlxcore_api_key", default=None
)
"""The key of the request being served (set by the authentication hook)."""


@attrs.define(eq=False)
class ApiKey:
    """One key, its limits and what it used in the last minute."""

    name: str
    secret: bytes
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    priority: str | None = None
    """``high``, ``normal`` or ``low``: its requests' default priority and the best they
    may ask for (``None``: they may ask for any)."""
    role: str = "user"
    """``admin``: may change what the server holds for everyone (load and unload models,
    adapters, pulls, the keys); ``user``: may not (403)."""
    cache_group: str | None = None
    """Keys of one group share their prefix cache; a key without one has its own."""
    max_concurrent: int | None = None
    """The most requests of this key running at once (one more: 429)."""
    max_stored_bytes: int | None = None
    """The most bytes of stored Responses API responses this key may hold."""
    max_file_bytes: int | None = None
    """The most bytes of files (the batch plugin's) this key may hold on disk."""
    running: int = 0
    """Requests of this key in flight (see :meth:`enter`)."""
    requests: collections.deque[float] = attrs.field(factory=collections.deque)
    tokens: collections.deque[tuple[float, int]] = attrs.field(factory=collections.deque)
    tokens_in_window: int = 0  # the sum of ``tokens``, kept as they come and go
    counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    @property
    def is_admin(self) -> bool:
        """Whether the key may use the administrative routes."""
        return self.role == "admin"

    @property
    def cache_scope(self) -> str:
        """Whose prefix cache the key's requests use: its group's, else its own."""
        return f"group:{self.cache_group}" if self.cache_group else f"key:{self.name}"

    def enter(self) -> bool:
        """Count a request starting; False (nothing counted) when the key already runs
        ``max_concurrent``."""
        with self._lock:
            if self.max_concurrent is not None and self.running >= self.max_concurrent:
                self.counts["limited"] += 1
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        """Count a request :meth:`enter` let in as finished."""
        with self._lock:
            self.running = max(0, self.running - 1)

    def update(self, other: ApiKey) -> None:
        """Take ``other``'s secret, role and limits (a keys file read again), keeping
        this key's counters and running requests."""
        with self._lock:
            for field in SETTINGS:
                setattr(self, field, getattr(other, field))

    @property
    def label(self) -> str:
        """What ``/metrics`` calls the key: a short hash of the secret."""
        return hashlib.sha256(self.secret).hexdigest()[:12]

    def admit(self, now: float) -> float:
        """Count a request arriving at ``now``; 0.0 when it may run, else the seconds to
        wait before a retry can (the request is then not counted)."""
        with self._lock:
            self._expire(now)
            wait = 0.0
            if self.requests_per_minute is not None and (
                len(self.requests) >= self.requests_per_minute
            ):
                wait = max(wait, self.requests[0] + WINDOW - now)
            if self.tokens_per_minute is not None:
                used = self.tokens_in_window
                if used >= self.tokens_per_minute and self.tokens:
                    wait = max(wait, self._tokens_free_at(used) - now)
            if wait > 0:
                self.counts["limited"] += 1
                return wait
            self.requests.append(now)
            self.counts["requests"] += 1
            return 0.0

    def charge(self, tokens: int, now: float) -> None:
        """Count ``tokens`` (prompt + completion) of a finished generation."""
        with self._lock:
            self.tokens.append((now, tokens))
            self.tokens_in_window += tokens
            self.counts["tokens"] += tokens

    def _expire(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - WINDOW:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW:
            self.tokens_in_window -= self.tokens.popleft()[1]

    def _tokens_free_at(self, used: int) -> float:
        """When enough of the window's tokens have left it to be under the limit."""
        assert self.tokens_per_minute is not None
        for stamp, count in self.tokens:
            used -= count
            if used < self.tokens_per_minute:
                return stamp + WINDOW
        return self.tokens[-1][0] + WINDOW


SETTINGS = (
    "secret",
    "requests_per_minute",
    "tokens_per_minute",
    "priority",
    "role",
    "cache_group",
    "max_concurrent",
    "max_stored_bytes",
    "max_file_bytes",
)
"""What a keys file sets for a key (:meth:`ApiKey.update`)."""


class KeyTable:
    """The server's keys (empty: no authentication). Looked up from any thread; the
    list is replaced whole when the keys file is read again."""

    def __init__(self, keys: Iterable[ApiKey], *, fixed: int = 0, path: Path | None = None):
        self.keys = list(keys)
        self.fixed = fixed
        """How many of :attr:`keys` (the first) come from ``--api-key`` and stay."""
        self.path = path
        """The keys file (``None``: none)."""
        self._reload = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.keys)

    @classmethod
    def from_config(cls, secrets: Iterable[str], keys_file: str | None) -> KeyTable:
        """``--api-key`` values (admin keys) and the ``--api-keys-file`` tables
        (UsageError if bad)."""
        keys = [ApiKey(f"key{i}", s.encode(), role="admin") for i, s in enumerate(secrets) if s]
        fixed = len(keys)
        path = Path(keys_file).expanduser() if keys_file else None
        if path is not None:
            keys += _from_file(path)
        _check_unique(keys)
        return cls(keys, fixed=fixed, path=path)

    def reload(self) -> tuple[list[str], list[str]]:
        """Read the keys file again (UsageError, keys unchanged, when it is bad): keys
        kept by name keep their counters and take the file's settings; returns the names
        added and removed."""
        if self.path is None:
            raise UsageError("this server has no --api-keys-file to read again")
        with self._reload:
            fresh = _from_file(self.path)
            fixed = self.keys[: self.fixed]
            _check_unique([*fixed, *fresh])
            old = {key.name: key for key in self.keys[self.fixed :]}
            kept = []
            for key in fresh:
                same = old.get(key.name)
                if same is not None:
                    same.update(key)
                    key = same
                kept.append(key)
            self.keys = [*fixed, *kept]
            names = {key.name for key in kept}
            added = sorted(names - set(old))
            removed = sorted(set(old) - names)
        return added, removed

    def find(self, token: str) -> ApiKey | None:
        """The key whose secret is ``token`` (compared in constant time), or None."""
        given = token.encode()
        found = None
        for key in self.keys:
            if hmac.compare_digest(given, key.secret):
                found = key
        return found

    def named(self, name: str) -> ApiKey | None:
        """The key called ``name``, or None (it was removed)."""
        return next((key for key in self.keys if key.name == name), None)

    def gauges(self) -> dict[str, dict[str, float]]:
        """Per-key counters for ``/metrics``: label -> counter name -> value."""
        return {
            key.label: {name: float(key.counts[name]) for name in ("requests", "limited", "tokens")}
            for key in self.keys
        }


def _check_unique(keys: list[ApiKey]) -> None:
    secrets: set[bytes] = set()
    names: set[str] = set()
    for key in keys:
        if key.secret in secrets:
            raise UsageError(f"API key {key.name!r} is given twice")
        if key.name in names:
            raise UsageError(f"two API keys are named {key.name!r}")
        secrets.add(key.secret)
        names.add(key.name)


def _from_file(path: Path) -> list[ApiKey]:
    out = []
    for fields in read_keys_file(path):
        name, secret = fields.pop("name"), fields.pop("key")
        out.append(ApiKey(name, secret.encode(), **fields))
    return out


class KeyCollector(Collector):
    """``mlxcore_api_key_{requests,limited,tokens}_total{key="<hash>"}`` at every scrape."""

    def __init__(self, table: KeyTable) -> None:
        self.table = table

    def collect(self) -> Iterator[CounterMetricFamily]:
        what = {
            "requests": "requests admitted, by key (a hash of it)",
            "limited": "requests refused with 429 for being over the key's limit",
            "tokens": "prompt and completion tokens of finished generations, by key",
        }
        families = {
            name: CounterMetricFamily(f"mlxcore_api_key_{name}", help_, labels=["key"])
            for name, help_ in what.items()
        }
        for label, counts in self.table.gauges().items():
            for name, family in families.items():
                family.add_metric([label], counts[name])
        yield from families.values()


def retry_after(wait: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait)))


def charge_current(tokens: int) -> None:
    """Count ``tokens`` against the key of the request being served, if any."""
    key = current_key.get()
    if key is not None and tokens > 0:
        key.charge(tokens, time.monotonic())


def request_priority(asked: int | None, key: ApiKey | None) -> int | None:
    """The priority a request runs at: what it ``asked`` for, but never better than its
    API key's level (a ``low`` key cannot jump the queue); the key's level when it asked
    for none; ``None`` (0) without either."""
    level = PRIORITY_LEVELS.get(key.priority) if key is not None and key.priority else None
    if level is None:
        return asked
    return level if asked is None else max(asked, level)
