"""Agent sessions at their real length, replayed through the engine
(``mlxcore bench --agent-session --agent-shape claude-code``).

Every request of :func:`~mlxcore.bench.agent_shapes.session_requests` (main turns with a
~7K-token tool result each, a side request after each, a compaction at the end) goes
through the request builder and the engine of one runtime, one at a time; with several
sessions a request of each in turn. Per request: prompt tokens, cached tokens, the share
of the session's previous main prompt that was cached (main turns) or of the longest
prefix shared with any earlier request, the time to the first token, and the prefix
cache's and MLX's memory after it. The first and last main turns of the first session
are measured cold too (a runtime without prefix cache), for the speed-up.

The targets are issue 56's: every main turn after the first >= 0.95 of its previous
prompt cached (or of its shared prefix, when sessions outgrow memory); side and compacted
requests >= 0.95 of what they share; the last main turn's TTFT within 2.5 times the
slowest of turns 2-4 (one session).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.bench.agent_runtime import default_runtime, shared_prefix, time_to_first_token
from mlxcore.bench.agent_shapes import AgentRequest, SessionShape, session_requests
from mlxcore.engine.request import SamplingParams
from mlxcore.request_builder import ChatPrompt, RequestSpec, build_generations
from mlxcore.runtime import Runtime

MIN_SHARE = 0.95
MAX_TTFT_GROWTH = 2.5


def interleaved(shape: SessionShape, sessions: int, count: Any) -> list[AgentRequest]:
    """The requests of ``sessions`` sessions of ``shape``, a request of each in turn."""
    each = [
        list(session_requests(attrs.evolve(shape, label=f"session {n}"), count))
        for n in range(sessions)
    ]
    return [s[i] for i in range(max(map(len, each))) for s in each if i < len(s)]


def run_long_session(
    model: str,
    shape: SessionShape,
    *,
    sessions: int = 1,
    max_tokens: int = 4,
    make_runtime: Any = None,
    cold: bool = True,
) -> dict[str, Any]:
    """Replay the sessions; return every request's row and the targets."""
    warm: Runtime = make_runtime() if make_runtime else default_runtime(model, "auto")
    cold_rt = default_runtime(model, "0") if cold else None
    tokenizer = warm.tokenizer

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    order = interleaved(shape, sessions, count)
    last_main = max(r.turn for r in order if r.kind == "main")
    rows: list[dict[str, Any]] = []
    earlier: list[tuple[int, ...]] = []
    previous: dict[str, int] = {}
    try:
        for request in order:
            spec = RequestSpec(
                prompt=ChatPrompt(request.messages, request.tools),
                sampling=SamplingParams(),
                new_id=lambda: "agent-long",
                max_tokens=max_tokens,
            )
            (built,) = build_generations(warm, spec)
            prompt = built.request.prompt_tokens
            ttft, finish = time_to_first_token(warm, built.request)
            cached = finish.usage.cached_tokens
            shared = shared_prefix(prompt, earlier)
            earlier.append(prompt)
            row: dict[str, Any] = {
                "session": request.session, "kind": request.kind, "turn": request.turn,
                "prompt_tokens": len(prompt), "shared": shared, "cached_tokens": cached,
                "of_shared": round(min(1.0, cached / shared), 4) if shared else None,
                "ttft_s": round(ttft, 4),
            }  # fmt: skip
            if request.kind == "main":
                before = previous.get(request.session)
                row["of_previous"] = round(cached / before, 4) if before else None
                previous[request.session] = len(prompt)
                first_session = request.session == order[0].session
                if cold_rt is not None and first_session and request.turn in (0, last_main):
                    plain = attrs.evolve(built.request, checkpoints=(), boundaries=())
                    row["cold_ttft_s"] = round(time_to_first_token(cold_rt, plain)[0], 4)
            stats = warm.engine.stats()
            row["prefix_cache_mb"] = round(stats.get("prefix_cache_bytes", 0) / 2**20, 1)
            row["prefix_cache_nodes"] = int(stats.get("prefix_cache_nodes", 0))
            row["prefix_cache_snapshots"] = int(stats.get("prefix_cache_snapshots", 0))
            row["mlx_active_mb"] = round(mx.get_active_memory() / 2**20, 1)
            rows.append(row)
        capacity = warm.engine.stats().get("memory_prefix_cache_budget_bytes", 0)
    finally:
        for rt in (warm, cold_rt):
            if rt is not None:
                rt.engine.shutdown()
    return {"requests": rows, "prefix_cache_budget_mb": round(capacity / 2**20, 1),
            "targets": targets(rows, sessions)}  # fmt: skip


def targets(rows: list[dict[str, Any]], sessions: int) -> dict[str, bool]:
    """Issue 56's bars on the replayed rows (see the module docstring)."""
    later = [r for r in rows if r["kind"] == "main" and r["turn"] > 0]
    others = [r for r in rows if r["kind"] != "main" and r["of_shared"] is not None]
    out = {
        f"main turns >= {MIN_SHARE} of the previous prompt or shared prefix": all(
            max(r.get("of_previous") or 0.0, r["of_shared"] or 0.0) >= MIN_SHARE for r in later
        ),
        f"side and compacted requests >= {MIN_SHARE} of their shared prefix": all(
            r["of_shared"] >= MIN_SHARE for r in others
        ),
    }
    if sessions == 1:
        mains = [r for r in rows if r["kind"] == "main"]
        early = max((r["ttft_s"] for r in mains[2:5]), default=math.inf)
        out[f"last main TTFT <= {MAX_TTFT_GROWTH} x the slowest of turns 2-4"] = (
            mains[-1]["ttft_s"] <= MAX_TTFT_GROWTH * early
        )
    return out


def print_rows(result: dict[str, Any]) -> None:
    """The rows as a table, then the targets."""
    print(f"{'session':>9} {'request':>10} {'prompt':>8} {'cached':>8} {'of prev':>7} "
          f"{'of shr':>6} {'TTFT s':>7} {'cold s':>7} {'prefix MB':>9} {'MLX MB':>8}")  # fmt: skip
    for r in result["requests"]:
        prev = "-" if r.get("of_previous") is None else f"{r['of_previous']:.3f}"
        shr = "-" if r["of_shared"] is None else f"{r['of_shared']:.3f}"
        cold = f"{r['cold_ttft_s']:.2f}" if "cold_ttft_s" in r else "-"
        print(
            f"{r['session']:>9} {r['kind'] + ' ' + str(r['turn']):>10} {r['prompt_tokens']:>8} "
            f"{r['cached_tokens']:>8} {prev:>7} {shr:>6} {r['ttft_s']:>7.2f} {cold:>7} "
            f"{r['prefix_cache_mb']:>9.1f} {r['mlx_active_mb']:>8.1f}"
        )
    print(f"prefix cache budget: {result['prefix_cache_budget_mb']:.0f} MB")
