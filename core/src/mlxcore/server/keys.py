"""API keys: several of them, each with optional request and token limits per minute.

Keys come from ``--api-key`` (repeatable, no limits) and ``--api-keys-file FILE``, a TOML
file with one table per key::

    [keys.ci]
    key = "sk-ci-..."            # the secret the client sends
    requests_per_minute = 60     # optional
    tokens_per_minute = 200000   # optional: prompt + completion tokens
    priority = "low"             # optional: recorded (for the scheduler's priorities)

A request must carry one of the keys (``Authorization: Bearer KEY`` or ``x-api-key``)
on every route but the open ones. A key over its limit gets a 429 in the API's own error
shape with ``Retry-After``: the seconds until the oldest request (or enough tokens) of
the last minute leaves the window. Requests are counted when they arrive, tokens when a
generation finishes (the key's identity travels with the request in a context variable),
so a key can go over its token limit by the requests already running; the next one waits.
Per-key counters are in ``/metrics`` under a hash of the key, never the key itself.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import hmac
import math
import threading
import time
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from mlxcore.errors import UsageError

WINDOW = 60.0
"""Seconds the limits are counted over."""

PRIORITIES = ("high", "normal", "low")
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
    requests: collections.deque[float] = attrs.field(factory=collections.deque)
    tokens: collections.deque[tuple[float, int]] = attrs.field(factory=collections.deque)
    tokens_in_window: int = 0  # the sum of ``tokens``, kept as they come and go
    counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

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


class KeyTable:
    """The server's keys (empty: no authentication)."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keys = list(keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    @classmethod
    def from_config(cls, secrets: Iterable[str], keys_file: str | None) -> KeyTable:
        """``--api-key`` values and the ``--api-keys-file`` tables (UsageError if bad)."""
        keys = [ApiKey(f"key{i}", s.encode()) for i, s in enumerate(secrets) if s]
        if keys_file:
            keys += _read_file(Path(keys_file).expanduser())
        seen: set[bytes] = set()
        for key in keys:
            if key.secret in seen:
                raise UsageError(f"API key {key.name!r} is given twice")
            seen.add(key.secret)
        return cls(keys)

    def find(self, token: str) -> ApiKey | None:
        """The key whose secret is ``token`` (compared in constant time), or None."""
        given = token.encode()
        found = None
        for key in self.keys:
            if hmac.compare_digest(given, key.secret):
                found = key
        return found

    def gauges(self) -> dict[str, dict[str, float]]:
        """Per-key counters for ``/metrics``: label -> counter name -> value."""
        return {
            key.label: {name: float(key.counts[name]) for name in ("requests", "limited", "tokens")}
            for key in self.keys
        }


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


def _read_file(path: Path) -> list[ApiKey]:
    try:
        document: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--api-keys-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--api-keys-file {path}: not TOML: {exc}") from None
    tables = document.get("keys")
    if not isinstance(tables, dict) or not tables:
        raise UsageError(f"--api-keys-file {path}: needs [keys.NAME] tables")
    out = []
    for name, table in tables.items():
        where = f"--api-keys-file {path}: keys.{name}"
        if not isinstance(table, dict) or not isinstance(table.get("key"), str) or not table["key"]:
            raise UsageError(f'{where} needs key = "..."')
        unknown = set(table) - {"key", "requests_per_minute", "tokens_per_minute", "priority"}
        if unknown:
            raise UsageError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        limits: list[int | None] = []
        for field in ("requests_per_minute", "tokens_per_minute"):
            value = table.get(field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise UsageError(f"{where}.{field} must be a whole number >= 1")
            limits.append(value)
        priority = table.get("priority")
        if priority is not None and priority not in PRIORITIES:
            raise UsageError(f"{where}.priority must be one of {', '.join(PRIORITIES)}")
        requests, tokens = limits
        key = ApiKey(str(name), table["key"].encode(), requests, tokens, priority=priority)
        out.append(key)
    return out


def request_priority(asked: int | None, key: ApiKey | None) -> int | None:
    """The priority a request runs at: what it ``asked`` for, but never better than its
    API key's level (a ``low`` key cannot jump the queue); the key's level when it asked
    for none; ``None`` (0) without either."""
    level = PRIORITY_LEVELS.get(key.priority) if key is not None and key.priority else None
    if level is None:
        return asked
    return level if asked is None else max(asked, level)
