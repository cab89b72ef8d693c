"""The batch runner's files: input read in bounded steps off the event loop, partial
result files removed when a batch fails on a runner fault."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mlxcore_batch.runner import LINES_PER_READ, Runner, read_lines
from mlxcore_batch.store import EVERYONE, Store


def test_read_lines_yields_every_line_in_order_in_bounded_steps(tmp_path: Path) -> None:
    source = tmp_path / "input.jsonl"
    count = 3 * LINES_PER_READ + 7
    rows = [json.dumps({"custom_id": f"r{i}"}) for i in range(count)]
    source.write_text("\n".join([*rows[:5], "", "not json", *rows[5:]]) + "\n")

    async def read() -> list[Any]:
        return [entry async for entry in read_lines(source)]

    entries = asyncio.run(read())
    items = [item["custom_id"] for _, item, _ in entries if item is not None]
    assert items == [f"r{i}" for i in range(count)]
    assert [(n, err) for n, item, err in entries if item is None] == [(7, "not JSON")]


def test_a_runner_fault_fails_the_batch_and_removes_its_partial_results(tmp_path: Path) -> None:
    store = Store(tmp_path)
    batch = {
        "id": "batch_x",
        "object": "batch",
        "status": "in_progress",
        "created_at": 1,
        "input_file_id": "file-missing",
        "endpoint": "/v1/chat/completions",
    }
    store.add_batch(batch, None)
    runner = Runner(app=None, store=store, concurrency=1)
    partial = [store.files_dir / "batch_x.output.part", store.files_dir / "batch_x.error.part"]
    for path in partial:
        path.write_text('{"custom_id": "a"}\n')

    async def run_once() -> None:
        task = asyncio.create_task(runner.run())
        for _ in range(200):  # the missing input file is the fault
            await asyncio.sleep(0.01)
            found = store.batch("batch_x", EVERYONE)
            if found is not None and found["status"] == "failed":
                break
        task.cancel()

    asyncio.run(run_once())
    failed = store.batch("batch_x", EVERYONE)
    assert failed is not None and failed["status"] == "failed"
    assert failed["errors"]["data"][0]["code"] == "server_error"
    assert not any(path.exists() for path in partial)
    store.close()
