"""What a turn's prefill costs at a long context in mlx-lm itself: the time
``mlx_lm.stream_generate`` takes to its first token for ``--new`` tokens on top of a cache
already holding ``--contexts`` tokens (the model's own compute, no server, no prefix
cache). Used in docs/benchmarks.md ("Long agent sessions") to tell what of a long
session's TTFT is the model's attention over the history.

    .venv/bin/python scripts/long_context_prefill.py [--model qwen3|qwen3_5]
        [--new 7000] [--contexts 39000,110000]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.models.loader import load_model
from mlxcore.testing.models import build_test_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("qwen3", "qwen3_5"), default="qwen3")
    parser.add_argument("--new", type=int, default=7_000)
    parser.add_argument("--contexts", default="39000,110000")
    args = parser.parse_args()
    loaded = load_model(build_test_model(args.model, max_position_embeddings=262_144))
    model, tokenizer = loaded.model, loaded.tokenizer
    results = {}
    for context in (int(c) for c in args.contexts.split(",")):
        cache = make_prompt_cache(model)
        for start in range(0, context, 2048):  # fill the history as mlx-lm's prefill does
            chunk = mx.arange(start, min(context, start + 2048))[None] % 5000 + 100
            model(chunk, cache=cache)
            mx.eval([c.state for c in cache])
        new = [100 + (i * 7) % 5000 for i in range(args.new)]
        started = time.perf_counter()
        for _ in stream_generate(model, tokenizer, new, max_tokens=1, prompt_cache=cache):
            break
        results[context] = time.perf_counter() - started
        print(f"{args.model}: {args.new} new tokens on {context} cached: "
              f"{results[context]:.2f} s to the first token", flush=True)  # fmt: skip
    first, *_, last = results.values()
    print(f"ratio last / first context: {last / first:.2f}")


if __name__ == "__main__":
    main()
