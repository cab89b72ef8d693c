"""Measure SpecPrefill's TTFT and decode speed against normal chunked prefill.

Side by side in one process, on the same prompt: time to the first token's logits
with chunked prefill and with SpecPrefill (draft scoring + sparse target prefill),
then greedy decode speed from each resulting cache. Defaults: the "small" test
Llama as target and the "tiny" one as draft (same tokenizer), 8,192 prompt tokens,
keep 0.2. Run: ``python plugins/specprefill/scripts/measure_ttft.py [--tokens N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from mlxcore.blas import reexec_with_openblas

# Preload OpenBLAS as the CLI does (MLX's CPU wheel otherwise uses the slow reference BLAS).
if __name__ == "__main__":
    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import PrefillTask, run_to_completion
from mlxcore.models.loader import load_model
from mlxcore.testing import build_test_model
from mlxcore_specprefill.options import Settings
from mlxcore_specprefill.scoring import argmax_token
from mlxcore_specprefill.stack import detect
from mlxcore_specprefill.strategy import SpecPrefill


def _timed_prefill(strategy: Any, model: Any, req: GenerationRequest) -> tuple[float, Any, Any]:
    cache = make_prompt_cache(model)
    t = time.perf_counter()
    result = run_to_completion(strategy.prefill(PrefillTask(req, cache)))
    mx.eval(result.logits)
    return time.perf_counter() - t, result, cache


def _decode_rate(model: Any, cache: Any, first: int, steps: int) -> float:
    token = mx.array([[first]])
    t = time.perf_counter()
    for _ in range(steps):
        logits = model(token, cache=cache)[:, -1, :]
        token = mx.argmax(logits, axis=-1)[:, None]
        mx.eval(token)
    return steps / (time.perf_counter() - t)


def main() -> None:
    """Parse flags, run both prefills ``--repeat`` times, print a JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--keep", type=float, default=0.2)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--step", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    target = load_model(build_test_model(args.arch, size="small"))
    draft = load_model(build_test_model(args.arch, size="tiny"))
    n_params = [sum(v.size for _, v in _leaves(m.model.parameters())) for m in (target, draft)]
    settings = Settings(threshold=0, keep=args.keep, chunk=args.chunk)
    sparse = SpecPrefill(detect(target.model), detect(draft.model), settings, args.step)
    dense = ChunkedPrefill(target.model, args.step)
    prompt = tuple(int((i * 7919 + 13) % 50000 + 100) for i in range(args.tokens))
    req = GenerationRequest(prompt_tokens=prompt, max_tokens=1)

    rows: dict[str, list[float]] = {"dense_ttft": [], "sparse_ttft": [], "dense_tps": []}
    rows["sparse_tps"] = []
    for _ in range(args.repeat):
        for name, strategy in (("dense", dense), ("sparse", sparse)):
            seconds, result, cache = _timed_prefill(strategy, target.model, req)
            first = argmax_token(result.logits)
            rows[f"{name}_ttft"].append(seconds)
            rows[f"{name}_tps"].append(_decode_rate(target.model, cache, first, args.decode))
    best = {k: (min(v) if k.endswith("ttft") else max(v)) for k, v in rows.items()}
    summary = {
        "device": str(mx.default_device()),
        "target_params": n_params[0],
        "draft_params": n_params[1],
        "prompt_tokens": args.tokens,
        "keep": args.keep,
        "kept_tokens": len(sparse.last_kept),
        "runs": rows,
        "ttft_speedup": best["dense_ttft"] / best["sparse_ttft"],
        "decode_ratio": best["sparse_tps"] / best["dense_tps"],
        "stats": sparse.stats(),
    }
    print(json.dumps(summary, indent=2))


def _leaves(tree: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    flat: list[tuple[str, Any]] = tree_flatten(tree)  # type: ignore[assignment]
    return flat


if __name__ == "__main__":
    main()
