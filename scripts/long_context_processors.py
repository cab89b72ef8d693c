"""Decode cost per token at a long context with and without logits processors (issue 58):
a repetition penalty and a JSON schema must cost at most 10% more per token than plain
decoding at 32K tokens of context.

One in-process engine (the request builder, the engine, no HTTP); the ~``--context``-token
prompt is prefilled once and then reused from the prefix cache, so each measured request
is its decode. Variants run in alternating rounds; each round's figure is the time from
the first token to the last over the tokens between them; the ratio is the median of the
per-round ratios to plain decoding.

    .venv/bin/python scripts/long_context_processors.py MODEL [--context 32768] \
        [--tokens 96] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
    },
    "required": ["title", "items", "count"],
}

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "repetition_penalty": {"sampling": {"repetition_penalty": 1.1}},
    "json_schema": {"schema": SCHEMA},
}


def prompt_ids(tokenizer: Any, context: int) -> list[int]:
    """About ``context`` tokens of varied text, then a request for JSON."""
    words = [
        "river",
        "city",
        "bridge",
        "market",
        "lantern",
        "harbor",
        "orchard",
        "mill",
        "tower",
        "garden",
    ]
    text, i = [], 0
    while len(text) < context:
        text.append(f"{words[i % len(words)]}{i % 97}")
        i += 1
    ids: list[int] = tokenizer.encode(" ".join(text))[: context - 16]
    return ids + tokenizer.encode(" Answer in JSON:")


def decode_rate(runtime: Any, ids: list[int], tokens: int, variant: dict[str, Any]) -> float:
    """Seconds per token after the first, for one request of ``variant``."""
    from mlxcore.engine.events import TokenEvent
    from mlxcore.engine.request import SamplingParams
    from mlxcore.request_builder import Constraint, RequestSpec, TextPrompt, build_generations
    from mlxcore.structured import from_response_format

    schema = variant.get("schema")
    # a finished schema allows only the end of sequence: it must end the request
    sampling = SamplingParams(ignore_eos=schema is None, **variant.get("sampling", {}))
    constraint = None
    if schema is not None:
        fmt = {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
        constraint = Constraint(from_response_format(fmt))
    spec = RequestSpec(
        prompt=TextPrompt(ids=ids),
        sampling=sampling,
        new_id=lambda: "bench",
        max_tokens=tokens,
        constraint=constraint,
        parse=False,
    )
    (generation,) = build_generations(runtime, spec)
    first, count = 0.0, 0
    for event in runtime.engine.stream(generation.request):
        if isinstance(event, TokenEvent):
            first = first or time.perf_counter()
            count += len(event.tokens)
    return (time.perf_counter() - first) / max(1, count - 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from mlxcore.blas import reexec_with_openblas

    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
    from mlxcore.testing.runtime import make_runtime

    runtime = make_runtime(args.model, max_model_len=args.context + args.tokens + 64)
    try:
        ids = prompt_ids(runtime.tokenizer, args.context)
        for variant in VARIANTS.values():  # the prefill, and every variant's first use
            decode_rate(runtime, ids, 4, variant)
        per_round: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                per_round[name].append(decode_rate(runtime, ids, args.tokens, VARIANTS[name]))
            line = ", ".join(f"{n} {per_round[n][-1] * 1e3:.2f} ms" for n in VARIANTS)
            print(f"round {r + 1}: {line}", flush=True)
        result: dict[str, Any] = {"context": len(ids), "tokens": args.tokens}
        for name in VARIANTS:
            ratios = [v / p for v, p in zip(per_round[name], per_round["plain"], strict=True)]
            result[name] = {
                "ms_per_token": round(statistics.median(per_round[name]) * 1e3, 3),
                "vs_plain": round(statistics.median(ratios), 3),
            }
        print(json.dumps(result, indent=2))
    finally:
        runtime.engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
