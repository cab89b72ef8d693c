"""Multi-turn sessions of the real agent CLIs, request by request: how much of each prompt
the server reused (``make agent-sessions``; not part of ``make test``).

For each client (Claude Code: ``-p`` then ``--continue -p``; Codex CLI: ``exec`` then
``exec resume --last``; OpenCode: ``run`` then ``run --continue``) a fresh ``mlxcore
serve`` with default flags runs ``--turns`` turns on a test model, hybrid
(``--model qwen3_5``, the default) or dense (``--model qwen3``). The scripted test plugin
answers every request briefly and records its prompt token ids; the server's debug log
gives each request's cached tokens and time to first token. For every request the script
prints the longest token prefix it shares with any earlier request of the session and
what the cache supplied; it fails unless every request has cached tokens >= 90% of that
shared prefix (prefixes under 64 tokens, a template's opening, are only reported).

    .venv/bin/python scripts/agent_sessions.py [--model qwen3_5|qwen3] [--turns 5]
        [--clients claude,codex,opencode] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from agents_e2e import ANSWER, CLIENTS, free_port, install

from mlxcore.testing.models import build_test_model

TURNS = (
    "Say hello",
    "List the files you would look at first.",
    "Again, shorter.",
    "Now explain the plan in one sentence.",
    "Thanks, that is all.",
    "One more time.",
    "And once more.",
)
FINISHED = re.compile(
    r"request (\S+) finished \((\w+)\): (\d+) prompt tokens, (\d+) cached, TTFT ([\d.]+) s"
)
SHARE = 0.9
MIN_SHARED = 64
"""Shared prefixes shorter than this are a template's opening (``<|im_start|>system``),
not a prefix worth a snapshot: they are reported but not held to :data:`SHARE`."""


def serve(model: Path, record: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``mlxcore serve`` with default flags (plus the test plugin); wait for it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxcore", "serve", str(model), "--port", str(port),
         "--accept-any-model-name", "--plugin", "mlxcore.testing.scripted",
         "--test-script", ANSWER, "--test-record", str(record), "--log-level", "debug"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not start; see {log_path}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def requests_of(record: Path, log_path: Path) -> list[dict[str, Any]]:
    """Each generation of the session in arrival order: prompt, shared, cached, TTFT."""
    prompts: dict[str, list[int]] = {}
    order: list[str] = []
    for line in record.read_text().splitlines():
        item = json.loads(line)
        if item["request_id"] not in prompts:
            order.append(item["request_id"])
        prompts[item["request_id"]] = item["prompt"]
    finished = {m[1]: m for m in FINISHED.finditer(log_path.read_text())}
    out: list[dict[str, Any]] = []
    earlier: list[list[int]] = []
    for rid in order:
        prompt = prompts[rid]
        shared = max((common_prefix(prompt, e) for e in earlier), default=0)
        earlier.append(prompt)
        m = finished.get(rid)
        cached = int(m[4]) if m else -1
        out.append(
            {
                "request_id": rid,
                "prompt_tokens": len(prompt),
                "shared": shared,
                "cached": cached,
                "cached_of_shared": round(cached / shared, 4) if shared and m else None,
                "ttft_s": float(m[5]) if m else None,
                "finish": m[2] if m else None,
            }
        )
    return out


def table(name: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"### {name}",
        "",
        "| request | prompt tokens | shared prefix | cached | cached / shared | TTFT |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(rows, 1):
        share = "-" if r["cached_of_shared"] is None else f"{r['cached_of_shared']:.3f}"
        ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.2f} s"
        lines.append(
            f"| {i} | {r['prompt_tokens']:,} | {r['shared']:,} | {r['cached']:,} | {share} "
            f"| {ttft} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("qwen3_5", "qwen3"), default="qwen3_5")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args()
    bin_dir = install()
    model = build_test_model(args.model)
    turns = TURNS[: args.turns]
    failures: list[str] = []
    results: dict[str, Any] = {}
    for name in args.clients.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"mlxcore-session-{name}-"))
        record, log_path = work / "prompts.jsonl", work / "server.log"
        proc, base = serve(model, record, log_path)
        home = work / "home"
        home.mkdir()
        try:
            outcome = CLIENTS[name](bin_dir, base, home, turns)
        finally:
            stop(proc)
        codes = [r.returncode for r in outcome["runs"]]
        rows = requests_of(record, log_path)
        results[name] = {"exit_codes": codes, "requests": rows, "server_log": str(log_path)}
        print(table(f"{name} ({args.model}, {len(turns)} turns)", rows), flush=True)
        if any(codes):
            failures.append(f"{name}: exit codes {codes}")
            for r in outcome["runs"]:
                print(r.stdout[-2000:], r.stderr[-2000:], sep="\n")
        for i, r in enumerate(rows[1:], 2):
            if r["shared"] >= MIN_SHARED and r["cached"] < SHARE * r["shared"]:
                failures.append(
                    f"{name}: request {i} reused {r['cached']} of a shared {r['shared']} tokens"
                )
        shutil.rmtree(home, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
