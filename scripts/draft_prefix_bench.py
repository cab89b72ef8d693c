"""The draft model's prefix store on vs off: an agent's next turn, side by side.

Two runtimes of the same target and draft (``--plugin draft``), one with the draft's
prefix store, one without (``draft_prefix_cache_size=0``). Per round, a new conversation
of ``--context`` tokens gets a first answer on each, then a second turn (the first turn,
its answer and a new question): the target's own prefix cache serves the conversation on
both, so what differs is the draft. A speculating sequence's draft cache is built when it
joins the batch, after its first token: the second token's wait is where a full draft
prefill shows. Prints per round the second turn's time to the first and to the second
token, the draft tokens prefilled, and the median ratios (store on / off); the answers
must be identical (greedy: both are the target's).

Usage (OpenBLAS preloaded, as ``mlxcore`` does)::

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/draft_prefix_bench.py [TARGET DRAFT] [--rounds 3] [--context 3500]

Without TARGET and DRAFT: the ``qwen3`` small test model and a one-layer model of the same
shape (another seed) as the draft.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from typing import Any

from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime


def run(rt: Runtime, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """One greedy request: its tokens and the times to its first and second token."""
    times: list[float] = []
    tokens: list[int] = []
    done = threading.Event()

    def sink(event: object) -> None:
        if isinstance(event, TokenEvent):
            times.append(time.perf_counter())
            tokens.extend(t.token for t in event.tokens)
        elif isinstance(event, FinishEvent):
            done.set()

    started = time.perf_counter()
    rt.engine.submit(GenerationRequest(prompt, max_tokens), sink)
    if not done.wait(600):
        raise TimeoutError("no answer in 600 s")
    return {
        "tokens": tokens,
        "first_s": times[0] - started,
        "second_s": times[1] - started if len(times) > 1 else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="TARGET DRAFT (default: test models)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=3500, help="first turn's prompt tokens")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    args = parser.parse_args()
    if args.models:
        target, draft = args.models
    else:
        from mlxcore.testing import build_test_model

        target = str(build_test_model("qwen3", size="small"))
        draft = str(build_test_model("qwen3", size="small", seed=1, num_hidden_layers=1))
    sides: dict[str, Runtime] = {}
    for name, size in (("on", 256 * 2**20), ("off", 0)):
        options = {"draft_model": draft, "draft_auto_off": False, "draft_prefix_cache_size": size}
        sides[name] = make_runtime(target, "draft", plugin_options=options)
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {"first": [], "second": []}
    try:
        for r in range(args.rounds):
            first = [rng.randrange(300, 30000) for _ in range(args.context)]
            question = [rng.randrange(300, 30000) for _ in range(40)]
            seen: dict[str, dict[str, Any]] = {}
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                rt = sides[name]
                before = rt.engine.decoder.stats()["draft_prefilled_tokens"]
                answer = run(rt, first, args.tokens)["tokens"]
                mid = rt.engine.decoder.stats()["draft_prefilled_tokens"]
                seen[name] = run(rt, [*first, *answer, *question], args.tokens)
                seen[name]["draft_prefilled"] = (
                    mid - before,
                    rt.engine.decoder.stats()["draft_prefilled_tokens"] - mid,
                )
            on, off = seen["on"], seen["off"]
            same = on["tokens"] == off["tokens"]
            for key in ratios:
                ratios[key].append(on[f"{key}_s"] / off[f"{key}_s"])
            print(
                f"round {r + 1}: second turn, to the 1st token {on['first_s']:.3f} s (store on) "
                f"vs {off['first_s']:.3f} s (off), to the 2nd {on['second_s']:.3f} vs "
                f"{off['second_s']:.3f} s; draft tokens prefilled (turn 1, turn 2) "
                f"{on['draft_prefilled']} vs {off['draft_prefilled']}; same answer: {same}"
            )
    finally:
        for rt in sides.values():
            rt.engine.shutdown()
    first_ratio, second_ratio = (statistics.median(ratios[k]) for k in ("first", "second"))
    print(f"median on/off: to the 1st token {first_ratio:.2f}x, to the 2nd {second_ratio:.2f}x")


if __name__ == "__main__":
    main()
