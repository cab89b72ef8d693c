"""The on-disk entries of one model: files, index, checksums, size bound, sharing.

One folder per model fingerprint holds, per entry, a data file written by mlx-lm's
``save_prompt_cache`` (safetensors, which ``mx.load`` reads back) and a small JSON
file with the entry's tokens, the data file's name and its CRC-32. The JSON file is
the commit: it is renamed into place after its data file, so a reader never sees an
entry whose data is still being written. Data files carry their checksum in their
name, so two servers writing the same entry never overwrite each other's file.

An entry may hold only the tail of its tokens' state: tokens ``[start, length)`` of
the attention layers (and the recurrent state at its end), on top of its *parent*, the
entry of its first ``start`` tokens. A conversation's turns and snapshots then cost their
own tokens only, as in the memory tier's tree. An entry whose parents are gone (evicted,
damaged) is unusable and deleted when found.

Several servers may share a folder: writes are atomic renames, the size bound is
enforced under a file lock, and each server rescans the folder when its
modification time changes. A file that is missing when read (another server evicted
it) is a miss; one whose checksum or contents are wrong is deleted and logged.

The least recently used entries (by the JSON file's modification time, touched on
every hit) are deleted when the folder grows past its size.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import io
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
PREFETCH_BYTES = 2 << 30
"""The most bytes of data files read ahead for queued requests."""
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
    start: int = 0
    parent: str | None = None


@attrs.define(eq=False)
class DiskEntry:
    """One stored entry, as indexed in memory."""

    key: str
    tokens: np.ndarray
    data: str
    crc32: int
    nbytes: int
    kind: str
    start: int = 0
    """The first token whose state the entry's own file holds (0: all of them)."""
    parent: str | None = None
    """The key of the entry holding tokens ``[0, start)`` (None when ``start`` is 0)."""

    @property
    def length(self) -> int:
        """How many tokens the entry's state holds, its parents' included."""
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


class _NamedBytes(io.BytesIO):
    """File bytes that ``mx.load`` reads as safetensors."""

    name = "entry" + DATA_SUFFIX


class Prefetched:
    """Data files read ahead of their use (any thread), bounded in bytes; the oldest
    goes first when a new one does not fit."""

    def __init__(self, max_bytes: int = PREFETCH_BYTES) -> None:
        self.max_bytes = max_bytes
        self._files: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._files

    def put(self, name: str, data: bytes) -> None:
        """Keep ``data`` for ``name`` (dropped when larger than the bound)."""
        if len(data) > self.max_bytes:
            return
        with self._lock:
            self._files[name] = data
            while sum(len(d) for d in self._files.values()) > self.max_bytes:
                self._files.popitem(last=False)

    def pop(self, name: str) -> bytes | None:
        """The bytes kept for ``name`` (forgotten), or None."""
        with self._lock:
            data = self._files.pop(name, None)
        if data is not None:
            self.hits += 1
        return data

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return sum(len(d) for d in self._files.values())


