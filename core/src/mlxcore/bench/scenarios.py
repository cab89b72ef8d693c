"""The workloads of ``mlxcore bench --peer``: uniform load, mixed long/short load, a shared
prefix. Each runs against one OpenAI-compatible server and returns plain numbers.

* **uniform N**: N concurrent greedy streams of long-writing prompts.
* **mixed**: ``decoders`` streams are decoding when a cold prompt of ``long_tokens`` tokens
  arrives; ``burst_delay`` seconds later a burst of ``burst`` short requests arrives. It
  reports the running streams' inter-token latency while the long prompt waits for its
  first token, the long prompt's TTFT and the short requests' TTFT. The running streams
  are closed once the long and the short requests have finished.
* **shared prefix**: ``sessions`` requests sharing one new system prompt of
  ``prefix_tokens`` tokens (different questions) arrive at once.

Latencies are measured at the client, per output chunk: a server that sends one chunk per
token (both mlxcore and ``mlx_lm.server`` do) gives inter-token latencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx

from mlxcore.bench import workloads
from mlxcore.bench.client import HttpTarget, stream_chat
from mlxcore.bench.results import StreamRun, median_of, percentile

#: The questions of the shared-prefix sessions and of the short burst (cycled).
QUESTIONS = (
    "Which note mentions a harbour? Answer with its number.",
    "List three nouns that appear in the register.",
    "How many notes mention a quarry?",
    "Which code appears first in the register?",
    "Name a note that mentions a signal.",
    "What is the register about, in five words?",
    "Which adjective appears most often?",
    "Give the number of the last note.",
)


@attrs.frozen
class MixedSpec:
    """The shape of the mixed workload (see the module docstring)."""

    decoders: int = 8
    long_tokens: int = 8000
    burst: int = 16
    burst_delay: float = 0.5
    short_max_tokens: int = 8


def _gaps(times: Sequence[float]) -> list[tuple[float, float]]:
    return list(itertools.pairwise(times))


def latency_summary(runs: Sequence[StreamRun], wall: float) -> dict[str, float]:
    """TTFT and inter-token latency percentiles, per-stream decode and aggregate tok/s."""
    itl = [b - a for run in runs for a, b in _gaps(run.chunk_times)]
    ttft = [r.ttft_s for r in runs]
    tokens = sum(r.completion_tokens for r in runs)
    return {
        "ttft_p50_s": round(percentile(ttft, 50), 6),
        "ttft_p99_s": round(percentile(ttft, 99), 6),
        "itl_p50_s": round(percentile(itl, 50), 6),
        "itl_p99_s": round(percentile(itl, 99), 6),
        "stream_decode_tok_s": round(median_of([r.decode_tok_s for r in runs]), 3),
        "aggregate_tok_s": round(tokens / wall if wall > 0 else 0.0, 3),
        "completion_tokens": tokens,
        "wall_s": round(wall, 4),
    }


async def uniform(
    http: httpx.AsyncClient, target: HttpTarget, n: int, max_tokens: int, offset: int = 0
) -> dict[str, float]:
    """``n`` concurrent long-writing streams (topics from ``offset`` on)."""
    start = time.perf_counter()
    runs = await asyncio.gather(
        *(
            stream_chat(http, target, workloads.writing_messages(offset + i), max_tokens)
            for i in range(n)
        )
    )
    return latency_summary(runs, time.perf_counter() - start)


async def _wait_for_chunks(
    timelines: list[list[float]], tasks: list[asyncio.Task[Any]], count: int, timeout: float
) -> None:
    """Wait until every stream produced ``count`` chunks (or already ended)."""
    deadline = time.perf_counter() + timeout
    while any(len(t) < count and not task.done() for t, task in zip(timelines, tasks, strict=True)):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the running streams did not produce {count} chunks each")
        await asyncio.sleep(0.02)


async def mixed(
    http: httpx.AsyncClient,
    target: HttpTarget,
    spec: MixedSpec,
    long_messages: list[workloads.Message],
    short_messages: list[list[workloads.Message]],
) -> dict[str, Any]:
    """The mixed workload; ``long_messages`` must be cold (nothing served shares it)."""
    timelines: list[list[float]] = [[] for _ in range(spec.decoders)]
    decoders = [
        asyncio.create_task(
            stream_chat(http, target, workloads.writing_messages(i), 4096, times=timelines[i])
        )
        for i in range(spec.decoders)
    ]
    try:
        await _wait_for_chunks(timelines, decoders, 4, timeout=600)
        t0 = time.perf_counter()
        long_task = asyncio.create_task(stream_chat(http, target, long_messages, 8))
        await asyncio.sleep(spec.burst_delay)
        shorts = await asyncio.gather(
            *(stream_chat(http, target, m, spec.short_max_tokens) for m in short_messages)
        )
        long_run = await long_task
    finally:
        for task in decoders:
            task.cancel()
        for task in decoders:
            with contextlib.suppress(BaseException):
                await task
    t1 = t0 + long_run.ttft_s
    during = [b - a for t in timelines for a, b in _gaps(t) if b > t0 and a < t1]
    short_ttft = [r.ttft_s for r in shorts]
    return {
        "long_prompt_tokens": long_run.prompt_tokens,
        "long_cached_tokens": long_run.cached_tokens,
        "long_ttft_s": round(long_run.ttft_s, 6),
        "running_itl_p50_s": round(percentile(during, 50), 6),
        "running_itl_p99_s": round(percentile(during, 99), 6),
        "running_itl_max_s": round(max(during, default=0.0), 6),
        "running_gaps": len(during),
        "short_ttft_p50_s": round(percentile(short_ttft, 50), 6),
        "short_ttft_p99_s": round(percentile(short_ttft, 99), 6),
    }


async def shared_prefix(
    http: httpx.AsyncClient,
    target: HttpTarget,
    prefix: str,
    sessions: int,
    max_tokens: int,
) -> dict[str, Any]:
    """``sessions`` requests with the same new system prompt, all at once."""
    prompts = [
        workloads.prefix_messages(prefix, f"{QUESTIONS[i % len(QUESTIONS)]} (session {i})")
        for i in range(sessions)
    ]
    start = time.perf_counter()
    runs = await asyncio.gather(*(stream_chat(http, target, m, max_tokens) for m in prompts))
    out: dict[str, Any] = latency_summary(runs, time.perf_counter() - start)
    out["prompt_tokens"] = sum(r.prompt_tokens for r in runs)
    out["cached_tokens"] = sum(r.cached_tokens for r in runs)
    return out


def short_burst(count: int, word: str) -> list[list[workloads.Message]]:
    """``count`` short, distinct questions (``word`` keeps them new for this round)."""
    return [
        [{"role": "user", "content": f"{word} {i}: {QUESTIONS[i % len(QUESTIONS)]}"}]
        for i in range(count)
    ]
