"""Prefix-cache memory for sessions sharing one long system prompt, read from ``/metrics``.

Starts ``mlxcore serve`` on a test model once per cache strategy (``radix``, the default,
and ``lru``, the whole-entry cache mlxcore had before it), sends ``--sessions`` chat
requests that share a ~``--system-tokens`` system prompt and differ in their user message,
one after the other, and prints what ``/metrics`` then says the prefix cache holds,
next to one prompt's keys and values and the sessions' own tokens.

    .venv/bin/python scripts/shared_prefix_memory.py [--model qwen3_5|qwen3]
        [--sessions 16] [--system-tokens 8192]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

from mlxcore.testing.models import build_test_model

GAUGES = (
    "prefix_cache_bytes",
    "prefix_cache_entries",
    "prefix_cache_nodes",
    "prefix_cache_snapshots",
    "memory_kv_bytes_per_token",
    "memory_prefix_cache_budget_bytes",
    "prompt_tokens_processed",
    "prefix_cache_hits",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("mlxcore_") and "{" not in line:
            key, _, value = line.partition(" ")
            out[key.removeprefix("mlxcore_")] = float(value)
    return out


def run(model: str, strategy: str, sessions: int, system_tokens: int) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxcore", "serve", model, "--port", str(port),
         "--served-model-name", "m", "--cache-strategy", strategy,
         "--prefix-cache-size", str(4 * system_tokens * sessions)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.5)
        system = "You are the coding agent of this repository; follow its rules. " * (
            system_tokens // 13
        )
        started = time.perf_counter()
        prompt_tokens = 0
        for i in range(sessions):
            body = {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Session {i}: summarise module {i} briefly."},
                ],
                "max_tokens": 4,
                "temperature": 0,
            }
            reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).json()
            prompt_tokens = reply["usage"]["prompt_tokens"]
        seconds = time.perf_counter() - started
        values = metrics(base)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    out = {k: values.get(k, 0.0) for k in GAUGES}
    out.update(seconds=round(seconds, 1), prompt_tokens=prompt_tokens)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("qwen3_5", "qwen3"), default="qwen3_5")
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=8192)
    args = parser.parse_args()
    model = str(build_test_model(args.model, size=args.size))
    print(f"{args.sessions} sessions on one ~{args.system_tokens}-token system prompt, {model}")
    print("| cache | prefix-cache bytes | one prompt's KV | ratio | nodes | snapshots "
          "| prompt tokens computed | time |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for strategy in ("radix", "lru"):
        m = run(model, strategy, args.sessions, args.system_tokens)
        one = m["prompt_tokens"] * m["memory_kv_bytes_per_token"]
        print(
            f"| {strategy} | {m['prefix_cache_bytes'] / 2**20:.1f} MB | {one / 2**20:.1f} MB "
            f"| {m['prefix_cache_bytes'] / one:.2f}x | {m['prefix_cache_nodes']:.0f} "
            f"| {m['prefix_cache_snapshots']:.0f} | {m['prompt_tokens_processed']:,.0f} "
            f"| {m['seconds']:.0f} s |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
