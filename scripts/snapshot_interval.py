"""What a recurrent snapshot every N tokens costs and saves, on a hybrid model.

For each N, one cold prefill of a long prompt stops every N tokens (at multiples of N, as
the radix prefix cache's aligned snapshots do) and offers the cache there, exactly as the
engine's chunked prefill does; the script reports the prefill time against one without
stops, the bytes the snapshots hold, and what a request that leaves this prompt at a
random point then recomputes on average (N / 2 tokens, timed at the measured prefill
rate). docs/benchmarks.md ("Snapshot interval") has the numbers behind
``SNAPSHOT_INTERVAL``.

    .venv/bin/python scripts/snapshot_interval.py [MODEL] [--tokens 8192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.defaults.radix_cache import RadixPrefixCache
from mlxcore.engine.memory import cache_cost
from mlxcore.models.loader import load_model
from mlxcore.testing.models import build_test_model

CHUNK = 2048
"""The default ``--prefill-step-size``."""


def prefill(
    model: Any, tokens: list[int], stops: list[int], cache: RadixPrefixCache | None
) -> float:
    """Seconds to prefill ``tokens`` in chunks of at most :data:`CHUNK`, stopping (and
    offering a snapshot) at ``stops``."""
    kv = make_prompt_cache(model)
    cuts = sorted({*stops, *range(CHUNK, len(tokens), CHUNK), len(tokens)})
    start = time.perf_counter()
    done = 0
    for cut in cuts:
        model(mx.array(tokens[done:cut])[None], cache=kv)
        mx.eval([c.state for c in kv])
        done = cut
        if cache is not None and cut in stops:
            cache.store_checkpoint(tokens[:cut], kv)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="default: the small qwen3_5")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = args.model or str(build_test_model("qwen3_5", size="small"))
    model = load_model(path).model
    per_token, fixed = cache_cost(model)
    tokens = [(i * 7919) % 30000 + 100 for i in range(args.tokens)]
    prefill(model, tokens[:CHUNK], [], None)  # warm-up
    base = statistics.median(prefill(model, tokens, [], None) for _ in range(args.repeats))
    rate = base / len(tokens)
    print(f"model {path}")
    print(f"state per snapshot {fixed / 2**10:.0f} KB, keys+values {per_token / 2**10:.2f} KB "
          f"per token (a snapshot = {fixed / per_token:.0f} tokens); prefill without stops "
          f"{base:.2f} s for {len(tokens)} tokens")  # fmt: skip
    print("| N | prefill with snapshots | overhead | snapshots | their bytes "
          "| bytes / KV of the prompt | recompute after a random divergence |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in (256, 512, 1024, 2048, 4096):
        stops = list(range(n, len(tokens), n))
        times = []
        for _ in range(args.repeats):
            cache = RadixPrefixCache(model, "10GB")
            times.append(prefill(model, tokens, stops, cache))
        took = statistics.median(times)
        snap_bytes = cache.tree.snapshots * fixed
        print(
            f"| {n} | {took:.2f} s | {100 * (took / base - 1):+.1f}% | {cache.tree.snapshots} "
            f"| {snap_bytes / 2**20:.1f} MB | {snap_bytes / (per_token * len(tokens)):.2f} "
            f"| {n // 2} tokens, {1000 * rate * n / 2:.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
