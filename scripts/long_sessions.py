"""Agent sessions at their real length against a real ``mlxcore serve``, request by
request (not part of ``make test``; see docs/benchmarks.md, "Long agent sessions").

A fresh server (default flags unless ``--server-args`` adds some) serves a test model;
``--sessions`` Claude Code-shaped sessions (:mod:`mlxcore.bench.agent_shapes`: ~17.5K
tokens of system prompt and tools, a ~7K-token tool result per turn with a reminder, a
side request after every turn, a compaction at the end) take turns, one request at a
time, through the Anthropic Messages API (``--front anthropic``) or Chat Completions
(``--front openai``), streamed and greedy. For every request the script prints its
prompt tokens, the cached tokens the response reported, the share of the previous main
prompt that was cached (main turns) or of the prefix shared with earlier requests, the
client's time to the first streamed token, and the server's RSS and MLX memory after it.

It fails unless: every main turn after a session's first has >= ``--min-share`` (0.95)
of its previous prompt cached, or >= that share of the prefix it shares with earlier
requests (sessions round-robin under a small budget: ``--min-share 0.9``); side and
compacted requests reuse >= that share of what they share with earlier requests; the
last main turn's TTFT is within ``--max-ttft-growth`` (2.5) times the slowest of turns
2-4 (one session only); no request fails; with ``--check-cold N``, the greedy answers of
N requests (evenly spread) equal a cold server's (``--prefix-cache-size 0``).
``--stream-beside`` keeps a stream decoding beside the session and reports its
inter-token gaps while the main turns prefill against their long contexts.

    .venv/bin/python scripts/long_sessions.py [--model qwen3_5|qwen3] [--turns 14]
        [--front anthropic|openai] [--sessions 1] [--server-args "..."] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psutil

from mlxcore.bench.agent_long import interleaved
from mlxcore.bench.agent_shapes import AgentRequest, SessionShape, anthropic_body, openai_messages
from mlxcore.engine.prefill_plan import common_prefix
from mlxcore.testing.models import build_test_model
from mlxcore.testing.server import ServerPool

CONTEXT = 262_144
"""The test models' context for these runs (qwen3's own is 40,960)."""


class Client:
    """One front end of one server: sends a request streamed, returns what it saw."""

    def __init__(self, base: str, front: str, max_tokens: int) -> None:
        self.base, self.front, self.max_tokens = base, front, max_tokens
        self.http = httpx.Client(timeout=900)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key="unused", timeout=900)
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=900)

    def prompt_ids(self, request: AgentRequest) -> list[int]:
        body = {"model": "agent", "messages": openai_messages(request), "tools": request.tools}
        if self.front == "anthropic":  # the Messages front end renders without thinking
            body["chat_template_kwargs"] = {"enable_thinking": False}
        reply = self.http.post(f"{self.base}/tokenize", json=body)
        reply.raise_for_status()
        return list(reply.json()["tokens"])

    def send(self, request: AgentRequest) -> dict[str, Any]:
        start = time.perf_counter()
        first: float | None = None
        text: list[str] = []
        if self.front == "anthropic":
            body = anthropic_body(request, "agent", self.max_tokens)
            with self.anthropic.messages.stream(**body, extra_body={"temperature": 0.0}) as stream:
                for event in stream:
                    if event.type in ("content_block_delta", "content_block_start"):
                        first = first or time.perf_counter() - start
                message = stream.get_final_message()
            usage = message.usage
            for block in message.content:
                text.append(block.text if block.type == "text" else json.dumps(block.input))
            cached = usage.cache_read_input_tokens or 0
            prompt = usage.input_tokens + cached
        else:
            chunks = self.openai.chat.completions.create(
                model="agent", messages=openai_messages(request),  # type: ignore[arg-type]
                tools=request.tools,  # type: ignore[arg-type]
                max_tokens=self.max_tokens, temperature=0.0, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            prompt = cached = 0
            for chunk in chunks:
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content or delta.tool_calls:
                        first = first or time.perf_counter() - start
                        text.append(delta.content or json.dumps(
                            [c.model_dump() for c in delta.tool_calls or []]))  # fmt: skip
                if chunk.usage is not None:
                    prompt = chunk.usage.prompt_tokens
                    details = chunk.usage.prompt_tokens_details
                    cached = (details.cached_tokens or 0) if details else 0
        total = time.perf_counter() - start
        return {"prompt_tokens": prompt, "cached": cached, "ttft_s": first or total,
                "total_s": total, "answer": "".join(text)}  # fmt: skip


def memory(proc: subprocess.Popen[bytes], base: str) -> dict[str, float]:
    """The server's RSS and the gauges /metrics gives for MLX and the prefix cache."""
    out = {"rss_mb": psutil.Process(proc.pid).memory_info().rss / 2**20}
    text = httpx.get(f"{base}/metrics", timeout=30).text
    wanted = {
        "mlxcore_memory_active_bytes": "mlx_active_mb",
        "mlxcore_memory_cache_bytes": "mlx_cache_mb",
        "mlxcore_prefix_cache_bytes": "prefix_mb",
        "mlxcore_memory_prefix_cache_budget_bytes": "prefix_budget_mb",
        "mlxcore_prefix_cache_disk_bytes": "disk_mb",
        "mlxcore_prefix_cache_disk_read_bytes": "disk_read_mb",
    }
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        key = wanted.get(name.split("{")[0])
        if key and value:
            out[key] = float(value) / 2**20
        elif name == "mlxcore_prefix_cache_disk_reads" and value:
            out["disk_reads"] = float(value)
    return out


