"""What the batched forward pass alone does on this machine: the ceiling for aggregate
decode throughput (issue 58).

For each row count: a bare decode step (``model(tokens[B, 1], cache)`` then ``argmax``,
evaluated step by step over a cache of ``--context`` tokens per row), mlx-lm's
``batch_generate`` (its scheduler, greedy, ``--max-tokens`` per prompt), and the engine
in process (``mlxcore.engine``, no HTTP) on the same prompts. Prints tokens per second and
each one's share of the bare step.

    .venv/bin/python scripts/batch_ceiling.py MODEL [--rows 1,16,64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcore import blas


def bare_steps(model: Any, rows: int, context: int, steps: int) -> float:
    """Decode tokens per second of ``rows`` rows at ``context`` tokens, model and argmax only."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prompt = mx.random.randint(0, 1000, (rows, context))
    logits = model(prompt, cache=cache)
    tokens = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(tokens)
    for _ in range(3):  # warm-up
        tokens = mx.argmax(model(tokens[:, None], cache=cache)[:, -1, :], axis=-1)
        mx.eval(tokens)
    started = time.perf_counter()
    for _ in range(steps):
        tokens = mx.argmax(model(tokens[:, None], cache=cache)[:, -1, :], axis=-1)
        mx.async_eval(tokens)
    mx.eval(tokens)
    return rows * steps / (time.perf_counter() - started)


def mlx_lm_batch(model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int) -> float:
    """Generated tokens per second of mlx-lm's ``batch_generate`` (prefill included)."""
    from mlx_lm.generate import batch_generate

    started = time.perf_counter()
    out = batch_generate(model, tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True)
    elapsed = time.perf_counter() - started
    return sum(len(t) for t in out.token_ids) / elapsed


def engine_batch(folder: str, prompts: list[list[int]], max_tokens: int, seqs: int) -> float:
    """Generated tokens per second of mlxcore's engine in process (prefill included)."""
    import threading

    from mlxcore.engine.events import FinishEvent, TokenEvent
    from mlxcore.engine.request import GenerationRequest, SamplingParams
    from mlxcore.testing.runtime import make_runtime

    runtime = make_runtime(folder, max_num_seqs=seqs)
    engine = runtime.engine
    try:
        counts = [0] * len(prompts)
        done = threading.Semaphore(0)

        def sink_for(i: int) -> Any:
            def sink(event: Any) -> None:
                if isinstance(event, TokenEvent):
                    counts[i] += len(event.tokens)
                elif isinstance(event, FinishEvent):
                    done.release()

            return sink

        def run() -> float:
            counts[:] = [0] * len(prompts)
            started = time.perf_counter()
            for i, p in enumerate(prompts):
                req = GenerationRequest(
                    prompt_tokens=p,
                    max_tokens=max_tokens,
                    sampling=SamplingParams(ignore_eos=True),
                )
                engine.submit(req, sink_for(i))
            for _ in prompts:
                done.acquire()
            return sum(counts) / (time.perf_counter() - started)

        run()  # warm-up
        return run()
    finally:
        engine.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rows", default="1,16,64")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=32, help="timed bare steps")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    blas.reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
    from mlx_lm import load

    model, tokenizer = load(args.model)
    results = []
    for rows in [int(x) for x in args.rows.split(",")]:
        prompts = [
            [int(t) for t in mx.random.randint(100, 1000, (args.context,)).tolist()]
            for _ in range(rows)
        ]
        bare = bare_steps(model, rows, args.context, args.steps)
        batch = mlx_lm_batch(model, tokenizer, prompts, args.max_tokens)
        eng = engine_batch(args.model, prompts, args.max_tokens, max(rows, 1))
        row = {
            "rows": rows,
            "bare_step_tok_s": round(bare, 1),
            "mlx_lm_batch_generate_tok_s": round(batch, 1),
            "engine_tok_s": round(eng, 1),
            "batch_generate_share": round(batch / bare, 3),
            "engine_share": round(eng / bare, 3),
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
