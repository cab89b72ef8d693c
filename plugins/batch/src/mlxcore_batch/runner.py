"""The batch runner: one background task that works through the batches with work left.

A batch's input file is read line by line (never whole), each line sent through the
server's own route in process (:func:`mlxcore.server.internal.internal_client`: the same
validation and output pipeline as a client's request) at :data:`BATCH_PRIORITY`: the
engine's background work (``--background-priority``), which starts only in idle capacity,
once no interactive request has waited or run for ``--background-grace`` seconds; at most
``concurrency`` lines are in flight. A line the server turns away as busy (503) is sent
again after its ``Retry-After``. Each result is appended to the batch's output or error
file as it comes (flushed, one JSON line each), and the runner writes a ``custom_id`` at
most once: after a crash or ``kill -9`` it reads back what the files hold (cutting a
half-written last line) and sends only the lines not answered yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import IO, Any

from mlxcore.server.internal import internal_client
from mlxcore.server.tenants import on_behalf_of_header
from mlxcore_batch.store import EVERYONE, Store, new_id

log = logging.getLogger("mlxcore.plugins.batch")

BATCH_PRIORITY = 1_000_000
"""Batch lines' request priority: after every interactive request (which default to 0),
and background work at the engine's default ``--background-priority``."""

BUSY_STATUSES = frozenset({503})
"""Answers that mean "not now" (the engine's queue full or waited too long): sent again."""

MAX_RETRY_WAIT = 30.0
"""Longest wait before sending a turned-away line again (seconds)."""

MAX_BUSY_SECONDS = 3600.0
"""How long a line is sent again while the server stays busy; then its last answer is
its result (in the error file)."""

LINES_PER_READ = 256
"""Input lines read and parsed per step on a worker thread."""

CANCEL_CHECK_SECONDS = 0.5
"""How often a running batch looks whether it was cancelled (a database read)."""

MAX_ERRORS = 100
"""Most line errors a failed validation lists."""


class InvalidInput(Exception):
    """The input file is not a valid batch: a list of ``{line, message, code}``."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0]["message"] if errors else "invalid")
        self.errors = errors


def lines_of(path: Path) -> Generator[tuple[int, dict[str, Any] | None, str], None, None]:
    """``(line number, parsed line or None, error)`` for each non-blank line."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                item = json.loads(raw)
            except ValueError:
                yield number, None, "not JSON"
                continue
            yield number, item if isinstance(item, dict) else None, "not a JSON object"


def validate(path: Path, endpoint: str) -> int:
    """Check every line of a batch's input (streamed): its count, or :class:`InvalidInput`."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = 0

    def bad(number: int, message: str, code: str = "invalid_request") -> None:
        if len(errors) < MAX_ERRORS:
            errors.append({"code": code, "line": number, "message": message, "param": None})

    for number, item, error in lines_of(path):
        total += 1
        if item is None:
            bad(number, f"line {number} is {error}", "invalid_json_line")
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            bad(number, f"line {number}: custom_id must be a non-empty string", "missing_custom_id")
        elif custom_id in seen:
            bad(
                number,
                f"line {number}: custom_id {custom_id!r} is used twice",
                "duplicate_custom_id",
            )
        else:
            seen.add(custom_id)
        if item.get("method") != "POST":
            bad(number, f"line {number}: method must be POST", "invalid_method")
        if item.get("url") != endpoint:
            bad(
                number, f"line {number}: url must be the batch's endpoint {endpoint}", "invalid_url"
            )
        if not isinstance(item.get("body"), dict):
            bad(number, f"line {number}: body must be a JSON object", "invalid_body")
    if not total:
        bad(0, "the input file has no requests", "empty_file")
    if errors:
        raise InvalidInput(errors)
    return total


async def read_lines(path: Path) -> AsyncIterator[tuple[int, dict[str, Any] | None, str]]:
    """:func:`lines_of`, read and parsed :data:`LINES_PER_READ` lines at a time on a
    worker thread."""
    lines = lines_of(path)
    try:
        while chunk := await asyncio.to_thread(_take, lines, LINES_PER_READ):
            for entry in chunk:
                yield entry
    finally:
        with contextlib.suppress(ValueError):  # cancelled while a worker reads: it ends
            lines.close()


def _take(lines: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(lines, n))


def _append(out: IO[str], line: str) -> None:
    """One result line, flushed (a restart resumes after the last complete line)."""
    out.write(line + "\n")
    out.flush()


def answered(path: Path) -> set[str]:
    """The ``custom_id`` of every complete line of a result file; a half-written last
    line (the process died while writing it) is cut off."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    done = set()
    for raw in data[:end].splitlines():
        if raw.strip():
            done.add(json.loads(raw)["custom_id"])
    return done


