"""Files and batches on disk: a folder of files and one SQLite database for their state.

Uploaded files and the output and error files a batch writes live under
``--batch-dir``/files/; their records and the batches' state live in
``--batch-dir``/batches.sqlite3, so a restart finds every batch where it stopped.
Thread-safe (one connection, one lock); every change is committed at once.

**Every record has an owner**: the name of the API key that created it (a batch's
output and error files: the batch's owner), ``None`` on a server without keys. The
routes only see their key's records (another key's id is a 404); the runner, which
works for every owner, passes :data:`EVERYONE`. Databases from before owners get the
column, their records owned by ``None``.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, owner TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, body TEXT NOT NULL, created_at INTEGER NOT NULL, owner TEXT
);
"""


class _Everyone:
    """The runner's view: records of every owner."""


EVERYONE: Any = _Everyone()
"""``owner`` for a view across owners (the runner's)."""

Owner = str | None
"""An API key's name, or ``None`` without keys."""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""States of a batch the runner still has work for."""


def new_id(prefix: str) -> str:
    """An OpenAI-style id (``file-...``, ``batch_...``)."""
    return f"{prefix}{secrets.token_hex(12)}"


class Store:
    """The files and batches of one ``--batch-dir``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files_dir = folder / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(folder / "batches.sqlite3", check_same_thread=False)
        self._db.executescript(SCHEMA)
        for table in ("files", "batches"):  # databases written before owners
            columns = [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]
            if "owner" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT")
        self._db.commit()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def _one(self, select: str, record_id: str, owner: Owner) -> Any:
        """The row ``select ... WHERE id = ?`` finds, if ``owner`` may see it."""
        query = select + " WHERE id = ?"
        args: list[Any] = [record_id]
        if owner is not EVERYONE:
            query += " AND owner IS ?"
            args.append(owner)
        with self._lock:
            return self._db.execute(query, args).fetchone()

    # -- files ---------------------------------------------------------------------

    def path(self, file_id: str) -> Path:
        """Where a file's content is (it may not exist yet)."""
        return self.files_dir / file_id

    def add_file(self, file_id: str, filename: str, purpose: str, owner: Owner) -> dict[str, Any]:
        """Record a file whose content is already at :meth:`path`."""
        size = self.path(file_id).stat().st_size
        created = int(time.time())
        with self._lock:
            self._db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
                (file_id, filename, purpose, size, created, owner),
            )
            self._db.commit()
        return file_object(file_id, filename, purpose, size, created)

    def owner_bytes(self, owner: Owner) -> int:
        """Bytes of ``owner``'s files on disk (uploads and batch results)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner IS ?", (owner,)
            ).fetchone()
        return int(row[0])

    def file(self, file_id: str, owner: Owner) -> dict[str, Any] | None:
        """A file's object, or None (also when ``owner`` does not own it)."""
        columns = "id, filename, purpose, bytes, created_at"
        row = self._one(f"SELECT {columns} FROM files", file_id, owner)
        return file_object(*row) if row else None

    def files(
        self, purpose: str | None, limit: int, after: str | None, owner: Owner
    ) -> list[dict[str, Any]]:
        """``owner``'s files, newest first (``after``: the id to continue after)."""
        query = "SELECT id, filename, purpose, bytes, created_at FROM files"
        where: list[str] = ["owner IS ?"]
        args: list[Any] = [owner]
        if purpose:
            where.append("purpose = ?")
            args.append(purpose)
        if after:
            where.append("rowid < (SELECT rowid FROM files WHERE id = ?)")
            args.append(after)
        query += " WHERE " + " AND ".join(where) + " ORDER BY rowid DESC LIMIT ?"
        with self._lock:
            rows = self._db.execute(query, (*args, limit)).fetchall()
        return [file_object(*row) for row in rows]

    def delete_file(self, file_id: str, owner: Owner) -> bool:
        """Forget ``owner``'s file and remove its content; False when there was none."""
        with self._lock:
            gone = self._db.execute(
                "DELETE FROM files WHERE id = ? AND owner IS ?", (file_id, owner)
            ).rowcount
            self._db.commit()
        if not gone:
            return False
        self.path(file_id).unlink(missing_ok=True)
        return True

    # -- batches -------------------------------------------------------------------

    def add_batch(self, batch: dict[str, Any], owner: Owner) -> None:
        """Record a new batch (its OpenAI object)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO batches VALUES (?, ?, ?, ?)",
                (batch["id"], json.dumps(batch), batch["created_at"], owner),
            )
            self._db.commit()

    def batch(self, batch_id: str, owner: Owner) -> dict[str, Any] | None:
        """A batch's object, or None (also when ``owner`` does not own it)."""
        row = self._one("SELECT body FROM batches", batch_id, owner)
        return json.loads(row[0]) if row else None

    def owner_of(self, batch_id: str) -> Owner:
        """Who created the batch (its result files are theirs)."""
        with self._lock:
            row = self._db.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return row[0] if row else None

    def save(self, batch: dict[str, Any]) -> None:
        """Write a batch's object back."""
        with self._lock:
            self._db.execute(
                "UPDATE batches SET body = ? WHERE id = ?", (json.dumps(batch), batch["id"])
            )
            self._db.commit()

    def batches(self, limit: int, after: str | None, owner: Owner) -> list[dict[str, Any]]:
        """``owner``'s batches, newest first."""
        query = "SELECT body FROM batches WHERE owner IS ?"
        args: list[Any] = [owner]
        if after:
            query += " AND rowid < (SELECT rowid FROM batches WHERE id = ?)"
            args.append(after)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit))
            return [json.loads(r[0]) for r in rows.fetchall()]

    def active(self) -> list[dict[str, Any]]:
        """Batches with work left, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM batches ORDER BY rowid").fetchall()
        found = [json.loads(r[0]) for r in rows]
        return [b for b in found if b["status"] in ACTIVE]


def file_object(
    file_id: str, filename: str, purpose: str, size: int, created: int
) -> dict[str, Any]:
    """OpenAI's file object."""
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
