"""Interactive streams with and without a large batch running beside them.

Starts ``mlxcore serve MODEL --plugin batch`` (the embedded default model unless
``--model``), then alternates rounds of ``--streams`` concurrent greedy chat streams
(``--tokens`` tokens each, ``ignore_eos``) without and with a ``--lines``-line batch in
progress (each line a one-token chat; a new batch for each round, cancelled after it),
and prints the streams' inter-token gaps (p50,
p99) and TTFT for both, and their ratios. The batch runs at background priority: its
lines wait while the streams run, so what the streams can feel is the runner's own work
on the server's event loop (reading the input, writing results, SQLite) and the lines'
admission. Usage::

    .venv/bin/python scripts/batch_beside_streams.py [--model M] [--lines 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mlxcore.testing.server import Server, ServerPool


def batch_input(lines: int) -> bytes:
    """A batch of one-token chats (distinct prompts, so no line is a cache hit)."""
    out = io.StringIO()
    for i in range(lines):
        body = {"messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 1}
        row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
        out.write(json.dumps({**row, "body": body}) + "\n")
    return out.getvalue().encode()


async def one_stream(client: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, list[float]]:
    """TTFT and inter-token gaps (seconds) of one greedy stream."""
    body = {
        "messages": [{"role": "user", "content": f"Count from {i} upwards, one per line."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    arrivals: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - started, gaps


async def streams_round(
    server: Server, streams: int, tokens: int
) -> tuple[list[float], list[float]]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
        done = await asyncio.gather(*(one_stream(client, i, tokens) for i in range(streams)))
    return [ttft for ttft, _ in done], [gap for _, gaps in done for gap in gaps]


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def upload(server: Server, lines: int) -> str:
    """The batch input file's id."""
    files = {"file": ("batch.jsonl", batch_input(lines), "application/jsonl")}
    answer = httpx.post(
        f"{server.base_url}/v1/files", data={"purpose": "batch"}, files=files, timeout=600
    )
    return str(answer.json()["id"])


def start_batch(server: Server, file_id: str) -> str:
    """A new batch of ``file_id``, once it runs."""
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        batch = client.post(
            "/v1/batches",
            json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                  "completion_window": "24h"},
        ).json()  # fmt: skip
        return wait_for(client, str(batch["id"]), ("in_progress",))


def cancel_batch(server: Server, batch_id: str) -> dict[str, Any]:
    """Cancel a batch and wait until it stopped; its last state."""
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        client.post(f"/v1/batches/{batch_id}/cancel")
        wait_for(client, batch_id, ("cancelled", "completed", "failed"))
        return client.get(f"/v1/batches/{batch_id}").json()  # type: ignore[no-any-return]


def wait_for(client: httpx.Client, batch_id: str, states: tuple[str, ...]) -> str:
    for _ in range(1200):
        state = client.get(f"/v1/batches/{batch_id}").json()
        if state["status"] in states:
            return batch_id
        time.sleep(0.25)
    raise RuntimeError(f"batch {batch_id} never reached {states}: {state}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    from mlxcore.models.default import ensure_default_model

    model = args.model or str(ensure_default_model())
    with tempfile.TemporaryDirectory() as folder:
        pool = ServerPool(Path(folder))
        try:
            server = pool(model, "--plugin", "batch", "--batch-dir", str(Path(folder) / "b"))
            asyncio.run(streams_round(server, args.streams, 8))  # warm-up
            alone: tuple[list[float], list[float]] = ([], [])
            beside: tuple[list[float], list[float]] = ([], [])
            file_id = upload(server, args.lines)
            for round_ in range(args.rounds):  # alternating, so drift hits both alike
                ttft, gaps = asyncio.run(streams_round(server, args.streams, args.tokens))
                alone[0].extend(ttft)
                alone[1].extend(gaps)
                p99_alone = p(gaps, 99)
                batch_id = start_batch(server, file_id)
                ttft, gaps = asyncio.run(streams_round(server, args.streams, args.tokens))
                beside[0].extend(ttft)
                beside[1].extend(gaps)
                state = cancel_batch(server, batch_id)
                print(
                    f"round {round_ + 1}: p99 alone {p99_alone * 1000:.1f} ms, beside "
                    f"{p(gaps, 99) * 1000:.1f} ms; batch {state['status']} "
                    f"{state['request_counts']}"
                )
            rows = []
            for name, (ttft, gaps) in (("alone", alone), ("beside the batch", beside)):
                rows.append((name, p(gaps, 50), p(gaps, 99), statistics.median(ttft)))
                print(
                    f"{name:>17}: inter-token p50 {rows[-1][1] * 1000:.1f} ms, "
                    f"p99 {rows[-1][2] * 1000:.1f} ms, TTFT p50 {rows[-1][3] * 1000:.0f} ms "
                    f"({len(gaps)} gaps)"
                )
            print(
                f"ratios beside/alone: inter-token p99 {rows[1][2] / rows[0][2]:.3f}, "
                f"p50 {rows[1][1] / rows[0][1]:.3f}, TTFT p50 {rows[1][3] / rows[0][3]:.3f}"
            )
        finally:
            pool.close()


if __name__ == "__main__":
    main()
