"""Fidelity of sparse prefill: attention-scored vs uniform selection, same budget.

For each real-text prompt (local files: licence texts, Python standard-library
sources), greedy-decode ``--new`` tokens after a full prefill and after sparse
prefills at several keep fractions, with chunks chosen by the draft's attention
scores or spread uniformly. Reports the share of prompts whose continuation equals
the full-prefill one, and the mean length of the matching prefix. The target is its
own draft by default (SmolLM2-135M, mlxcore's embedded default model).

Run: ``python plugins/specprefill/scripts/fidelity.py --prompts 8 --out results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path
from typing import Any

from mlxcore.blas import reexec_with_openblas

# Preload OpenBLAS as the CLI does (MLX's CPU wheel otherwise uses the slow reference BLAS).
if __name__ == "__main__":
    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.builtin.strategies import ChunkedPrefill
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import PrefillTask
from mlxcore.models.default import ensure_default_model
from mlxcore.models.loader import load_model
from mlxcore_specprefill.options import Settings
from mlxcore_specprefill.scoring import score_tokens, select_chunks, uniform_chunks
from mlxcore_specprefill.stack import detect
from mlxcore_specprefill.strategy import SpecPrefill


def _finish(gen: Any) -> Any:
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def _sources() -> list[Path]:
    licences = sorted(Path("/usr/share/common-licenses").glob("*"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = [stdlib / f for f in ("argparse.py", "typing.py", "dataclasses.py", "enum.py")]
    found: dict[Path, Path] = {}  # by resolved path: several licence names are symlinks
    for p in [*licences, *modules]:
        if p.is_file() and p.stat().st_size > 12000:
            found.setdefault(p.resolve(), p)
    return list(found.values())


def _greedy(model: Any, cache: Any, logits: Any, n: int) -> list[int]:
    out = [int(mx.argmax(logits, axis=-1).item())]
    while len(out) < n:
        logits = model(mx.array([[out[-1]]]), cache=cache)[:, -1, :]
        out.append(int(mx.argmax(logits, axis=-1).item()))
    return out


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    """Run the comparison; print and optionally save a JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="target (default: SmolLM2-135M)")
    ap.add_argument("--draft", default=None, help="draft (default: the target itself)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--keeps", default="0.2,0.3,0.5")
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    target = load_model(args.model or ensure_default_model())
    draft = load_model(args.draft) if args.draft else target
    keeps = [float(k) for k in args.keeps.split(",")]
    stack, draft_stack = detect(target.model), detect(draft.model)
    sp = SpecPrefill(stack, draft_stack, Settings(threshold=0, chunk=args.chunk), 512)
    results: list[dict[str, Any]] = []
    for path in _sources()[: args.prompts]:
        text = path.read_text(encoding="utf-8", errors="replace")
        ids = target.tokenizer.encode(text)[: args.tokens]
        req = GenerationRequest(prompt_tokens=tuple(ids), max_tokens=args.new)
        cache = make_prompt_cache(target.model)
        full = _finish(ChunkedPrefill(target.model, 512).prefill(PrefillTask(req, cache)))
        ref = _greedy(target.model, cache, full.logits, args.new)
        scores = _finish(score_tokens(draft_stack, req.prompt_tokens, 8, 512))
        row: dict[str, Any] = {"source": path.name, "tokens": len(ids)}
        for keep in keeps:
            for method in ("scored", "uniform"):
                if method == "scored":
                    kept = select_chunks(scores, 0, keep, args.chunk, 8)
                else:
                    kept = uniform_chunks(len(ids), 0, keep, args.chunk, 8)
                cache = make_prompt_cache(target.model)
                logits = _finish(sp._sparse(PrefillTask(req, cache), kept))
                got = _greedy(target.model, cache, logits, args.new)
                row[f"{method}@{keep}"] = _prefix(ref, got)
        results.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
    summary: dict[str, Any] = {"prompts": len(results), "new_tokens": args.new}
    for keep in keeps:
        for method in ("scored", "uniform"):
            key = f"{method}@{keep}"
            vals = [r[key] for r in results]
            summary[key] = {
                "all_match_share": sum(v == args.new for v in vals) / max(1, len(vals)),
                "mean_matching_prefix": sum(vals) / max(1, len(vals)),
            }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": results, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