def _chain_complete(entry: DiskEntry, index: dict[str, DiskEntry]) -> bool:
    """True when every parent of ``entry`` is in ``index``, each as long as its child's
    ``start``."""
    seen = 0
    while entry.parent is not None and seen < len(index):
        parent = index.get(entry.parent)
        if parent is None or parent.length != entry.start:
            return False
        entry, seen = parent, seen + 1
    return entry.parent is None


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
        self.prefetched = Prefetched()
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
        return DiskEntry(
            path.stem, tokens, meta.data, meta.crc32, meta.nbytes, meta.kind,
            meta.start, meta.parent,
        )  # fmt: skip

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
        index = self.snapshot()
        for entry in index.values():
            k = common_prefix(tokens, entry.tokens)
            if k > match.shared:
                match.shared, match.nearest_tokens = k, entry.length
            if trimmable:
                n = min(k, limit) if k > entry.start else 0  # else a parent serves it
            else:
                n = entry.length if k == entry.length <= limit else 0
            if n > match.usable and _chain_complete(entry, index):
                match.entry, match.usable = entry, n
        return match

    def chain(self, entry: DiskEntry) -> list[DiskEntry]:
        """``entry`` and its parents, the root first; raises :class:`EntryGone` when a
        parent is missing (the entry is then deleted: it can never be read)."""
        index = self.snapshot()
        out = [entry]
        while out[-1].parent is not None:
            parent = index.get(out[-1].parent or "")
            if parent is None or parent.length != out[-1].start:
                self.remove(entry)
                raise EntryGone(entry.key)
            out.append(parent)
        return out[::-1]

    # -- reading ---------------------------------------------------------------

    def read(self, entry: DiskEntry) -> list[Any]:
        """The per-layer cache of the entry's own file, checked against its checksum
        (from the bytes :meth:`prefetch` read, when it did).

        Raises :class:`EntryGone` when the files were deleted meanwhile and
        :class:`CorruptEntry` when they are damaged (the entry is then deleted).
        """
        data = self.prefetched.pop(entry.data) or self._read_bytes(entry)
        crc = zlib.crc32(data)
        if crc != entry.crc32:
            self.remove(entry)
            raise CorruptEntry(f"checksum {crc:08x} != {entry.crc32:08x}")
        try:
            cache = load_prompt_cache(_NamedBytes(data))
        except Exception as exc:
            self.remove(entry)
            raise CorruptEntry(f"unreadable: {exc}") from exc
        self.touch(entry)
        return cache

    def _read_bytes(self, entry: DiskEntry) -> bytes:
        try:
            return (self.root / entry.data).read_bytes()
        except FileNotFoundError:
            self._forget(entry.key)
            raise EntryGone(entry.key) from None

    def prefetch(self, entry: DiskEntry, held: int = 0) -> None:
        """Read the files of ``entry`` and its parents into memory (any thread), so that
        a later :meth:`read` finds them there (within :class:`Prefetched`'s bound); not
        the parents ending within the first ``held`` tokens (memory holds them)."""
        try:
            chain = self.chain(entry)
            for link in chain:
                if link is not chain[-1] and link.length <= held:
                    continue
                if not self.prefetched.has(link.data):
                    self.prefetched.put(link.data, self._read_bytes(link))
        except (EntryGone, OSError):
            return

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

    def write(
        self,
        tokens: Sequence[int],
        cache: list[Any],
        kind: str,
        start: int = 0,
        parent: str | None = None,
    ) -> DiskEntry | None:
        """Store ``cache`` (evaluated arrays, not mutated meanwhile) for ``tokens``: the
        state of tokens ``[start, len(tokens))`` on top of the entry ``parent`` (see the
        module docstring).

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
        meta = Meta(list(map(int, tokens)), data, crc, nbytes, kind, time.time(), start, parent)
        meta_temp = self.root / f".{key}{suffix}{META_SUFFIX}"
        try:
            meta_temp.write_bytes(msgspec.json.encode(meta))
            os.replace(meta_temp, self.root / (key + META_SUFFIX))
        except OSError:
            (self.root / data).unlink(missing_ok=True)
            raise
        finally:
            meta_temp.unlink(missing_ok=True)
        tokens_array = np.asarray(meta.tokens, dtype=np.int32)
        entry = DiskEntry(key, tokens_array, data, crc, nbytes, kind, start, parent)
        with self._index_lock:
            self.entries[key] = entry
        return entry

    def drop_prefixes_of(self, entry: DiskEntry) -> int:
        """Delete the entries whose tokens are a prefix of ``entry``'s (a trimmable cache
        serves them from ``entry``, as mlx-lm's LRU does in memory); return how many."""
        dropped = 0
        index = self.snapshot()
        parents = {e.parent for e in index.values()}
        for other in index.values():
            if other.key in parents:
                continue  # another entry builds on it
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
