"""``POST /api/pull`` and ``DELETE /api/delete``: Ollama's model management, through
mlxcore's model manager (:mod:`mlxcore.models.manager`).

A pull downloads a Hugging Face repo (``owner/name``; resumable, no network when it is
here already) and serves it from then on under that name, loaded on its first request
like any configured model, with the default model's settings. A delete removes a pulled
model's files, and stops serving it; a model of the server's configuration is not
removed, nor one that is loaded. Both are on unless ``--no-ollama-pull``.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
from litestar import Request, Response, delete, post

from mlxcore.errors import ModelLoadError
from mlxcore.models import manager
from mlxcore.models.catalog import CatalogEntry, ModelSpec
from mlxcore.models.download import DownloadError
from mlxcore.routes import ADMIN_OPTION
from mlxcore.server.errors import APIError, overloaded
from mlxcore.server.frontend import decode_body
from mlxcore.server.openapi import BODY_OPTION, ERRORS_OPTION, REPLIES_OPTION, reply
from mlxcore.server.router import LOADED, ModelRouter
from mlxcore.server.sse import event_stream
from mlxcore.settings import read_settings
from mlxcore_ollama.encode import error_line, line
from mlxcore_ollama.models import TAG
from mlxcore_ollama.replies import NDJSON, PROGRESS, STATUS, streamed
from mlxcore_ollama.schemas import REPO_PATTERN, DeleteRequest, PullRequest
from mlxcore_ollama.settings import OllamaSettings

REPO_ID = re.compile(REPO_PATTERN)
REPORT_EVERY = 0.25
"""Seconds between two progress lines of one file."""


def _router(request: Request[Any, Any, Any]) -> ModelRouter:
    router: ModelRouter = request.app.state.router
    return router


def _allowed(request: Request[Any, Any, Any]) -> None:
    if read_settings(request.app.state.config, OllamaSettings).no_ollama_pull:
        raise APIError(403, "pulling and deleting models is off on this server (--no-ollama-pull)")


def _repo(name: str | None) -> str:
    """The repo id a pull or delete names (Ollama's ``:latest`` tag dropped)."""
    if not REPO_ID.fullmatch(name or ""):
        raise APIError(
            400, "model must be a Hugging Face repo id such as mlx-community/Qwen3-4B-4bit"
        )
    return (name or "").removesuffix(TAG)


def _failure(exc: ModelLoadError) -> APIError:
    if isinstance(exc, DownloadError) and exc.status == 503:
        return overloaded(str(exc), retry_after=30)
    status = exc.status if isinstance(exc, DownloadError) else 400
    return APIError(status, str(exc))


def _serve(router: ModelRouter, repo: str, folder: Path) -> None:
    """Serve the pulled ``repo`` (from its local folder) unless it is served already."""
    if router.find(repo) is not None:
        return
    default = router.default.spec
    config = attrs.evolve(default.config, model=str(folder), served_model_name=())
    router.add(ModelSpec(CatalogEntry(name=repo, source=str(folder)), config, default.hooks))


async def _pulled(request: Request[Any, Any, Any], repo: str) -> AsyncIterator[dict[str, Any]]:
    """Progress objects of one pull, then ``{"status": "success"}`` (an error raises)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    last: dict[str, float] = {}

    def progress(name: str, etag: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last.get(name, 0.0) < REPORT_EVERY:
            return
        last[name] = now
        status = {"status": f"pulling {name}", "digest": etag, "total": total, "completed": done}
        loop.call_soon_threadsafe(queue.put_nowait, status)

    yield {"status": "pulling manifest"}
    work = loop.run_in_executor(
        None, functools.partial(manager.pull, repo, progress=False, on_progress=progress)
    )
    while not work.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        waiting: set[asyncio.Future[Any]] = {getter, work}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield getter.result()
        else:
            getter.cancel()
    try:
        folder, _ = work.result()
    except ModelLoadError as exc:
        raise _failure(exc) from None
    yield {"status": "verifying files"}
    _serve(_router(request), repo, folder)
    yield {"status": "success"}


@post(
    "/pull",
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        BODY_OPTION: PullRequest,
        REPLIES_OPTION: {200: streamed("the progress, then success", PROGRESS)},
        ERRORS_OPTION: {403: "pulling is off (--no-ollama-pull), or not an admin key"},
    },
)
async def pull(request: Request[Any, Any, Any]) -> Any:
    """Download a model from the Hugging Face Hub and serve it (progress as NDJSON)."""
    body = await decode_body(request, PullRequest)
    _allowed(request)
    repo = _repo(body.model or body.name)
    steps = _pulled(request, repo)
    if body.stream:

        async def lines() -> AsyncIterator[bytes]:
            async for step in steps:
                yield line(step)

        return event_stream(lines(), error_line, keepalive=None, media_type=NDJSON)
    status: dict[str, Any] = {}
    async for step in steps:
        status = step
    return Response(status)


@delete(
    "/delete",
    status_code=200,
    opt={
        ADMIN_OPTION: True,
        BODY_OPTION: DeleteRequest,
        REPLIES_OPTION: {200: reply("deleted", STATUS)},
        ERRORS_OPTION: {
            403: "deleting is off (--no-ollama-pull), or not an admin key",
            409: "the model is in use",
        },
    },
)
async def remove(request: Request[Any, Any, Any]) -> dict[str, str]:
    """Delete a pulled model's files and stop serving it."""
    body = await decode_body(request, DeleteRequest)
    _allowed(request)
    repo = _repo(body.model or body.name)
    router = _router(request)
    slot = router.find(repo)
    if slot is not None and not slot.added:
        raise APIError(409, f"{repo} is served from this server's configuration; remove it there")
    if slot is not None and (slot.state == LOADED or slot.loading is not None):
        raise APIError(409, f"{repo} is loaded; unload it first (keep_alive 0)")
    try:
        local = manager.find(repo)
    except ModelLoadError:
        raise APIError(404, f"model {repo!r} not found") from None
    if local.where != "hf-cache":
        raise APIError(404, f"model {repo!r} not found")
    if slot is not None:
        router.remove(slot)
    await asyncio.get_running_loop().run_in_executor(None, manager.remove, local)
    return {"status": "success"}


HANDLERS = [pull, remove]
