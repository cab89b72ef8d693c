#!/usr/bin/env python3
"""What vllm-router costs in front of one mlxcore replica: 16 streams direct vs through
the router, rounds alternating (ABBA), on the default model with default flags.

Prints per round and the medians: TTFT p50 of the 16 streams and aggregate tokens/s
(all tokens over the wall time of the round); then one stream at a time, alternating,
``--single`` times each: the TTFT the router adds to a lone request, where no batch
hides it. docs/benchmarks.md records a run.

Usage: .venv/bin/python scripts/router_overhead.py [--model PATH] [--rounds 6]
       [--streams 16] [--max-tokens 128] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlxcore.bench import workloads
from mlxcore.bench.client import HttpTarget, concurrent_streams, http_client
from mlxcore.models.default import ensure_default_model
from mlxcore.testing.replicas import Replica, Router


async def _round(url: str, streams: int, max_tokens: int, offset: int) -> dict[str, Any]:
    target = HttpTarget(url, "m")
    prompts = [workloads.writing_messages(offset + i) for i in range(streams)]
    async with http_client(streams * 2) as client:
        runs, figures = await concurrent_streams(client, target, prompts, max_tokens)
    return {
        "aggregate_tok_s": figures["aggregate_tok_s"],
        "ttft_p50_ms": 1000 * statistics.median(r.ttft_s for r in runs),
        "tokens": figures["completion_tokens"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds (ABBA)")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--single", type=int, default=40, help="lone requests per side")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    model = Path(args.model) if args.model else ensure_default_model()
    logs = Path(tempfile.mkdtemp(prefix="router-overhead-"))
    replica = Replica("r1", model, logs, events=False)
    router = Router("round_robin", [replica], model, logs)
    rows: dict[str, list[dict[str, Any]]] = {"direct": [], "router": []}
    lone: dict[str, list[float]] = {"direct": [], "router": []}
    try:
        replica.start()
        router.start()
        urls = {"direct": replica.url, "router": router.url}
        asyncio.run(_round(replica.url, args.streams, 8, 10_000))  # warm-up
        for index in range(args.rounds * 2):
            side = "direct" if index % 4 in (0, 3) else "router"
            row = asyncio.run(_round(urls[side], args.streams, args.max_tokens, index * 100))
            rows[side].append(row)
            print(f"round {index + 1:2d} {side:6s} {row['aggregate_tok_s']:7.1f} tok/s "
                  f"TTFT p50 {row['ttft_p50_ms']:7.1f} ms", flush=True)  # fmt: skip
        for index in range(args.single * 2):
            side = "direct" if index % 4 in (0, 3) else "router"
            row = asyncio.run(_round(urls[side], 1, 8, index))
            lone[side].append(row["ttft_p50_ms"])
    finally:
        router.stop()
        replica.stop()
    med = {
        side: {k: statistics.median(r[k] for r in runs) for k in ("aggregate_tok_s", "ttft_p50_ms")}
        for side, runs in rows.items()
    }
    result = {
        "model": str(model),
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "rounds_per_side": args.rounds,
        "median": med,
        "throughput_ratio": med["router"]["aggregate_tok_s"] / med["direct"]["aggregate_tok_s"],
        "ttft_p50_added_ms": med["router"]["ttft_p50_ms"] - med["direct"]["ttft_p50_ms"],
        "lone_ttft_p50_ms": {side: statistics.median(v) for side, v in lone.items()},
        "lone_ttft_added_ms": statistics.median(lone["router"]) - statistics.median(lone["direct"]),
        "rounds": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