def requests_of(args: argparse.Namespace, model: Path) -> list[AgentRequest]:
    """The sessions' requests in the order they are sent (a request of each in turn)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    shape = SessionShape(
        turns=args.turns, result_tokens=args.result_tokens, system_tokens=args.system_tokens
    )
    return interleaved(shape, args.sessions, count)


class BesideStream:
    """A stream decoding beside the session (``--stream-beside``): one short chat after
    another, every chunk's arrival time kept, to see whether a long turn's prefill at a
    long context stalls it."""

    def __init__(self, base: str) -> None:
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=900)
        self.arrivals: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            chunks = self.client.chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "Count to a thousand."}],
                max_tokens=300, temperature=0.0, stream=True, extra_body={"ignore_eos": True},
            )  # fmt: skip
            last = None
            for _ in chunks:
                now = time.perf_counter()
                if last is not None:
                    self.arrivals.append(now)
                last = now

    def gaps(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """Inter-chunk gaps (ms) ending inside ``windows`` (the main turns' prefills)
        and outside any: p50 and p99 of each."""
        inside, outside = [], []
        for before, after in itertools.pairwise(self.arrivals):
            gap = (after - before) * 1000
            hit = any(a <= after <= b for a, b in windows)
            (inside if hit else outside).append(gap)
        out: dict[str, float] = {}
        for name, values in (("during_long_prefill", inside), ("otherwise", outside)):
            if values:
                out[f"{name}_p50_ms"] = round(statistics.median(values), 1)
                out[f"{name}_p99_ms"] = round(statistics.quantiles(values, n=100)[98], 1)
                out[f"{name}_gaps"] = len(values)
        return out


def run(args: argparse.Namespace, model: Path, extra: list[str], work: Path) -> dict[str, Any]:
    """Every request of the sessions against one server; rows in arrival order."""
    order = requests_of(args, model)
    pool = ServerPool(work)
    server = pool(model, "--served-model-name", "agent", *extra)
    proc, base = server.proc, server.base_url
    rows: list[dict[str, Any]] = []
    beside = BesideStream(base) if args.stream_beside else None
    windows: list[tuple[float, float]] = []
    if beside is not None:
        beside.thread.start()
        time.sleep(2.0)
    try:
        client = Client(base, args.front, args.max_tokens)
        earlier: list[list[int]] = []
        previous_main: dict[str, int] = {}
        for request in order:
            session = request.session
            ids = client.prompt_ids(request)
            shared = max((common_prefix(ids, e) for e in earlier), default=0)
            earlier.append(ids)
            started = time.perf_counter()
            try:
                row = client.send(request)
                if request.kind == "main":
                    windows.append((started, started + row["ttft_s"]))
            except Exception as exc:  # a failed request is a row, and a failure
                row = {"error": repr(exc), "prompt_tokens": len(ids), "cached": 0, "ttft_s": 0}
            row.update(kind=request.kind, turn=request.turn, session=session, shared=shared)
            before = previous_main.get(session)
            if request.kind == "main":
                row["of_previous"] = row["cached"] / before if before else None
                previous_main[session] = row["prompt_tokens"]
            row["of_shared"] = min(1.0, row["cached"] / shared) if shared else None
            row.update(memory(proc, base))
            rows.append(row)
            print(line(row), flush=True)
    finally:
        if beside is not None:
            beside.stopping.set()
        pool.close()
    out: dict[str, Any] = {"rows": rows, "log": str(server.log_path)}
    if beside is not None:
        out["stream_beside"] = beside.gaps(windows)
        print("stream beside the session, inter-token gaps:", out["stream_beside"])
    return out


def line(r: dict[str, Any]) -> str:
    prev = "-" if r.get("of_previous") is None else f"{r['of_previous']:.3f}"
    shr = "-" if r.get("of_shared") is None else f"{r['of_shared']:.3f}"
    return (
        f"| {r['session'][-9:]} | {r['kind']} {r['turn']} | {r['prompt_tokens']:,} | "
        f"{r['cached']:,} | {prev} | {shr} | {r['ttft_s']:.2f} s | {r.get('rss_mb', 0):,.0f} | "
        f"{r.get('prefix_mb', 0):,.0f} | {r.get('error', '')}"
    )


def failures(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    out = [f"{r['kind']} {r['turn']} of {r['session']}: {r['error']}" for r in rows if "error" in r]
    for r in rows:
        name = f"{r['kind']} {r['turn']} of {r['session']}"
        if r["kind"] == "main" and r["turn"] > 0:
            best = max(r.get("of_previous") or 0.0, r.get("of_shared") or 0.0)
            if best < args.min_share:
                out.append(f"{name}: {best:.3f} of its previous prompt / shared prefix cached")
        elif r["kind"] != "main" and (r.get("of_shared") or 1.0) < args.min_share:
            out.append(f"{name}: {r['of_shared']:.3f} of its shared prefix cached")
    if args.sessions == 1:
        mains = [r for r in rows if r["kind"] == "main"]
        early = [r["ttft_s"] for r in mains[2:5]]  # turns 2-4 (the opening is turn 0... 1)
        if early and mains[-1]["ttft_s"] > args.max_ttft_growth * max(early):
            out.append(
                f"last main turn TTFT {mains[-1]['ttft_s']:.2f} s > {args.max_ttft_growth} x "
                f"{max(early):.2f} s (slowest of turns 2-4)"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("qwen3_5", "qwen3"), default="qwen3_5")
    parser.add_argument("--size", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--front", choices=("anthropic", "openai"), default="anthropic")
    parser.add_argument("--turns", type=int, default=14)
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--result-tokens", type=int, default=7_000)
    parser.add_argument("--system-tokens", type=int, default=3_000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--server-args", default="", help="flags added to mlxcore serve")
    parser.add_argument("--min-share", type=float, default=0.95)
    parser.add_argument("--max-ttft-growth", type=float, default=2.5)
    parser.add_argument("--check-cold", type=int, default=0, metavar="N",
                        help="compare N answers with a cold server's")  # fmt: skip
    parser.add_argument("--stream-beside", action="store_true",
                        help="keep a stream decoding beside the session; report its "
                        "inter-token gaps during the main turns' prefills")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    model = build_test_model(args.model, size=args.size, max_position_embeddings=CONTEXT)
    work = Path(tempfile.mkdtemp(prefix="mlxcore-long-session-"))
    print(f"model {model}, front {args.front}, server args {args.server_args!r}, in {work}")
    print("| session | request | prompt | cached | of previous | of shared | TTFT | RSS MB "
          "| prefix MB | error |")  # fmt: skip
    print("| --- " * 10 + "|")
    result = run(args, model, shlex.split(args.server_args), work)
    problems = failures(result["rows"], args)
    if args.check_cold:
        problems += cold_check(args, model, result["rows"], work)
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         **result, "failures": problems}, indent=2))  # fmt: skip
    for problem in problems:
        print("FAIL", problem)
    print("OK" if not problems else f"{len(problems)} failures")
    return 1 if problems else 0


def cold_check(
    args: argparse.Namespace, model: Path, rows: list[dict[str, Any]], work: Path
) -> list[str]:
    """Send ``--check-cold`` of the requests again to a server without a prefix cache;
    their greedy answers must be the same."""
    last = len(rows) - 1
    picks = sorted({round(i * last / max(1, args.check_cold - 1)) for i in range(args.check_cold)})
    order = requests_of(args, model)
    pool = ServerPool(work)
    server = pool(model, "--served-model-name", "agent", "--prefix-cache-size", "0")
    out: list[str] = []
    try:
        client = Client(server.base_url, args.front, args.max_tokens)
        for i in picks:
            cold, warm = client.send(order[i])["answer"], rows[i].get("answer")
            same = cold == warm
            print(f"cold check, request {i + 1}: {'same' if same else 'DIFFERENT'}", flush=True)
            if not same:
                out.append(f"request {i + 1}: answer {warm!r} != cold {cold!r}")
    finally:
        pool.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
