"""OpenAI's Files and Batch routes: ``/v1/files`` and ``/v1/batches``."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import File

from mlxcore.server.errors import APIError
from mlxcore.server.frontend import decode_body
from mlxcore.server.keys import current_key
from mlxcore.server.openapi import (
    BODY_OPTION,
    ERRORS_OPTION,
    FORM_OPTION,
    INTEGER,
    QUERY_OPTION,
    REPLIES_OPTION,
    STRING,
    array,
    const,
    nullable,
    obj,
    reply,
)
from mlxcore.server.tenants import current_owner
from mlxcore_batch.runner import Runner
from mlxcore_batch.store import Store, new_id

PURPOSES = ("batch", "user_data")
"""Purposes an upload may have (``batch_output`` is the runner's own)."""
CHUNK = 1 << 20
MAX_UPLOAD = 1 << 30
"""Largest upload (1 GiB; spooled to disk as it arrives, never held in memory whole)."""
UPLOAD_FORM: dict[str, Any] = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream",
                 "description": "the file (JSONL for purpose batch)"},
        "purpose": {"type": "string", "enum": list(PURPOSES)},
    },
}  # fmt: skip
"""The upload's ``multipart/form-data`` fields, for the OpenAPI document."""

FILE = obj(
    {
        "id": STRING,
        "object": const("file"),
        "bytes": INTEGER,
        "created_at": INTEGER,
        "filename": STRING,
        "purpose": STRING,
        "status": STRING,
    },
    {"expires_at": nullable(INTEGER), "status_details": nullable(STRING)},
    title="FileObject",
)
FILE_LIST = obj(
    {"object": const("list"), "data": array(FILE), "has_more": {"type": "boolean"}},
    {"first_id": nullable(STRING), "last_id": nullable(STRING)},
    title="FileList",
)
DELETED = obj(
    {"id": STRING, "object": const("file"), "deleted": {"type": "boolean"}}, title="FileDeleted"
)
COUNTS = obj({"total": INTEGER, "completed": INTEGER, "failed": INTEGER})
BATCH = obj(
    {
        "id": STRING,
        "object": const("batch"),
        "endpoint": STRING,
        "input_file_id": STRING,
        "completion_window": STRING,
        "status": STRING,
        "created_at": INTEGER,
        "request_counts": COUNTS,
    },
    {
        "output_file_id": nullable(STRING),
        "error_file_id": nullable(STRING),
        "errors": {"type": ["object", "null"]},
        "metadata": {"type": ["object", "null"]},
        **{
            f"{when}_at": nullable(INTEGER)
            for when in (
                "in_progress",
                "expires",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
    },
    title="Batch",
)
BATCH_LIST = obj(
    {"object": const("list"), "data": array(BATCH), "has_more": {"type": "boolean"}},
    {"first_id": nullable(STRING), "last_id": nullable(STRING)},
    title="BatchList",
)
LIST_QUERY = {"limit": {"type": "integer", "minimum": 1, "maximum": 10000}, "after": STRING}


class BatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/batches``."""

    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None


def _store(request: Request[Any, Any, Any]) -> Store:
    store: Store | None = getattr(request.app.state, "batch_store", None)
    if store is None:
        raise APIError(503, "the batch runner is not running", code="unavailable")
    return store


def _owner() -> str | None:
    """The request's tenant (``None`` on a server without keys): the owner of what it
    creates, and the only one whose files and batches it sees."""
    return current_owner()


def _room(store: Store) -> int | None:
    """Bytes the request's key may still store (its ``max_file_bytes`` less what its
    files hold); ``None``: no cap."""
    key = current_key.get()
    if key is None or key.max_file_bytes is None:
        return None
    return max(0, key.max_file_bytes - store.owner_bytes(key.name))


def _over_quota() -> APIError:
    key = current_key.get()
    cap = key.max_file_bytes if key is not None else 0
    return APIError(
        400,
        f"this file would take the API key's files past its max_file_bytes ({cap} bytes); "
        "delete files it no longer needs",
        param="file",
        code="storage_limit_exceeded",
    )


def _file_not_found(file_id: str) -> APIError:
    return APIError(404, f"no file with id {file_id!r}", param="file_id", code="not_found")


def _limit(request: Request[Any, Any, Any]) -> int:
    raw = request.query_params.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise APIError(400, "limit must be a whole number", param="limit") from None
    if not 1 <= limit <= 10000:
        raise APIError(400, "limit must be between 1 and 10000", param="limit")
    return limit


def _page(items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "has_more": len(items) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


MAX_FILENAME = 255
"""The longest upload name kept (a longer one is cut)."""


@post(
    "/v1/files",
    status_code=200,
    request_max_body_size=MAX_UPLOAD,
    opt={
        FORM_OPTION: UPLOAD_FORM,
        REPLIES_OPTION: {200: reply("the file", FILE)},
        ERRORS_OPTION: {
            413: "the file is larger than 1 GiB",
            400: "the file would take the key past its max_file_bytes",
        },
    },
)
async def upload_file(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Upload a file (``multipart/form-data`` with ``file`` and ``purpose``: ``batch`` for
    a JSONL batch input)."""
    store = _store(request)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(415, "upload the file as multipart/form-data", code="unsupported_media_type")
    form = await request.form()
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose not in PURPOSES:
        raise APIError(400, f"purpose must be one of {', '.join(PURPOSES)}", param="purpose")
    if upload is None or isinstance(upload, str):
        raise APIError(400, "the form needs a file field", param="file")
    file_id = new_id("file-")
    path = store.path(file_id)
    room = _room(store)
    try:
        written = 0
        with path.open("wb") as out:
            while chunk := await upload.read(CHUNK):
                written += len(chunk)
                if room is not None and written > room:
                    raise _over_quota()
                await asyncio.to_thread(out.write, chunk)
    except BaseException:  # the client went away, the disk filled: no partial file stays
        path.unlink(missing_ok=True)
        raise
    name = (upload.filename or "upload.jsonl")[:MAX_FILENAME]
    return store.add_file(file_id, name, str(purpose), _owner())


@get("/v1/files", opt={REPLIES_OPTION: {200: reply("files, newest first", FILE_LIST)},
                       QUERY_OPTION: {**LIST_QUERY, "purpose": STRING}})  # fmt: skip
async def list_files(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Files, newest first (``purpose``, ``limit``, ``after``)."""
    limit = _limit(request)
    found = _store(request).files(
        request.query_params.get("purpose"),
        limit + 1,
        request.query_params.get("after"),
        _owner(),
    )
    return _page(found, limit)


@get("/v1/files/{file_id:str}", opt={REPLIES_OPTION: {200: reply("the file", FILE)}})
async def retrieve_file(request: Request[Any, Any, Any], file_id: str) -> dict[str, Any]:
    """One file's object."""
    found = _store(request).file(file_id, _owner())
    if found is None:
        raise _file_not_found(file_id)
    return found


@get(
    "/v1/files/{file_id:str}/content",
    opt={REPLIES_OPTION: {200: reply("the bytes", STRING, media_type="application/jsonl")}},
)
async def file_content(request: Request[Any, Any, Any], file_id: str) -> File:
    """A file's content (streamed from disk)."""
    store = _store(request)
    found = store.file(file_id, _owner())
    if found is None:
        raise _file_not_found(file_id)
    return File(store.path(file_id), filename=found["filename"], media_type="application/jsonl")


@delete(
    "/v1/files/{file_id:str}",
    status_code=200,
    opt={REPLIES_OPTION: {200: reply("deleted", DELETED)}},
)
async def delete_file(request: Request[Any, Any, Any], file_id: str) -> dict[str, Any]:
    """Delete a file (a batch still reading it fails its remaining lines)."""
    if not _store(request).delete_file(file_id, _owner()):
        raise _file_not_found(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@post(
    "/v1/batches",
    status_code=200,
    opt={BODY_OPTION: BatchCreate, REPLIES_OPTION: {200: reply("the batch", BATCH)}},
)
async def create_batch(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Start a batch: every line of ``input_file_id`` sent to ``endpoint``, in the
    server's idle capacity (after interactive requests), results in an output file."""
    store = _store(request)
    body = await decode_body(request, BatchCreate)
    source = store.file(body.input_file_id, _owner())
    if source is None:
        raise APIError(
            404, f"no file with id {body.input_file_id!r}", param="input_file_id", code="not_found"
        )
    if source["purpose"] != "batch":
        raise APIError(400, "the input file's purpose must be batch", param="input_file_id")
    now = int(time.time())
    batch: dict[str, Any] = {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": body.endpoint,
        "errors": None,
        "input_file_id": body.input_file_id,
        "completion_window": body.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": body.metadata,
    }
    store.add_batch(batch, _owner())
    runner: Runner = request.app.state.batch_runner
    runner.poke()
    return batch


def _batch(store: Store, batch_id: str) -> dict[str, Any]:
    found = store.batch(batch_id, _owner())
    if found is None:
        raise APIError(404, f"no batch with id {batch_id!r}", param="batch_id", code="not_found")
    return found


@get("/v1/batches/{batch_id:str}", opt={REPLIES_OPTION: {200: reply("the batch", BATCH)}})
async def retrieve_batch(request: Request[Any, Any, Any], batch_id: str) -> dict[str, Any]:
    """One batch, with its progress (``request_counts``)."""
    return _batch(_store(request), batch_id)


@get("/v1/batches", opt={REPLIES_OPTION: {200: reply("batches, newest first", BATCH_LIST)},
                         QUERY_OPTION: LIST_QUERY})  # fmt: skip
async def list_batches(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Batches, newest first (``limit``, ``after``)."""
    limit = _limit(request)
    found = _store(request).batches(limit + 1, request.query_params.get("after"), _owner())
    return _page(found, limit)


@post(
    "/v1/batches/{batch_id:str}/cancel",
    status_code=200,
    opt={
        REPLIES_OPTION: {200: reply("the batch, cancelling", BATCH)},
        ERRORS_OPTION: {409: "the batch has ended"},
    },
)
async def cancel_batch(request: Request[Any, Any, Any], batch_id: str) -> Response[Any]:
    """Cancel a batch: no new line starts; the lines running finish and are kept in its
    output; then it is ``cancelled``."""
    store = _store(request)
    batch = _batch(store, batch_id)
    if batch["status"] not in ("validating", "in_progress", "cancelling"):
        raise APIError(409, f"the batch is {batch['status']}", code="batch_ended")
    if batch["status"] != "cancelling":
        batch.update(status="cancelling", cancelling_at=int(time.time()))
        store.save(batch)
    request.app.state.batch_runner.poke()
    return Response(batch)


def batch_routes() -> list[HTTPRouteHandler]:
    """The route handlers of this module."""
    return [
        upload_file,
        list_files,
        retrieve_file,
        file_content,
        delete_file,
        create_batch,
        retrieve_batch,
        list_batches,
        cancel_batch,
    ]
