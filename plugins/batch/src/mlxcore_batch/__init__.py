"""mlxcore plugin ``batch``: OpenAI's Files and Batch APIs.

``/v1/files`` (upload JSONL with ``purpose=batch``, list, retrieve, content, delete) and
``/v1/batches`` (create, retrieve, list, cancel) for chat completions, completions,
embeddings and the Responses API. Each batch runs in the server's idle capacity: its
lines go through the server's own routes at the lowest priority, so interactive requests
are admitted first; results are appended to the output and error files as they come.
State lives in SQLite and files on disk under ``--batch-dir``: a restart (even after
``kill -9``) resumes each batch where it stopped, and no ``custom_id`` is written twice.
Not loaded unless named: ``--plugin batch``. See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.hookspecs import OptionGroup
from mlxcore.settings import add_flags, positive_int, read_settings, setting

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with ``--plugin batch`` (it writes to disk)."""


@attrs.frozen
class BatchSettings:
    """The batch plugin's settings; each default is stated here only."""

    batch_dir: str = setting(
        "~/.cache/mlxcore/batches", metavar="DIR",
        help="where uploaded files, batch results and the batches' state (SQLite) live",
    )  # fmt: skip
    batch_concurrency: int = setting(
        8, type=positive_int, metavar="N",
        help="most batch lines in flight at once (they run after interactive requests)",
    )  # fmt: skip


_settings: list[BatchSettings] = []


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--batch-dir`` and ``--batch-concurrency``."""
    add_flags(parser, BatchSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Keep the settings for the server's start."""
    if not _settings:
        _settings.append(read_settings(config, BatchSettings))


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """``/v1/files`` and ``/v1/batches``."""
    from mlxcore_batch.routes import batch_routes

    return batch_routes()


@hookimpl
def mlxcore_server_lifespan(app: Any) -> Any:
    """Open the store and run the batch runner while the server serves."""
    return _running(app, _settings[0] if _settings else BatchSettings())


@contextlib.asynccontextmanager
async def _running(app: Any, settings: BatchSettings) -> AsyncIterator[None]:
    from mlxcore_batch.runner import Runner
    from mlxcore_batch.store import Store

    store = Store(Path(settings.batch_dir).expanduser())
    runner = Runner(app, store, settings.batch_concurrency)
    app.state.batch_store, app.state.batch_runner = store, runner
    task = asyncio.ensure_future(runner.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        store.close()
