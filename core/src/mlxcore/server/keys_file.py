"""Reading ``--api-keys-file``: one ``[keys.NAME]`` table per key, an optional
``[defaults]`` table for every key's unstated fields.

::

    [defaults]                    # optional: what a key that does not say gets
    max_concurrent = 8

    [keys.alice]
    key = "sk-alice-..."          # the secret the client sends (required)
    role = "admin"                # "admin" or "user" (the default): who may change
                                  # what the server holds for everyone
    cache_group = "team-a"        # keys of one group share their prefix cache
    requests_per_minute = 60      # limits (see mlxcore.server.keys)
    tokens_per_minute = 200000
    priority = "low"              # "high", "normal" or "low"
    max_concurrent = 4            # requests running at once (more: 429)
    max_stored_bytes = "16MB"     # stored Responses API responses, within
                                  # --responses-store-size
    max_file_bytes = "1GB"        # the batch plugin's files on disk

Every mistake is a :class:`~mlxcore.errors.UsageError` naming the file and the field,
at start-up and when the file is read again (then the old keys stay in force).
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxcore.errors import UsageError
from mlxcore.settings import byte_size

ROLES = ("admin", "user")
PRIORITIES = ("high", "normal", "low")

COUNTS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
"""Fields that are whole numbers >= 1."""
SIZES = ("max_stored_bytes", "max_file_bytes")
"""Fields that are sizes (a number of bytes or text such as ``16MB``)."""
SHARED = (*COUNTS, *SIZES, "priority", "role", "cache_group")
"""Fields ``[defaults]`` may set."""
FIELDS = frozenset({"key", *SHARED})

MAX_NAME_CHARS = 128
"""The longest key name, cache group or ``cache_salt`` accepted."""


def read_keys_file(path: Path) -> list[dict[str, Any]]:
    """Every key of the file as a dict of checked fields (``name``, ``key`` and those it
    sets, defaults applied)."""
    try:
        document: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--api-keys-file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--api-keys-file {path}: not TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--api-keys-file {path}: not UTF-8: {exc.reason}") from None
    tables = document.get("keys")
    if not isinstance(tables, dict) or not tables:
        raise UsageError(f"--api-keys-file {path}: needs [keys.NAME] tables")
    unknown = set(document) - {"keys", "defaults"}
    if unknown:
        raise UsageError(f"--api-keys-file {path}: unknown table(s) {', '.join(sorted(unknown))}")
    defaults = document.get("defaults", {})
    if not isinstance(defaults, dict):
        raise UsageError(f"--api-keys-file {path}: [defaults] must be a table")
    where = f"--api-keys-file {path}: defaults"
    extra = set(defaults) - set(SHARED)
    if extra:
        raise UsageError(f"{where}: unknown or per-key field(s) {', '.join(sorted(extra))}")
    shared = _checked(defaults, where)
    out = []
    for name, table in tables.items():
        where = f"--api-keys-file {path}: keys.{name}"
        if not isinstance(table, dict) or not isinstance(table.get("key"), str) or not table["key"]:
            raise UsageError(f'{where} needs key = "..."')
        if len(name) > MAX_NAME_CHARS:
            raise UsageError(f"{where}: a name of at most {MAX_NAME_CHARS} characters")
        unknown = set(table) - FIELDS
        if unknown:
            raise UsageError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        fields = {**shared, **_checked(table, where)}
        out.append({"name": str(name), "key": table["key"], **fields})
    return out


def _checked(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The shared fields ``table`` sets, checked and converted."""
    out: dict[str, Any] = {}
    for field in COUNTS:
        value = table.get(field)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{where}.{field} must be a whole number >= 1")
            out[field] = value
    for field in SIZES:
        value = table.get(field)
        if value is not None:
            out[field] = _size(value, f"{where}.{field}")
    for field, choices in (("priority", PRIORITIES), ("role", ROLES)):
        value = table.get(field)
        if value is not None:
            if value not in choices:
                raise UsageError(f"{where}.{field} must be one of {', '.join(choices)}")
            out[field] = value
    group = table.get("cache_group")
    if group is not None:
        if not isinstance(group, str) or not 0 < len(group) <= MAX_NAME_CHARS:
            raise UsageError(
                f"{where}.cache_group must be a name of 1 to {MAX_NAME_CHARS} characters"
            )
        out["cache_group"] = group
    return out


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"{where} must be a size such as 16MB or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise UsageError(f"{where} must be a size >= 0")
        return value
    try:
        return byte_size(value)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{where}: {exc}") from None
