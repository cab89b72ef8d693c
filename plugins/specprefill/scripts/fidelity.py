"""Fidelity of sparse prefill: attention-scored vs uniform selection, same budget.

For each real-text prompt (see ``fidelity_texts.py``: Python reference docs and
licence texts, 2,000-2,400 tokens, then a question), greedy-decode ``--new`` tokens
after a normal chunked prefill and after sparse prefills at several keep fractions,
with chunks chosen by the draft's attention scores or spread uniformly (same
budget, same chunks, same always-kept head chunk and tail). The target is its own
draft (SmolLM2-135M-Instruct, mlxcore's embedded default model), so the draft's
prefill is the reference prefill and its lookahead tokens are the reference's first
tokens: the scores are exactly what ``scoring.score_tokens`` computes, without a
second full pass.

Reports, per keep and method: the share of prompts whose ``--new`` tokens all equal
the full-prefill ones, the share whose first token does, and the mean length of the
matching prefix. ``--variants`` adds scoring ablations (which queries, how heads are
combined). Run, e.g.::

    flock /tmp/mlxcore-bench.lock .venv/bin/python \\
        plugins/specprefill/scripts/fidelity.py --out /tmp/fidelity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from mlxcore.blas import reexec_with_openblas

# Preload OpenBLAS as the CLI does (MLX's CPU wheel otherwise uses the slow reference BLAS).
if __name__ == "__main__":
    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx
from fidelity_texts import chat_prompt, windows
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import PrefillTask, run_to_completion
from mlxcore.models.default import ensure_default_model
from mlxcore.models.loader import load_model
from mlxcore_specprefill.options import Settings
from mlxcore_specprefill.scoring import (
    argmax_token,
    greedy_tokens,
    observe_queries,
    select_chunks,
    uniform_chunks,
)
from mlxcore_specprefill.stack import TextStack, detect
from mlxcore_specprefill.strategy import SpecPrefill

ABLATIONS = ("prompt8", "prompt8+gen8", "gen8", "prompt8+gen8/mean-heads")
"""Scoring variants: queries (last 8 prompt positions and/or 8 draft-generated
tokens), heads combined by max (default) or mean; layers always by max."""


def _matching(model: Any, cache: Any, logits: mx.array, ref: list[int]) -> int:
    """Greedy tokens from ``logits`` on, compared with ``ref``: the length of the
    matching prefix (decoding stops at the first difference)."""
    token = argmax_token(logits)
    n = 0
    while token == ref[n]:
        n += 1
        if n == len(ref):
            break
        logits = model(mx.array([[token]], dtype=mx.int32), cache=cache)[:, -1, :]
        token = argmax_token(logits)
    return n


def _ablation_scores(
    stack: TextStack, cache: Any, queries: list[int], start: int, n: int, w: int
) -> dict[str, mx.array]:
    """One observed pass of ``queries`` (``w`` prompt + generated tokens), several
    ways of turning the attention into scores."""
    acc: dict[str, mx.array] = {k: mx.zeros((n,), dtype=mx.float32) for k in ABLATIONS}

    def observe(index: int, q: mx.array, keys: mx.array, scale: float) -> None:
        _, heads, length, _ = q.shape
        n_kv, total = keys.shape[1], keys.shape[2]
        group = heads // n_kv
        k = mx.repeat(keys.astype(mx.float32), group, axis=1)[0]  # (H, T, D)
        logits = (q.astype(mx.float32)[0] * scale) @ k.transpose(0, 2, 1)  # (H, L, T)
        q_pos = mx.arange(total - length, total)[:, None]
        logits = mx.where(mx.arange(total)[None] <= q_pos, logits, -mx.inf)
        probs = mx.softmax(logits, axis=-1)[..., :n]  # (H, L, n)
        parts = {
            "prompt8": probs[:, :w].mean(axis=1).max(axis=0),
            "prompt8+gen8": probs.mean(axis=1).max(axis=0),
            "gen8": probs[:, w:].mean(axis=1).max(axis=0),
            "prompt8+gen8/mean-heads": probs.mean(axis=1).mean(axis=0),
        }
        for key, value in parts.items():
            acc[key] = mx.maximum(acc[key], value)
        mx.eval(list(acc.values()))

    ids = mx.array(queries, dtype=mx.int32)[None]
    stack.forward(ids, mx.arange(start, start + len(queries), dtype=mx.int32), cache, observe)
    return acc


def main() -> None:
    """Run the comparison; print per-prompt rows and a summary (JSON and Markdown)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=100, help="at most this many prompts")
    ap.add_argument("--min-tokens", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=2400)
    ap.add_argument("--per-doc", type=int, default=3, help="windows per document")
    ap.add_argument("--every", type=int, default=1, help="use every k-th window only")
    ap.add_argument("--new", type=int, default=16, help="greedy tokens compared")
    ap.add_argument("--keeps", default="0.2,0.3,0.5")
    ap.add_argument(
        "--variants",
        default="scored,uniform",
        help=f"comma list of: scored (the plugin's), uniform, {', '.join(ABLATIONS)}",
    )
    ap.add_argument("--chunk", type=int, default=Settings().chunk)
    ap.add_argument("--tail", type=int, default=Settings().tail, help="always-kept last tokens")
    ap.add_argument("--step", type=int, default=512, help="prefill step size")
    ap.add_argument("--out", default=None, help="write rows and summary here (JSON)")
    args = ap.parse_args()
    keeps = [float(k) for k in args.keeps.split(",")]
    variants = args.variants.split(",")
    unknown = set(variants) - {"scored", "uniform", *ABLATIONS}
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}")
    settings = Settings(threshold=0, chunk=args.chunk, tail=args.tail)
    w, decode = settings.lookahead, settings.decode
    loaded = load_model(ensure_default_model())
    model, tok = loaded.model, loaded.tokenizer
    stack = detect(model)
    sp = SpecPrefill(stack, stack, settings, args.step)
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for index, window in enumerate(windows(tok, args.min_tokens, args.max_tokens, args.per_doc)):
        if index % args.every:
            continue
        if len(rows) >= args.prompts:
            break
        ids = chat_prompt(tok, window, index)
        n = len(ids)
        req = GenerationRequest(prompt_tokens=tuple(ids), max_tokens=args.new)
        cache = make_prompt_cache(model)
        full = run_to_completion(ChunkedPrefill(model, args.step).prefill(PrefillTask(req, cache)))
        need = max(args.new, decode, 8)
        ref = greedy_tokens(model, cache, full.logits, need)
        # the draft is the target: its lookahead tokens are the reference's first ones
        trim_prompt_cache(cache, w + need - 1)
        queries = [*ids[n - w :], *ref[:8]]
        scores: dict[str, mx.array] = {}
        if "scored" in variants:
            own = [*ids[n - w :], *ref[:decode]]
            scores["scored"] = observe_queries(stack, cache, own, n - w, n)
            trim_prompt_cache(cache, len(own))  # back to n - w for the ablations
        if any(v in ABLATIONS for v in variants):
            scores.update(_ablation_scores(stack, cache, queries, n - w, n, w))
        row: dict[str, Any] = {
            "source": window.source,
            "chars": [window.start, window.end],
            "tokens": n,
            "reference": tok.decode(ref[: args.new]),
        }
        for keep in keeps:
            for variant in variants:
                if variant == "uniform":
                    kept = uniform_chunks(n, 0, keep, args.chunk, args.tail)
                else:
                    kept = select_chunks(scores[variant], 0, keep, args.chunk, args.tail)
                sparse = make_prompt_cache(model)
                logits = run_to_completion(sp._sparse(PrefillTask(req, sparse), kept))
                row[f"{variant}@{keep}"] = _matching(model, sparse, logits, ref[: args.new])
        row["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=2))
    summary = _summary(rows, keeps, variants, args.new)
    print(json.dumps(summary, indent=2))
    print(_markdown(summary, keeps, variants, args.new))
    if args.out:
        out = {"args": vars(args), "rows": rows, "summary": summary}
        Path(args.out).write_text(json.dumps(out, indent=2))


def _summary(
    rows: list[dict[str, Any]], keeps: list[float], variants: list[str], new: int
) -> dict[str, Any]:
    summary: dict[str, Any] = {"prompts": len(rows), "new_tokens": new}
    if rows:
        summary["tokens_min_max"] = [min(r["tokens"] for r in rows), max(r["tokens"] for r in rows)]
    for keep in keeps:
        for variant in variants:
            vals = [r[f"{variant}@{keep}"] for r in rows]
            count = max(1, len(vals))
            summary[f"{variant}@{keep}"] = {
                "all_match": sum(v == new for v in vals),
                "first_token_match": sum(v >= 1 for v in vals),
                "mean_matching_prefix": round(sum(vals) / count, 2),
            }
    return summary


def _markdown(summary: dict[str, Any], keeps: list[float], variants: list[str], new: int) -> str:
    n = summary["prompts"]
    head = "| keep | " + " | ".join(variants) + " |"
    lines = [head, "| --- |" + " --- |" * len(variants)]
    for keep in keeps:
        cells = []
        for variant in variants:
            s = summary[f"{variant}@{keep}"]
            cells.append(
                f"{s['all_match']}/{n} all {new}; first {s['first_token_match']}/{n}; "
                f"prefix {s['mean_matching_prefix']:.1f}"
            )
        lines.append(f"| {keep} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