def busy_retry_after(header: str | None) -> float:
    """Seconds to wait after a busy answer: its ``Retry-After`` (seconds) within
    [0.1, :data:`MAX_RETRY_WAIT`], 1 s when it gives none."""
    try:
        seconds = float(header) if header is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), MAX_RETRY_WAIT) if seconds == seconds else 1.0


def request_body(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """A line's body as the runner sends it: not streamed, at batch priority, and (for
    the Responses API) not stored."""
    body = dict(body)
    if endpoint != "/v1/embeddings":
        body["stream"] = False
        body["priority"] = BATCH_PRIORITY
    if endpoint == "/v1/responses":
        body.setdefault("store", False)
    return body


class Runner:
    """Works through the batches with work left, one at a time, oldest first."""

    def __init__(self, app: Any, store: Store, concurrency: int) -> None:
        self.app = app
        self.store = store
        self.concurrency = concurrency
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Something changed (a batch created or cancelled): look again."""
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled. The file, SQLite and JSON work runs on worker threads, in
        steps of at most :data:`LINES_PER_READ` lines: the event loop serves the
        interactive streams meanwhile."""
        while True:
            active = await asyncio.to_thread(self.store.active)
            if not active:
                await self._wake.wait()
                self._wake.clear()
                continue
            try:
                await self.process(active[0])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a runner fault fails the batch, not the server
                log.exception("batch %s failed", active[0]["id"])
                await asyncio.to_thread(self._fail, active[0], exc)

    def _fail(self, batch: dict[str, Any], exc: Exception) -> None:
        """Mark ``batch`` failed by a runner fault; its partial result files go."""
        for path in self._result_paths(batch):
            path.unlink(missing_ok=True)
        current = self.store.batch(batch["id"], EVERYONE) or batch
        current.update(status="failed", failed_at=int(time.time()))
        current["errors"] = {
            "object": "list",
            "data": [{"code": "server_error", "message": f"{type(exc).__name__}: {exc}"}],
        }
        self.store.save(current)

    async def process(self, batch: dict[str, Any]) -> None:
        """Validate, run and finalize one batch (from wherever it stopped)."""
        source = self.store.path(batch["input_file_id"])
        if batch["status"] == "validating":
            try:
                total = await asyncio.to_thread(validate, source, batch["endpoint"])
            except InvalidInput as exc:
                batch.update(status="failed", failed_at=int(time.time()))
                batch["errors"] = {"object": "list", "data": exc.errors}
                await asyncio.to_thread(self.store.save, batch)
                return
            batch["request_counts"] = {"total": total, "completed": 0, "failed": 0}
            if await asyncio.to_thread(self._cancelled, batch):  # cancelled meanwhile
                await asyncio.to_thread(self._save_counts, batch)
                await asyncio.to_thread(self._finalize, batch)
                return
            batch.update(status="in_progress", in_progress_at=int(time.time()))
            await asyncio.to_thread(self.store.save, batch)
        if batch["status"] == "in_progress":
            await self._run_lines(batch, source)
        await asyncio.to_thread(self._finalize, batch)

    def _result_paths(self, batch: dict[str, Any]) -> tuple[Path, Path]:
        folder = self.store.files_dir
        return folder / f"{batch['id']}.output.part", folder / f"{batch['id']}.error.part"

    async def _run_lines(self, batch: dict[str, Any], source: Path) -> None:
        out_path, err_path = self._result_paths(batch)
        done_ok = await asyncio.to_thread(answered, out_path)
        done_bad = await asyncio.to_thread(answered, err_path)
        counts = batch["request_counts"]
        counts.update(completed=len(done_ok), failed=len(done_bad))
        done = done_ok | done_bad
        slots = asyncio.Semaphore(self.concurrency)
        pending: set[asyncio.Task[None]] = set()
        saved_at = checked_at = time.monotonic()
        endpoint = batch["endpoint"]
        owner = await asyncio.to_thread(self.store.owner_of, batch["id"])
        # each line is a request of the batch's owner: its key's cache, limits and stores
        async with internal_client(self.app, headers=on_behalf_of_header(owner)) as client:
            with out_path.open("a") as out, err_path.open("a") as err:

                async def one(item: dict[str, Any]) -> None:
                    try:
                        sent = await self._send_until_taken(client, endpoint, item, batch)
                        if sent is None:  # cancelled while the server was busy: not run
                            return
                        line, ok = sent
                        await asyncio.to_thread(_append, out if ok else err, line)
                        counts["completed" if ok else "failed"] += 1
                    finally:
                        slots.release()

                async for _, item, _ in read_lines(source):
                    if item is None or item["custom_id"] in done:
                        continue
                    await slots.acquire()
                    if time.monotonic() - checked_at >= CANCEL_CHECK_SECONDS:
                        checked_at = time.monotonic()
                        if await asyncio.to_thread(self._cancelled, batch):
                            slots.release()
                            break
                    task = asyncio.create_task(one(item))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    if time.monotonic() - saved_at > 1.0:  # progress for GET /v1/batches
                        await asyncio.to_thread(self._save_counts, batch)
                        saved_at = time.monotonic()
                if pending:
                    await asyncio.gather(*pending)
        await asyncio.to_thread(self._save_counts, batch)

    async def _send_until_taken(
        self, client: Any, endpoint: str, item: dict[str, Any], batch: dict[str, Any]
    ) -> tuple[str, bool] | None:
        """:meth:`_send`, again after the server's ``Retry-After`` while it answers that
        it is busy (a line waits in idle capacity, maybe past ``--max-queue-wait``: being
        turned away is not the line's failure); ``None`` when the batch was cancelled
        meanwhile."""
        give_up = time.monotonic() + MAX_BUSY_SECONDS
        while True:
            line, ok, retry_after = await self._send(client, endpoint, item)
            if retry_after is None or time.monotonic() + retry_after > give_up:
                return line, ok  # answered, or busy for too long: the answer stands
            await asyncio.sleep(retry_after)
            if await asyncio.to_thread(self._cancelled, batch):
                return None

    async def _send(
        self, client: Any, endpoint: str, item: dict[str, Any]
    ) -> tuple[str, bool, float | None]:
        """One line through the server's route: its result line, whether it is a 2xx, and
        the seconds to wait before sending it again when the server was too busy to take
        it (``None``: it was answered)."""
        body = request_body(endpoint, item["body"])
        retry_after: float | None = None
        try:
            answer = await client.post(endpoint, json=body)
            status = answer.status_code
            try:
                payload: Any = answer.json()
            except ValueError:
                payload = {"error": {"message": answer.text[:1000]}}
            request_id = answer.headers.get("x-request-id", "")
            if status in BUSY_STATUSES:
                retry_after = busy_retry_after(answer.headers.get("retry-after"))
        except Exception as exc:  # the route itself failed: the line fails, not the batch
            status, payload, request_id = 500, {"error": {"message": str(exc)}}, ""
        line = {
            "id": new_id("batch_req_"),
            "custom_id": item["custom_id"],
            "response": {"status_code": status, "request_id": request_id, "body": payload},
            "error": None,
        }
        return json.dumps(line, ensure_ascii=False), 200 <= status < 300, retry_after

    def _cancelled(self, batch: dict[str, Any]) -> bool:
        """Whether the batch was cancelled meanwhile (then it is marked so here too)."""
        current = self.store.batch(batch["id"], EVERYONE)
        if current is not None and current["status"] == "cancelling":
            batch.update(status="cancelling", cancelling_at=current.get("cancelling_at"))
            return True
        return False

    def _save_counts(self, batch: dict[str, Any]) -> None:
        current = self.store.batch(batch["id"], EVERYONE) or batch
        current["request_counts"] = batch["request_counts"]
        if current["status"] == "cancelling":
            batch["status"] = "cancelling"
        self.store.save(current)

    def _finalize(self, batch: dict[str, Any]) -> None:
        """Publish the result files and set the final state."""
        current = self.store.batch(batch["id"], EVERYONE) or batch
        current["request_counts"] = batch.get("request_counts", current.get("request_counts"))
        cancelled = current["status"] == "cancelling"
        if current["status"] not in ("in_progress", "finalizing", "cancelling"):
            return
        for path, field, name in zip(
            self._result_paths(batch),
            ("output_file_id", "error_file_id"),
            ("output", "error"),
            strict=True,
        ):
            if path.exists() and path.stat().st_size:
                file_id = new_id("file-")
                os.replace(path, self.store.path(file_id))
                owner = self.store.owner_of(batch["id"])
                self.store.add_file(file_id, f"{batch['id']}_{name}.jsonl", "batch_output", owner)
                current[field] = file_id
            else:
                path.unlink(missing_ok=True)
        now = int(time.time())
        if cancelled:
            current.update(status="cancelled", cancelled_at=now)
        else:
            current.update(status="completed", finalizing_at=now, completed_at=now)
        self.store.save(current)
