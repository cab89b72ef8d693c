"""Interactive TTFT with a large batch running against without it (one server, phases
alternating), and the batch's own throughput.

    .venv/bin/python scripts/batch_ttft_bench.py [--model PATH] [--rounds 3] [--requests 12]

Starts a real ``mlxcore serve --plugin batch`` (the embedded default model unless
``--model``). In each "batch" phase a batch of ``--batch-lines`` chats is created, the
interactive requests run while it runs, then it is cancelled; "quiet" phases run the same
interactive requests alone. Prints JSON; docs/operations.md records it.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from mlxcore.testing.server import ServerPool


def ttfts(client: openai.OpenAI, n: int, tag: str) -> list[float]:
    """Time to the first streamed token of ``n`` sequential chats (distinct prompts)."""
    out = []
    for i in range(n):
        started = time.perf_counter()
        stream = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"Question {tag}-{i}: name a colour."}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                out.append(time.perf_counter() - started)
                break
        for _ in stream:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--batch-lines", type=int, default=2000)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--batch-concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    from mlxcore.models.default import ensure_default_model

    folder = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    (folder / "logs").mkdir()
    pool = ServerPool(folder / "logs")
    report: dict[str, Any] = {"rounds": []}
    try:
        server = pool(
            args.model or str(ensure_default_model()),
            "--served-model-name", "m", "--plugin", "batch", "--batch-dir", str(folder / "b"),
            "--batch-concurrency", str(args.batch_concurrency),
        )  # fmt: skip
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=600)
        lines = "".join(
            json.dumps({
                "custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "m", "max_tokens": args.batch_tokens, "ignore_eos": True,
                         "messages": [{"role": "user", "content": f"Write about {i}."}]},
            }) + "\n"
            for i in range(args.batch_lines)
        ).encode()  # fmt: skip
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch").id
        ttfts(client, 3, "warm")
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            for phase in ("quiet", "batch") if r % 2 == 0 else ("batch", "quiet"):
                batch = None
                if phase == "batch":
                    batch = client.batches.create(
                        input_file_id=file_id, endpoint="/v1/chat/completions",
                        completion_window="24h",
                    )  # fmt: skip
                    while client.batches.retrieve(batch.id).request_counts.completed < 16:
                        time.sleep(0.1)
                    began = client.batches.retrieve(batch.id).request_counts.completed
                    started = time.perf_counter()
                times = ttfts(client, args.requests, f"{r}{phase}")
                row[phase] = statistics.median(times)
                row[f"{phase}_each"] = [round(t, 3) for t in times]
                if batch is not None:
                    state = client.batches.retrieve(batch.id)
                    done = state.request_counts.completed - began
                    row["batch_lines_per_s"] = round(done / (time.perf_counter() - started), 2)
                    client.batches.cancel(batch.id)
                    while client.batches.retrieve(batch.id).status != "cancelled":
                        time.sleep(0.1)
            row["ratio"] = round(row["batch"] / row["quiet"], 3)
            report["rounds"].append(row)
            print(json.dumps(row), flush=True)
        report["ttft_ratio_median"] = statistics.median(r["ratio"] for r in report["rounds"])
    finally:
        pool.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
