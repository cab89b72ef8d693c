"""The on-disk entries of one model: files, index, checksums, size bound, sharing.

One folder per model fingerprint holds, per entry, a data file written by mlx-lm's
``save_prompt_cache`` (safetensors, which ``mx.load`` reads back) and a small JSON
file with the entry's tokens, the data file's name and its CRC-32. The JSON file is
the commit: it is renamed into place after its data file, so a reader never sees an
entry whose data is still being written. Data files carry their checksum in their
name, so two servers writing the same entry never overwrite each other's file.

Several servers may share a folder: writes are atomic renames, the size bound is
enforced under a file lock, and each server rescans the folder when its
modification time changes. A file that is missing when read (another server evicted
it) is a miss; one whose checksum or contents are wrong is deleted and logged.

The least recently used entries (by the JSON file's modification time, touched on
every hit) are deleted when the folder grows past its size.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import msgspec
import numpy as np
from filelock import FileLock, Timeout
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

log = logging.getLogger("mlxcore.plugins.disk_cache")

META_SUFFIX = ".json"
DATA_SUFFIX = ".safetensors"
STALE_TEMP_SECONDS = 3600.0
"""Temporary files older than this are leftovers of a crashed writer."""

FATAL_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
     errno.ENOTDIR, errno.EFBIG}
)  # fmt: skip
"""Write errors that mean the folder cannot take entries (full, read-only, gone)."""


class CorruptEntry(Exception):
    """A stored entry whose bytes are not what was written."""


class EntryGone(Exception):
    """A stored entry deleted meanwhile (by another server's eviction)."""


class Meta(msgspec.Struct):
    """An entry's JSON file."""

    tokens: list[int]
    data: str
    crc32: int
    nbytes: int
    kind: str = "sequence"
    created: float = 0.0


@attrs.define(eq=False)
class DiskEntry:
    """One stored entry, as indexed in memory."""

    key: str
    tokens: np.ndarray
    data: str
    crc32: int
    nbytes: int
    kind: str

    @property
    def length(self) -> int:
        """How many tokens the entry's state holds."""
        return int(self.tokens.shape[0])


@attrs.define
class Match:
    """What the index holds for a prompt.

    Attributes:
        entry: the entry that covers most of the prompt (None: none is usable).
        usable: how many prompt tokens that entry supplies.
        shared: the longest prefix the prompt shares with any entry.
        nearest_tokens: the length of the entry sharing ``shared`` tokens.
    """

    entry: DiskEntry | None = None
    usable: int = 0
    shared: int = 0
    nearest_tokens: int = 0


def entry_key(tokens: Sequence[int]) -> str:
    """The file stem of the entry for exactly ``tokens``."""
    raw = np.asarray(tokens, dtype=np.int32).tobytes()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def file_crc(path: Path) -> int:
    """CRC-32 of a file's bytes."""
    crc = 0
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return crc


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading elements two token arrays share."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class DiskStore:
    """The entries in ``root`` (one model's folder), bounded to ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.entries: dict[str, DiskEntry] = {}
        """The index (replaced or changed under ``_index_lock``: the writer thread adds
        and evicts, the engine thread reads)."""
        self._index_lock = threading.Lock()
        self._seen_mtime: int | None = None
        self._lock = FileLock(str(root / ".lock"), timeout=2.0)
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()

    # -- index -----------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read the index if the folder changed since the last look."""
        try:
            mtime = self.root.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._seen_mtime:
            return
        self._seen_mtime = mtime
        known = self.snapshot()
        present: dict[str, DiskEntry] = {}
        for meta in self.root.glob("*" + META_SUFFIX):
            key = meta.name[: -len(META_SUFFIX)]
            entry = known.get(key) or self._read_meta(meta)
            if entry is not None:
                present[key] = entry
        with self._index_lock:
            self.entries = present

    def snapshot(self) -> dict[str, DiskEntry]:
        """A copy of the index, safe to iterate on any thread."""
        with self._index_lock:
            return dict(self.entries)

    def _forget(self, key: str) -> None:
        with self._index_lock:
            self.entries.pop(key, None)

    def _read_meta(self, path: Path) -> DiskEntry | None:
        try:
            meta = msgspec.json.decode(path.read_bytes(), type=Meta)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("disk-cache: dropped %s: unreadable index file (%s)", path.name, exc)
            path.unlink(missing_ok=True)
            return None
        tokens = np.asarray(meta.tokens, dtype=np.int32)
        return DiskEntry(path.stem, tokens, meta.data, meta.crc32, meta.nbytes, meta.kind)

    def nbytes(self) -> int:
        """Bytes of the indexed entries' data files."""
        return sum(e.nbytes for e in self.snapshot().values())

    def closest(self, tokens: np.ndarray, *, trimmable: bool) -> Match:
        """The entry that covers most of ``tokens``, and the one sharing most with it.

        A trimmable cache can be cut back to any shared prefix; another (recurrent state)
        is only used whole, when the entry is a prefix of ``tokens``. Fewer than
        ``len(tokens)`` tokens are ever usable, so prefill has a token to process.
        """
        limit = tokens.shape[0] - 1
        match = Match()
        for entry in self.snapshot().values():
            k = common_prefix(tokens, entry.tokens)
            if k > match.shared:
                match.shared, match.nearest_tokens = k, entry.length
            n = min(k, limit) if trimmable else entry.length if k == entry.length <= limit else 0
            if n > match.usable:
                match.entry, match.usable = entry, n
        return match

    # -- reading ---------------------------------------------------------------

    def read(self, entry: DiskEntry) -> list[Any]:
        """The entry's per-layer cache, checked against its checksum.

        Raises :class:`EntryGone` when the files were deleted meanwhile and
        :class:`CorruptEntry` when they are damaged (the entry is then deleted).
        """
        data = self.root / entry.data
        try:
            crc = file_crc(data)
        except FileNotFoundError:
            self._forget(entry.key)
            raise EntryGone(entry.key) from None
        if crc != entry.crc32:
            self.remove(entry)
            raise CorruptEntry(f"checksum {crc:08x} != {entry.crc32:08x}")
        try:
            cache = load_prompt_cache(str(data))
        except FileNotFoundError:
            self._forget(entry.key)
            raise EntryGone(entry.key) from None
        except Exception as exc:
            self.remove(entry)
            raise CorruptEntry(f"unreadable: {exc}") from exc
        self.touch(entry)
        return cache

    def touch(self, entry: DiskEntry) -> None:
        """Mark ``entry`` as recently used (for the size bound's LRU order)."""
        with contextlib.suppress(OSError):
            os.utime(self.root / (entry.key + META_SUFFIX))

    def remove(self, entry: DiskEntry) -> None:
        """Delete an entry's files (index first, so no reader picks the data up)."""
        self._forget(entry.key)
        (self.root / (entry.key + META_SUFFIX)).unlink(missing_ok=True)
        (self.root / entry.data).unlink(missing_ok=True)

    # -- writing (writer thread) ----------------------------------------------

    def has(self, key: str) -> bool:
        """True when an entry for this key is committed in the folder."""
        return (self.root / (key + META_SUFFIX)).exists()

    def write(self, tokens: Sequence[int], cache: list[Any], kind: str) -> DiskEntry | None:
        """Store ``cache`` (evaluated arrays, not mutated meanwhile) for ``tokens``.

        Returns the new entry, or None when it was already there. Raises OSError when
        the folder cannot take it (see :data:`FATAL_ERRNOS`).
        """
        key = entry_key(tokens)
        if self.has(key):
            return None
        suffix = f".{os.getpid()}.{time.monotonic_ns()}.tmp"
        temp = self.root / f".{key}{suffix}{DATA_SUFFIX}"
        try:
            save_prompt_cache(str(temp), cache)
            crc = file_crc(temp)
            nbytes = temp.stat().st_size
            data = f"{key}-{crc:08x}{DATA_SUFFIX}"
            os.replace(temp, self.root / data)
        except RuntimeError as exc:  # mlx reports failed writes as RuntimeError
            raise OSError(errno.EIO, f"could not write {temp.name}: {exc}") from exc
        finally:
            temp.unlink(missing_ok=True)
        meta = Meta(list(map(int, tokens)), data, crc, nbytes, kind, time.time())
        meta_temp = self.root / f".{key}{suffix}{META_SUFFIX}"
        try:
            meta_temp.write_bytes(msgspec.json.encode(meta))
            os.replace(meta_temp, self.root / (key + META_SUFFIX))
        except OSError:
            (self.root / data).unlink(missing_ok=True)
            raise
        finally:
            meta_temp.unlink(missing_ok=True)
        entry = DiskEntry(key, np.asarray(meta.tokens, dtype=np.int32), data, crc, nbytes, kind)
        with self._index_lock:
            self.entries[key] = entry
        return entry

    def drop_prefixes_of(self, entry: DiskEntry) -> int:
        """Delete the entries whose tokens are a prefix of ``entry``'s (a trimmable cache
        serves them from ``entry``, as mlx-lm's LRU does in memory); return how many."""
        dropped = 0
        for other in self.snapshot().values():
            if other.length < entry.length and common_prefix(other.tokens, entry.tokens) == (
                other.length
            ):
                self.remove(other)
                dropped += 1
        return dropped

    def enforce_size(self) -> int:
        """Delete least recently used entries until the folder fits; return how many
        were deleted (0 as well when another server holds the lock)."""
        try:
            with self._lock.acquire(timeout=0.5):
                return self._evict_oldest()
        except Timeout:
            return 0

    def _evict_oldest(self) -> int:
        entries: list[tuple[float, int, Path, Path]] = []
        referenced: set[str] = set()
        known = self.snapshot()
        for meta in self.root.glob("*" + META_SUFFIX):
            entry = known.get(meta.stem) or self._read_meta(meta)
            if entry is None:
                continue
            referenced.add(entry.data)
            try:
                mtime = meta.stat().st_mtime
            except FileNotFoundError:
                continue
            entries.append((mtime, entry.nbytes, meta, self.root / entry.data))
        self._remove_orphans(referenced)
        total = sum(e[1] for e in entries)
        removed = 0
        for _, nbytes, meta, data in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            meta.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            self._forget(meta.stem)
            total -= nbytes
            removed += 1
        return removed

    def _remove_orphans(self, referenced: set[str]) -> None:
        """Data files no index points to and stale temporary files (crashed writers)."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        for path in self.root.iterdir():
            name = path.name
            orphan = name.endswith(DATA_SUFFIX) and not name.startswith(".")
            orphan = orphan and name not in referenced
            temp = name.startswith(".") and ".tmp" in name
            try:
                if (orphan or temp) and path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
            except OSError:
                continue
