#!/usr/bin/env python3
"""Expert streaming vs the fully loaded model: peak resident memory, tokens/s with a cold
and a warm expert cache, hit rate, and greedy tokens compared.

Builds a qwen3_5_moe test model with 32 routed experts per layer (hidden 256, expert
width 512: about 200 MB of routed experts in float32), writes it as mlx-lm saves it, then
runs each side in its own process through mlxcore's real loader and engine: the full
model, and ``--plugin expert-stream --expert-memory`` at 35% of the routed bytes. Each
side generates the same greedy requests twice: cold (the checkpoint evicted from the OS
page cache first, so streamed experts come from the disk) and warm. Also measured: the
disk's read rate for expert slices in random order, one at a time vs the plugin's
parallel reads.

Usage: .venv/bin/python scripts/expert_stream_bench.py [--bits 4] [--share 0.35]
       [--experts 32] [--width 512] [--tokens 48] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = [[200 + 13 * i + j for j in range(24 + 5 * i)] for i in range(4)]


def _model(bits: int | None, experts: int, width: int) -> Path:
    from mlxcore.testing.models import build_test_model
    from mlxcore_expert_stream.testing import mlx_lm_checkpoint

    source = build_test_model(
        "qwen3_5_moe", num_experts=experts, moe_intermediate_size=width, hidden_size=256
    )
    name = f"moe{experts}" + (f"w{width}" if width != 512 else "") + f"-{bits or 'f32'}-mlx"
    target = Path.home() / ".cache/mlxcore/bench-models" / name
    return mlx_lm_checkpoint(source, target, bits, group_size=64)


def _drop_page_cache(folder: Path) -> None:
    """Evict the checkpoint from the OS page cache, so the next reads go to the disk."""
    for path in folder.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_throughput(folder: Path, threads: int) -> float:
    """MB/s reading every routed expert slice once, in random order, from the disk (the
    page cache dropped first), ``threads`` reads at a time."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from mlxcore_expert_stream.store import ExpertFiles

    files = ExpertFiles(folder)
    jobs = [
        (name, e)
        for name, t in files.tensors.items()
        if ".switch_mlp." in name
        for e in range(t.shape[0])
    ]
    random.Random(0).shuffle(jobs)
    buffers = {job: files.buffer(job[0]) for job in jobs}
    _drop_page_cache(folder)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda job: files.read_into(job[0], job[1], buffers[job]), jobs))
    seconds = time.perf_counter() - start
    files.close()
    return sum(b.nbytes for b in buffers.values()) / 2**20 / seconds


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
        _drop_page_cache(folder)  # the cold pass reads its experts from the disk
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
    parser.add_argument("--experts", type=int, default=32, help="routed experts per layer")
    parser.add_argument("--width", type=int, default=512, help="each expert's width")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child), args.budget, args.tokens)))
        return 0
    from mlxcore_expert_stream.testing import routed_bytes

    if args.build:
        print(_model(args.bits, args.experts, args.width))
        return 0
    # built in a process of its own: a child started after this one had built the model
    # would report this process's peak as its own (Linux keeps the high-water mark)
    build = [sys.executable, __file__, "--build", "--experts", str(args.experts)]
    build += ["--width", str(args.width)] + (["--bits", str(args.bits)] if args.bits else [])
    built = subprocess.run(build, capture_output=True, text=True, check=True)
    folder = Path(built.stdout.strip().splitlines()[-1])
    routed = routed_bytes(folder)
    budget = int(args.share * routed)
    sides: dict[str, Any] = {}
    for name, side_budget in (("full", None), ("streamed", budget)):
        cmd = [sys.executable, __file__, "--child", str(folder), "--tokens", str(args.tokens)]
        if side_budget is not None:
            cmd += ["--budget", str(side_budget)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        sides[name] = json.loads(done.stdout.strip().splitlines()[-1])
    from mlxcore_expert_stream import READ_THREADS

    disk = {f"{threads}_at_once": read_throughput(folder, threads) for threads in (1, READ_THREADS)}
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
        "expert_read_mb_s_cold": disk,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
