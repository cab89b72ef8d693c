#!/usr/bin/env python3
"""Two API keys on one server (docs/security.md), measured as a new user runs it: the
default model, default flags but ``--api-keys-file``.

``cache``: a fresh ~1,500-token prompt per round, sent by key A (cold), then by key B,
then by A again; B's TTFT against A's cold one (1.0: B learns nothing from A's cache)
and A's warm one against its cold one (what a hit would have shown). ``--disk`` adds
the disk tier (``--plugin disk-cache``).

``fair``: key B's requests, one every 1.5 s, on an idle server ("alone"); then the same
while key A has ``--flood`` requests in flight at once (32 running, the rest queued;
sent by another process, not streamed, as an evaluation run sends them;
``--streamed-flood`` adds a run with A's requests streamed): B's median TTFT against
alone, with B on its own key (round-robin admission and its fair share of the batch)
and, for contrast, with B sending on A's key (one tenant: B's requests queue behind
A's).

docs/benchmarks.md ("Tenants") records a run.

Usage: .venv/bin/python scripts/tenant_bench.py cache|fair [--rounds 6] [--disk]
       [--flood 200] [--b-requests 10] [--model PATH] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mlxcore.bench.client import HttpTarget, stream_chat
from mlxcore.models.default import ensure_default_model
from mlxcore.testing.replicas import Replica

KEYS = '[keys.a]\nkey = "sk-a"\n[keys.b]\nkey = "sk-b"\n'


def client(key: str, connections: int = 8) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=600)


def long_prompt(round_: int) -> list[dict[str, str]]:
    words = " ".join(f"item{round_}x{i} holds" for i in range(220))
    return [{"role": "user", "content": f"Round {round_}. Summarise: {words}"}]


async def cache_rounds(url: str, rounds: int) -> list[dict[str, float]]:
    target = HttpTarget(url, "m")
    rows = []
    async with client("sk-a") as a, client("sk-b") as b:
        await stream_chat(a, target, long_prompt(-1), 4)  # warm-up (compiles, loads)
        for r in range(rounds):
            messages = long_prompt(r)
            cold = await stream_chat(a, target, messages, 4)
            other = await stream_chat(b, target, messages, 4)
            warm = await stream_chat(a, target, messages, 4)
            rows.append(
                {
                    "prompt_tokens": cold.prompt_tokens,
                    "cold_ms": 1000 * cold.ttft_s,
                    "other_key_ms": 1000 * other.ttft_s,
                    "other_key_cached": other.cached_tokens,
                    "warm_ms": 1000 * warm.ttft_s,
                    "warm_cached": warm.cached_tokens,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


B_WORDS = 0
"""Words of context before B's question (``--b-words``; 0: a one-line question)."""


