"""Batched vs one-by-one ``/v1/embeddings`` on a real server, side by side.

Starts ``mlxcore serve MODEL`` (OpenBLAS preloaded as the CLI does), then, for several
alternating rounds, embeds N texts in one request and the same N texts one request at a
time, with the official ``openai`` client, and prints the time per input of each and
their ratio (median over rounds).

    .venv/bin/python scripts/embeddings_bench.py MODEL [--inputs 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

from mlxcore.testing.server import Server, free_port

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def texts(n: int, round_: int) -> list[str]:
    """N distinct sentences of 8-40 words."""
    out = []
    for i in range(n):
        length = 8 + (i * 7 + round_) % 33
        out.append(" ".join(WORDS[(i + j + round_) % len(WORDS)] for j in range(length)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "server.log"
    cmd = [sys.executable, "-m", "mlxcore", "serve", args.model, "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "--log-level", "warning"], stdout=out, stderr=out)
    server = Server(proc, port, log)
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        client.embeddings.create(model="", input=texts(4, 99))  # warm up
        batched, single = [], []
        for r in range(args.rounds):
            items = texts(args.inputs, r)
            order = ("batch", "single") if r % 2 == 0 else ("single", "batch")
            for how in order:
                start = time.perf_counter()
                if how == "batch":
                    client.embeddings.create(model="", input=items)
                else:
                    for item in items:
                        client.embeddings.create(model="", input=item)
                per_input = (time.perf_counter() - start) / len(items)
                (batched if how == "batch" else single).append(per_input)
            print(
                f"round {r + 1}: batched {batched[-1] * 1e3:.2f} ms/input, "
                f"one by one {single[-1] * 1e3:.2f} ms/input, "
                f"{single[-1] / batched[-1]:.1f}x",
                flush=True,
            )
        ratios = [s / b for s, b in zip(single, batched, strict=True)]
        print(
            f"median: batched {statistics.median(batched) * 1e3:.2f} ms/input, one by one "
            f"{statistics.median(single) * 1e3:.2f} ms/input; batched is "
            f"{statistics.median(ratios):.1f}x faster per input ({args.inputs} inputs)"
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
