"""Time the main model's forward pass over 1..4 positions, at batch size 1 and 4, and one
head draft: what a verification round costs next to a plain step on this machine.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 flock /tmp/mlxcore-bench.lock \
        .venv/bin/python plugins/qwen35-mtp/scripts/forward_cost.py MODEL
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import mlx.core as mx

from mlxcore.models import load_model
from mlxcore_qwen35_mtp.head import build_head


def median_ms(fn: Callable[[], None], runs: int = 15) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[runs // 2] * 1000


def main(path: str) -> None:
    loaded = load_model(path)
    model = loaded.model
    head = build_head(model, loaded.info)
    prompt = [5, 77, 300, 12, 900, 41] * 20
    for batch in (1, 4):
        caches = []
        for i in range(batch):
            cache = model.make_cache()
            model(mx.array([prompt[: 100 + i]]), cache=cache)
            caches.append(cache)
        merged = [layer.merge([c[i] for c in caches]) for i, layer in enumerate(caches[0])]
        cache = caches[0] if batch == 1 else merged
        mx.eval([c.state for c in cache])
        for steps in (1, 2, 3, 4):

            def forward(steps: int = steps, batch: int = batch, cache: list = cache) -> None:
                saved = [None if c.is_trimmable() else list(c.cache) for c in cache]
                mx.eval(model(mx.array([[5] * steps] * batch), cache=cache))
                for c, s in zip(cache, saved, strict=True):
                    if s is None:
                        c.trim(steps)
                    else:
                        c.cache = s

            print(f"batch {batch}, {steps} position(s) per row: {median_ms(forward):.1f} ms")
    mtp_cache = head.make_cache()
    hidden = mx.zeros((1, 1, model.language_model.args.hidden_size))

    def draft() -> None:
        _, logits = head.draft(mx.array([[5]]), hidden, mtp_cache)
        mx.eval(logits)
        mtp_cache[0].trim(1)

    print(f"head draft (batch 1): {median_ms(draft):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