def short(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question {i}: name a colour and say why."}]


def b_prompt(i: int) -> list[dict[str, str]]:
    """B's request: its question, after ``B_WORDS`` words of its own context."""
    context = " ".join(f"line{i}x{n} says hello" for n in range(B_WORDS // 3))
    question = f"Question {i}: name a colour and say why."
    return [{"role": "user", "content": f"{context}\n\n{question}" if context else question}]


async def b_requests(url: str, key: str, count: int) -> list[float]:
    target = HttpTarget(url, "m")
    out = []
    async with client(key) as b:
        for i in range(count):
            run = await stream_chat(b, target, short(1000 + i), 16)
            out.append(1000 * run.ttft_s)
            await asyncio.sleep(0.3)
    return out


async def _flood(url: str, flood: int, stream: bool) -> dict[str, float]:
    """Key A's requests, all at once (in a process of their own, so that reading A's
    streams does not delay B's in the measuring process)."""
    target = HttpTarget(url, "m")
    async with client("sk-a", connections=flood) as a:

        async def one(i: int) -> float:
            if stream:
                return (await stream_chat(a, target, short(i), 64)).ttft_s
            body = {"model": "m", "messages": short(i), "max_tokens": 64, "temperature": 0}
            sent = time.perf_counter()
            answer = await a.post(f"{url}/v1/chat/completions", json=body)
            answer.raise_for_status()
            return time.perf_counter() - sent

        started = time.perf_counter()
        times = await asyncio.gather(*(one(i) for i in range(flood)))
    return {
        "a_p50_ms": 1000 * statistics.median(times),
        "flood_wall_s": time.perf_counter() - started,
    }


def _flood_process(url: str, flood: int, stream: bool, out: Any) -> None:
    out.put(asyncio.run(_flood(url, flood, stream)))


async def spaced_b(url: str, key: str, count: int, gap: float) -> list[float]:
    """B's requests, one every ``gap`` seconds whether or not the last has answered."""
    target = HttpTarget(url, "m")
    async with client(key) as b:

        async def one(i: int) -> float:
            await asyncio.sleep(i * gap)
            return 1000 * (await stream_chat(b, target, b_prompt(1000 + i), 2)).ttft_s

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def flooded(url: str, flood: int, b_key: str, count: int, stream: bool) -> dict[str, Any]:
    """B's requests while A's flood is in flight."""
    import multiprocessing

    results: Any = multiprocessing.Queue()
    process = multiprocessing.Process(target=_flood_process, args=(url, flood, stream, results))
    process.start()
    time.sleep(5.0)  # the flood is admitted and queued
    b = asyncio.run(spaced_b(url, b_key, count, 1.5))
    a = results.get(timeout=3600)
    process.join()
    return {"b_ttft_ms": b, **a}


def start(model: Path, logs: Path, flags: tuple[str, ...], name: str) -> Replica:
    replica = Replica(name, model, logs, flags=flags, events=False)
    replica.start()
    return replica


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=("cache", "fair"))
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--disk", action="store_true", help="with --plugin disk-cache")
    parser.add_argument("--flood", type=int, default=200)
    parser.add_argument("--b-requests", type=int, default=10)
    parser.add_argument(
        "--streamed-flood", action="store_true", help="also a run with A's requests streamed"
    )
    parser.add_argument(
        "--b-words", type=int, default=0, help="words of context in each of B's requests"
    )
    parser.add_argument("--no-same-key", action="store_true", help="skip the run with B on A's key")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    global B_WORDS
    B_WORDS = args.b_words
    model = Path(args.model) if args.model else ensure_default_model()
    logs = Path(tempfile.mkdtemp(prefix="tenant-bench-"))
    keys = logs / "keys.toml"
    keys.write_text(KEYS)
    flags: tuple[str, ...] = ("--api-keys-file", str(keys))
    if args.disk:
        flags += ("--plugin", "disk-cache", "--disk-cache-dir", str(logs / "kv"))
    replica = start(model, logs, flags, "tenants")
    result: dict[str, Any] = {"scenario": args.scenario, "flags": list(flags)}
    try:
        if args.scenario == "cache":
            rows = asyncio.run(cache_rounds(replica.url, args.rounds))
            result["rounds"] = rows
            result["other_key_over_cold"] = statistics.median(
                r["other_key_ms"] / r["cold_ms"] for r in rows
            )
            result["warm_over_cold"] = statistics.median(r["warm_ms"] / r["cold_ms"] for r in rows)
            result["other_key_cached_max"] = max(r["other_key_cached"] for r in rows)
        else:
            asyncio.run(b_requests(replica.url, "sk-b", 2))  # warm-up
            alone = asyncio.run(spaced_b(replica.url, "sk-b", args.b_requests, 1.5))
            result["b_alone_ms"] = alone
            print("alone", json.dumps(alone), flush=True)
            runs = [("own_key", "sk-b", False)]
            if not args.no_same_key:
                runs.append(("a_key", "sk-a", False))
            if args.streamed_flood:
                runs.append(("own_key_streamed_flood", "sk-b", True))
            for label, key, stream in runs:
                found = flooded(replica.url, args.flood, key, args.b_requests, stream)
                result[label] = found
                result[f"{label}_median_over_alone"] = statistics.median(
                    found["b_ttft_ms"]
                ) / statistics.median(alone)
                print(label, json.dumps(found), flush=True)
    finally:
        replica.stop()
    summary = {k: v for k, v in result.items() if not isinstance(v, list | dict)}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
