"""LoRA adapters in one batch: what serving adapters costs against the base model alone.

One engine with three rank-``--rank`` adapters on every linear layer of the model; each
round runs three batches of ``--batch`` requests (order rotating), ``--tokens`` tokens
each, greedy or sampled:

* base: every row on the base weights (the adapters loaded but unused);
* one adapter: every row on the same adapter (no gather: one low-rank pair per layer);
* mixed: the rows spread over the three adapters and the base (per-row deltas).

Aggregate speed is all generated tokens over the wall time from submission to the last
token. Prints each round's speeds and the median ratios to ``base``.

Usage (OpenBLAS preloaded, as ``mlxcore`` does)::

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/lora_bench.py [--size small] [--rounds 3] [--temperature 0.8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from mlxcore.engine.adapters import adapter_request, adapters_of
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing.models import build_test_model, default_test_models_root
from mlxcore.testing.runtime import make_runtime, submit_together
from mlxcore_lora.testing import write_adapter

ADAPTERS = ("a", "b", "c")


def arms(batch: int) -> dict[str, list[str | None]]:
    """Which adapter each row of a batch runs, per arm."""
    mixed: list[str | None] = [*ADAPTERS, None]
    return {
        "base": [None] * batch,
        "one adapter": ["a"] * batch,
        "mixed": [mixed[i % len(mixed)] for i in range(batch)],
    }


def run(rt: Runtime, names: list[str | None], args: argparse.Namespace, seed: int) -> float:
    """Aggregate tokens/s of one batch."""
    bank = adapters_of(rt.model)
    assert bank is not None
    rng = random.Random(seed)
    sampling = SamplingParams(temperature=args.temperature, seed=seed if args.temperature else None)
    requests = []
    for name in names:
        prompt = tuple(rng.randrange(300, 3000) for _ in range(args.prompt))
        plain = GenerationRequest(prompt, args.tokens, sampling=sampling, options={})
        key = None if name is None else bank.key(name)
        requests.append(plain if key is None else adapter_request(plain, key))
    started = time.perf_counter()
    results = submit_together(rt, requests, timeout=3600)
    elapsed = time.perf_counter() - started
    return sum(len(r.tokens) for r in results) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--arch", default="qwen3")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    model = build_test_model(args.arch, size=args.size, root=default_test_models_root())
    with tempfile.TemporaryDirectory() as tmp:
        specs = [
            f"{name}={write_adapter(model, Path(tmp) / name, rank=args.rank, seed=i)}"
            for i, name in enumerate(ADAPTERS)
        ]
        rt = make_runtime(model, "lora", plugin_options={"lora": specs})
        try:
            plan = arms(args.batch)
            run(rt, plan["mixed"], args, seed=99)  # warm-up
            speeds: dict[str, list[float]] = {arm: [] for arm in plan}
            for r in range(args.rounds):
                order = list(plan)[r % 3 :] + list(plan)[: r % 3]
                for arm in order:
                    speeds[arm].append(run(rt, plan[arm], args, seed=r))
                print(f"round {r + 1}: " + ", ".join(f"{a} {speeds[a][-1]:.1f}" for a in plan))
        finally:
            rt.engine.shutdown()
    print(
        f"model {args.arch}-{args.size}, {args.batch} rows x {args.tokens} tokens, "
        f"rank {args.rank}, temperature {args.temperature}"
    )
    for arm, values in speeds.items():
        ratio = statistics.median(v / b for v, b in zip(values, speeds["base"], strict=True))
        print(f"{arm:12s} median {statistics.median(values):7.1f} tok/s  vs base {ratio:.2f}x")


if __name__ == "__main__":
    main()
