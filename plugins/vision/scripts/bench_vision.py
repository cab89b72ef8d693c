"""Image requests: mlxcore's engine against mlx-vlm's own generation, side by side.

For N different images (so the encoding cache never hits), this measures

* mlx-vlm in this process: ``mlx_vlm.stream_generate`` one request after the other (how
  mlx-vlm and servers built on its single-sequence loop serve them);
* mlxcore over HTTP (a real ``mlxcore serve``, streaming): one request at a time, and
  all N at once (media prefills one at a time, then every sequence decodes in one
  batch).

Rounds alternate the two so that a noisy machine hurts both alike; medians are reported.
Both sides use the same BLAS (OpenBLAS is preloaded here as in the server).

    python plugins/vision/scripts/bench_vision.py MODEL [--images 4] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
from PIL import Image

from mlxcore.bench.client import HttpTarget, concurrent_streams, http_client
from mlxcore.bench.server import ServerProcess
from mlxcore.blas import reexec_with_openblas

PROMPT = "Describe this picture in detail."


def images(n: int, size: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)
    ]


def data_uri(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def mlx_vlm_round(
    model: Any, processor: Any, pictures: list[Image.Image], max_tokens: int
) -> dict[str, float]:
    """Every image through ``mlx_vlm.stream_generate``, one after the other."""
    from mlx_vlm import stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    prompt = apply_chat_template(processor, model.config, PROMPT, num_images=1)
    ttfts, tokens = [], 0
    start = time.perf_counter()
    for picture in pictures:
        t0 = time.perf_counter()
        first, produced = None, 0
        for response in stream_generate(
            model, processor, prompt, image=[picture], max_tokens=max_tokens, temperature=0.0
        ):
            if first is None:
                first = time.perf_counter() - t0
            produced = max(produced, response.generation_tokens)
        tokens += produced
        ttfts.append(first or 0.0)
    wall = time.perf_counter() - start
    return {"aggregate_tok_s": tokens / wall, "ttft_median_s": statistics.median(ttfts)}


def mlxcore_round(
    target: HttpTarget, pictures: list[Image.Image], max_tokens: int, together: bool
) -> dict[str, float]:
    """Every image as a streamed chat request: all at once, or one after the other."""

    def messages(picture: Image.Image) -> list[Any]:
        return [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_uri(picture)}},
                    {"type": "text", "text": PROMPT},
                ],
            }
        ]

    async def run() -> dict[str, float]:
        async with http_client() as client:
            if together:
                _, summary = await concurrent_streams(
                    client, target, [messages(p) for p in pictures], max_tokens
                )
                return {k: summary[k] for k in ("aggregate_tok_s", "ttft_median_s")}
            tokens, ttfts, start = 0, [], time.perf_counter()
            for picture in pictures:
                runs, _ = await concurrent_streams(client, target, [messages(picture)], max_tokens)
                tokens += runs[0].completion_tokens
                ttfts.append(runs[0].ttft_s)
            wall = time.perf_counter() - start
            return {"aggregate_tok_s": tokens / wall, "ttft_median_s": statistics.median(ttfts)}

    return asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reexec_with_openblas(sys.argv[1:], command=[sys.executable, sys.argv[0]])

    from mlx_vlm import load

    model, processor = load(args.model)
    pictures = images(args.images, args.size)
    results: dict[str, list[dict[str, float]]] = {"mlx_vlm": [], "mlxcore_1": [], "mlxcore_n": []}
    with ServerProcess(args.model) as server:
        server.start(600)
        target = server.target()
        mlxcore_round(target, pictures[:1], 8, together=False)  # warm-up
        mlx_vlm_round(model, processor, pictures[:1], 8)
        for _ in range(args.repeats):
            results["mlx_vlm"].append(mlx_vlm_round(model, processor, pictures, args.max_tokens))
            results["mlxcore_n"].append(mlxcore_round(target, pictures, args.max_tokens, True))
            results["mlxcore_1"].append(mlxcore_round(target, pictures, args.max_tokens, False))
    summary = {
        side: {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        for side, runs in results.items()
    }
    summary["ratios"] = {
        "mlxcore_n_vs_mlx_vlm_aggregate": round(
            summary["mlxcore_n"]["aggregate_tok_s"] / summary["mlx_vlm"]["aggregate_tok_s"], 2
        ),
        "mlxcore_1_vs_mlx_vlm_aggregate": round(
            summary["mlxcore_1"]["aggregate_tok_s"] / summary["mlx_vlm"]["aggregate_tok_s"], 2
        ),
    }
    print(json.dumps({"images": args.images, "max_tokens": args.max_tokens, **summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
