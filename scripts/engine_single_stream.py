"""Single-stream greedy decode in one process on the same weights: mlx-lm's
``stream_generate`` against mlxcore's engine (request builder, engine, no HTTP), rounds
alternating, the median of per-round ratios (issue 37: is the single-stream gap in the
engine or in the HTTP path?).

    .venv/bin/python scripts/engine_single_stream.py MODEL [--tokens 256] [--rounds 8]

``MLXCORE_SETTLE_FREE=1`` runs the engine's steps without the near-tie check's wait.
Prints one line per round and the median ratio (engine / mlx-lm).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

TEXT = "Write a long story about a river and a city."


def library_rate(model: Any, tokenizer: Any, tokens: int) -> float:
    """mlx-lm's decode rate (tokens after the first per second)."""
    from mlx_lm import stream_generate

    started, count = 0.0, 0
    for response in stream_generate(model, tokenizer, tokenizer.encode(TEXT), max_tokens=tokens):
        started = started or time.perf_counter()
        count = response.generation_tokens
    return (count - 1) / (time.perf_counter() - started)


def engine_rate(runtime: Any, tokens: int) -> float:
    """The engine's decode rate for the same prompt (raw text; greedy, so it stops where
    mlx-lm stops)."""
    from mlxcore.cli.commands import generate_spec
    from mlxcore.engine.events import TokenEvent
    from mlxcore.request_builder import build_generations

    args = argparse.Namespace(raw=True, prompt=TEXT, system=None, temperature=0.0, seed=None,
                              request_options={}, max_tokens=tokens)  # fmt: skip
    (generation,) = build_generations(runtime, generate_spec(args))
    started, count = 0.0, 0
    for event in runtime.engine.stream(generation.request):
        if isinstance(event, TokenEvent):
            started = started or time.perf_counter()
            count += len(event.tokens)
    return (count - 1) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    from mlxcore.blas import reexec_with_openblas

    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
    from mlxcore.testing.runtime import make_runtime

    runtime = make_runtime(args.model)
    try:
        library_rate(runtime.model, runtime.tokenizer, args.tokens)  # first use of shapes
        engine_rate(runtime, args.tokens)
        ratios = []
        for i in range(args.rounds):
            lib = library_rate(runtime.model, runtime.tokenizer, args.tokens)
            eng = engine_rate(runtime, args.tokens)
            ratios.append(eng / lib)
            print(f"round {i}: mlx-lm {lib:.1f} engine {eng:.1f} tok/s, {eng / lib:.3f}")
        print(f"median ratio {statistics.median(ratios):.3f}")
    finally:
        runtime.engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
