"""Prompt lookup on vs off, one engine, alternating rounds: an edit workload and one with
nothing to copy.

* edit: the prompt holds a ~2,000-token Python file and asks for it back with one change
  (the workload prompt lookup is for: most of the answer is in the prompt);
* no-copy: a story request (nothing to copy; measures what the lookup costs).

Each round runs one request with ``{"speculative": true}`` and one with ``false`` (order
alternating), greedy, ``--tokens`` tokens; decode speed is tokens after the first over
the time from the first token to the last. Prints the per-round speeds, the median of
the per-round ratios, and whether both answers were identical (they must be).

Usage (OpenBLAS preloaded, as ``mlxcore`` does)::

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/prompt_lookup_bench.py [MODEL] [--rounds 3] [--tokens 384]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from mlxcore.bench import workloads
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime

WORKLOADS = {
    "edit": workloads.edit_messages(0),
    "no-copy": [
        {"role": "user", "content": "Write a long story about a dragon who learns to paint."}
    ],
}


def timed(rt: Runtime, prompt: tuple[int, ...], tokens: int, speculative: bool) -> Any:
    """(token ids, decode tokens/s) of one greedy request."""
    stamps: list[float] = []
    out: list[int] = []
    done = threading.Event()

    def sink(event: object) -> None:
        if isinstance(event, TokenEvent):
            stamps.append(time.perf_counter())
            out.extend(t.token for t in event.tokens)
        elif isinstance(event, FinishEvent):
            done.set()

    request = GenerationRequest(prompt, tokens, options={"speculative": speculative})
    rt.engine.submit(request, sink)
    done.wait(1800)
    speed = (len(out) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return out, speed


def main() -> None:
    from mlxcore.models.default import ensure_default_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=384)
    args = parser.parse_args()
    model = args.model or str(ensure_default_model())
    rt = make_runtime(model, "prompt-lookup")
    try:
        for name, messages in WORKLOADS.items():
            ids: Any = rt.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            prompt = tuple(ids)
            timed(rt, prompt, 8, True)  # warm-up (the prompt is cached from here on)
            speeds: dict[bool, list[float]] = {True: [], False: []}
            answers: dict[bool, list[int]] = {}
            for r in range(args.rounds):
                for spec in (True, False) if r % 2 == 0 else (False, True):
                    answers[spec], speed = timed(rt, prompt, args.tokens, spec)
                    speeds[spec].append(speed)
            ratios = [a / b for a, b in zip(speeds[True], speeds[False], strict=True)]
            print(
                f"{name}: prompt {len(prompt)} tokens; on {[round(s, 1) for s in speeds[True]]} "
                f"tok/s, off {[round(s, 1) for s in speeds[False]]} tok/s; ratio median "
                f"{statistics.median(ratios):.2f} (rounds {[round(x, 2) for x in ratios]}); "
                f"identical answers: {answers[True] == answers[False]}"
            )
        stats = {k: v for k, v in rt.engine.stats().items() if "speculative" in k and v}
        print(stats)
    finally:
        rt.engine.shutdown()


if __name__ == "__main__":
    main()
