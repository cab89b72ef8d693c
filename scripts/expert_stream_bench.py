#!/usr/bin/env python3
"""Expert streaming vs the fully loaded model: peak resident memory, tokens/s with a cold
and a warm expert cache, hit rate, and greedy tokens compared.

Builds a qwen3_5_moe test model with 32 routed experts per layer (hidden 256, expert
width 512: about 200 MB of routed experts in float32), writes it as mlx-lm saves it, then
runs each side in its own process through mlxcore's real loader and engine: the full
model, and ``--plugin expert-stream --expert-memory`` at 35% of the routed bytes. Each
side generates the same greedy requests twice (cold cache, then warm).

Usage: .venv/bin/python scripts/expert_stream_bench.py [--bits 4] [--share 0.35]
       [--tokens 48] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = [[200 + 13 * i + j for j in range(24 + 5 * i)] for i in range(4)]


def _model(bits: int | None) -> Path:
    from mlx_lm import load
    from mlx_lm.utils import quantize_model, save

    from mlxcore.testing.models import build_test_model

    source = build_test_model(
        "qwen3_5_moe", num_experts=32, moe_intermediate_size=512, hidden_size=256
    )
    target = Path.home() / ".cache/mlxcore/bench-models" / f"moe32-{bits or 'f32'}-mlx"
    if not target.exists():
        model, tokenizer, config = load(str(source), return_config=True)
        if bits:
            model, config = quantize_model(model, config, 64, bits)
        save(target, source, model, tokenizer, config)
        shutil.copy(source / "chat_template.jinja", target / "chat_template.jinja")
    return target


def _routed_bytes(folder: Path) -> int:
    from mlxcore_expert_stream.store import ExpertFiles

    files = ExpertFiles(folder)
    return sum(t.expert_bytes * t.shape[0] for n, t in files.tensors.items() if ".switch_mlp." in n)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(folder: Path, budget: int | None, tokens: int) -> dict[str, Any]:
    """One side, in this process: load, then two passes over the prompts."""
    from mlxcore.engine.request import GenerationRequest
    from mlxcore.testing.runtime import make_runtime, submit_together
    from mlxcore_expert_stream import cache_of

    if budget is None:
        rt = make_runtime(folder)
    else:
        rt = make_runtime(folder, "expert-stream", plugin_options={"expert_memory": budget})
    out: dict[str, Any] = {"rss_after_load_mb": _rss_mb(), "passes": []}
    try:
        cache = cache_of(rt.model)
        for _ in range(2):
            start = time.perf_counter()
            before = (
                (cache.stats.hits, cache.stats.misses, cache.stats.bytes_read) if cache else None
            )
            results = [submit_together(rt, [GenerationRequest(p, tokens)])[0] for p in PROMPTS]
            seconds = time.perf_counter() - start
            made = sum(len(r.tokens) for r in results)
            row: dict[str, Any] = {"tok_s": made / seconds, "tokens": [r.tokens for r in results]}
            if cache is not None and before is not None:
                hits, misses = cache.stats.hits - before[0], cache.stats.misses - before[1]
                row["hit_rate"] = hits / max(1, hits + misses)
                row["disk_mb_per_token"] = (cache.stats.bytes_read - before[2]) / made / 2**20
            out["passes"].append(row)
    finally:
        rt.engine.shutdown()
    import mlx.core as mx

    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["mlx_peak_mb"] = mx.get_peak_memory() / 2**20
    out["mlx_cache_mb"] = mx.get_cache_memory() / 2**20
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, default=None)
    parser.add_argument("--share", type=float, default=0.35)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.budget, args.tokens)))
        return 0
    folder = _model(args.bits)
    routed = _routed_bytes(folder)
    budget = int(args.share * routed)
    sides: dict[str, Any] = {}
    for name, side_budget in (("full", None), ("streamed", budget)):
        cmd = [sys.executable, __file__, "--child", str(folder), "--tokens", str(args.tokens)]
        if side_budget is not None:
            cmd += ["--budget", str(side_budget)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        sides[name] = json.loads(done.stdout.strip().splitlines()[-1])
    full, streamed = sides["full"], sides["streamed"]
    same = all(
        a["tokens"] == b["tokens"] for a, b in zip(full["passes"], streamed["passes"], strict=True)
    )
    result = {
        "model": str(folder),
        "routed_expert_mb": routed / 2**20,
        "expert_memory_mb": budget / 2**20,
        "greedy_identical": same,
        "peak_rss_mb": {k: v["peak_rss_mb"] for k, v in sides.items()},
        "bar_mb": full["peak_rss_mb"] - 0.5 * routed / 2**20,
        "tok_s": {k: [p["tok_s"] for p in v["passes"]] for k, v in sides.items()},
        "hit_rate": [p.get("hit_rate") for p in streamed["passes"]],
        "disk_mb_per_token": [p.get("disk_mb_per_token") for p in streamed["passes"]],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
