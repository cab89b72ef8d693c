#!/usr/bin/env python3
"""Time one scored ``/v1/completions`` request with ``n`` choices on a running server.

The request a stock Schemathesis run sends at its boundaries: a long prompt (about 5,100
tokens of the default model), ``echo`` with 20 logprobs and 20 prompt logprobs, 16 new
tokens each. Prints the seconds it took, the prompt tokens the server ran through the
model for it (``mlxcore_prompt_tokens_processed`` before and after) and whether every
choice carries the same prompt logprobs (docs/benchmarks.md, "n choices").

    .venv/bin/mlxcore serve --port 8811 &
    .venv/bin/python scripts/n_choices_bench.py http://localhost:8811 --n 1 4
"""

from __future__ import annotations

import argparse
import re
import time

import httpx


def processed(base: str) -> float:
    """The server's ``mlxcore_prompt_tokens_processed`` gauge."""
    text = httpx.get(base + "/metrics", timeout=60).text
    found = re.search(r"^mlxcore_prompt_tokens_processed (\S+)$", text, re.MULTILINE)
    if found is None:
        raise SystemExit("the server exports no mlxcore_prompt_tokens_processed")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--words", type=int, default=1000, help="prompt length in word pairs")
    args = parser.parse_args()
    prompt = " ".join(f"w{i % 97} alpha{i % 13}" for i in range(args.words))
    for n in args.n:
        before = processed(args.base_url)
        started = time.perf_counter()
        answer = httpx.post(
            args.base_url + "/v1/completions",
            json={
                "prompt": prompt,
                "n": n,
                "max_tokens": 16,
                "echo": True,
                "logprobs": 20,
                "prompt_logprobs": 20,
                "temperature": 0,
            },
            timeout=3600,
        )
        seconds = time.perf_counter() - started
        if answer.status_code != 200:
            raise SystemExit(f"n={n}: {answer.status_code} {answer.text[:300]}")
        body = answer.json()
        scored = [choice["prompt_logprobs"] for choice in body["choices"]]
        print(
            f"n={n} seconds={seconds:.1f} prompt_tokens={body['usage']['prompt_tokens']} "
            f"processed={processed(args.base_url) - before:.0f} "
            f"same_prompt_logprobs={all(s == scored[0] for s in scored)}"
        )


if __name__ == "__main__":
    main()
