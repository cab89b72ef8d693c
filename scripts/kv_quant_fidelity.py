"""What ``--kv-cache-dtype int8|int4`` costs in answers and saves in memory.

For each quantization, on one model (default: the embedded SmolLM2-135M-Instruct):

- free-running: 20 chat prompts x 128 greedy tokens through the real engine (all 20
  submitted together, so they decode as one batch), compared with the same engine on a
  full-precision cache: sequences identical, the mean index of the first different token,
  and the share of positions that agree;
- teacher-forced: the full-precision continuation fed through a quantized cache, the share
  of positions where the quantized model's greedy pick is the same token (the per-token
  fidelity, free of the way one early difference changes everything after it);
- memory: cache bytes per token (measured on the model), and MLX's peak memory above the
  weights while 8 requests of ~1,500 prompt tokens each generate 64 tokens together.

Usage: ``.venv/bin/python scripts/kv_quant_fidelity.py [MODEL] [--start N]`` (run it with
OpenBLAS preloaded, as ``mlxcore`` does: ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime, submit_together

QUESTIONS = [
    "Explain how a hash map handles collisions.",
    "Write a Python function that reverses a linked list.",
    "What causes the seasons on Earth?",
    "Summarise the plot of Romeo and Juliet in a paragraph.",
    "How do vaccines train the immune system?",
    "Give three tips for writing clear commit messages.",
    "What is the difference between TCP and UDP?",
    "Describe how photosynthesis works.",
    "Write a haiku about autumn rain.",
    "Why is the sky blue?",
    "How does binary search work? Give an example.",
    "What are the main causes of inflation?",
    "Explain recursion to a ten-year-old.",
    "List the planets of the solar system with one fact each.",
    "How should I prepare for a job interview?",
    "What is a closure in JavaScript?",
    "Describe the water cycle.",
    "Write a short story opening about a lighthouse keeper.",
    "What does a compiler do?",
    "Compare renewable and fossil energy sources.",
]
LONG_TEXT = (
    "The history of computing spans mechanical calculators, vacuum tubes, transistors, "
    "integrated circuits and the networked machines of today. "
)


def chat_prompt(rt: Runtime, question: str) -> tuple[int, ...]:
    messages = [{"role": "user", "content": question}]
    ids: Any = rt.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return tuple(ids)


def engine(model: str, dtype: str, start: int) -> Runtime:
    return make_runtime(model, kv_cache_dtype=dtype, kv_quant_start=start, max_num_seqs=32)


def free_running(rt: Runtime, prompts: list[tuple[int, ...]], n: int) -> list[list[int]]:
    results = submit_together(rt, [GenerationRequest(p, n) for p in prompts], timeout=1800)
    return [r.tokens for r in results]


def teacher_forced(rt: Runtime, prompt: tuple[int, ...], continuation: list[int]) -> float:
    """Share of the continuation's tokens the quantized cache also picks greedily."""
    kv = rt.engine.kv_quant
    cache = make_prompt_cache(rt.model)
    rt.model(mx.array([prompt[:-1]]), cache=cache)
    if kv is not None:
        kv.quantize_prefill(cache)
    fed = mx.array([[prompt[-1], *continuation[:-1]]])
    picks = mx.argmax(rt.model(fed, cache=cache)[0], axis=-1).tolist()
    return sum(int(a == b) for a, b in zip(picks, continuation, strict=True)) / len(continuation)


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def peak_above_weights(rt: Runtime, n_requests: int = 8) -> tuple[float, float]:
    """(peak MB above the weights, seconds) for n long requests generating together."""
    base = chat_prompt(rt, LONG_TEXT * 50)
    prompts = [(*base[:-8], 1000 + i, *base[-8:]) for i in range(n_requests)]
    mx.clear_cache()
    weights = mx.get_active_memory()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    submit_together(rt, [GenerationRequest(p, 64) for p in prompts], timeout=1800)
    return (mx.get_peak_memory() - weights) / 2**20, time.perf_counter() - t0


def main() -> None:
    from mlxcore.models.default import ensure_default_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--start", type=int, default=0, help="--kv-quant-start")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    model = args.model or str(ensure_default_model())

    full = engine(model, "auto", 0)
    prompts = [chat_prompt(full, q) for q in QUESTIONS]
    reference = free_running(full, prompts, args.tokens)
    ref_peak, ref_seconds = peak_above_weights(full)
    print(
        f"model {model}; {len(prompts)} prompts x {args.tokens} tokens, "
        f"--kv-quant-start {args.start}"
    )
    print(
        f"auto: {full.engine.memory.per_token} B/token; peak above weights, 8 x ~1.5K-token "
        f"requests: {ref_peak:.0f} MB ({ref_seconds:.1f} s)"
    )
    full.engine.shutdown()
    for dtype in ("int8", "int4"):
        rt = engine(model, dtype, args.start)
        got = free_running(rt, prompts, args.tokens)
        same = sum(a == b for a, b in zip(got, reference, strict=True))
        firsts = [first_difference(a, b) for a, b in zip(got, reference, strict=True)]
        positions = sum(
            x == y for a, b in zip(got, reference, strict=True) for x, y in zip(a, b, strict=False)
        )
        total = sum(len(b) for b in reference)
        forced = [teacher_forced(rt, p, c) for p, c in zip(prompts, reference, strict=True)]
        peak, seconds = peak_above_weights(rt)
        quantized = rt.engine.memory.quantized
        per_token = quantized[0] if quantized else 0
        print(
            f"{dtype}: identical {same}/{len(prompts)}; first difference mean "
            f"{statistics.mean(firsts):.1f} (median {statistics.median(firsts):.0f}); positions "
            f"agreeing {positions / total:.3f}; teacher-forced agreement "
            f"{statistics.mean(forced):.4f} (min {min(forced):.3f}); {per_token} B/token "
            f"({full.engine.memory.per_token / max(1, per_token):.2f}x less); peak above weights "
            f"{peak:.0f} MB ({ref_peak / max(peak, 1e-9):.2f}x less, {seconds:.1f} s)"
        )
        rt.engine.shutdown()


if __name__ == "__main__":
    main()
