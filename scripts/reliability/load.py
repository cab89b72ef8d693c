"""Concurrency waves, a disconnect storm and a soak, against one real server."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx
from common import RETRY_STATUSES, auth, retry_problem, stream_problem

PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "List three prime numbers.",
    "Explain recursion in one sentence.",
    "Give me a title for a story about a robot.",
    "Summarise: the quick brown fox jumps over the lazy dog.",
]


ADAPTER: str | None = None
"""The name of a LoRA adapter the server serves (``--lora``), or None: some chat requests
then name it as their model, so adapter rows share the batches with the base model's."""


def request_for(i: int, rng: random.Random, max_tokens: int = 16) -> tuple[str, dict[str, Any]]:
    """A realistic mixed request: chat (streamed or not, greedy or sampled, some with a
    regex grammar or a thinking budget, some on a LoRA adapter), a text completion (some
    scoring their prompt, some with two prompts), an Anthropic message, a Responses API response, or
    embeddings (which the engine runs between the steps of the others)."""
    prompt = PROMPTS[i % len(PROMPTS)] + f" (#{i})"
    kind = i % 7
    if kind == 6:
        return "/v1/embeddings", {"input": [prompt] * rng.randint(1, 8)}
    if kind == 5:
        body = {
            "input": prompt,
            "max_output_tokens": max_tokens,
            "stream": rng.random() < 0.5,
            "temperature": rng.choice([0.0, 0.7]),
            "store": rng.random() < 0.5,
        }
        return "/v1/responses", body
    if kind == 3:
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": rng.random() < 0.5}
        extra = rng.random()
        if extra < 0.2:  # scored in the prefill: echo with logprobs, or vLLM's field
            body.update({"echo": True, "logprobs": 1} if extra < 0.1 else {"prompt_logprobs": 2})
        elif extra < 0.3:  # several prompts in one request
            body["prompt"] = [prompt, prompt + " Again."]
        return "/v1/completions", body
    if kind == 4:
        body = {
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
            "stream": rng.random() < 0.5,
            "temperature": rng.choice([0.0, 0.7]),
        }
        return "/v1/messages", body
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": kind == 1,
        "temperature": rng.choice([0.0, 0.8]),
    }
    if kind in (0, 1) and ADAPTER is not None and rng.random() < 0.4:
        body["model"] = ADAPTER
    if kind == 2:
        body["top_k"] = 40
        if rng.random() < 0.3:  # a user grammar, compiled before admission
            body["guided_regex"] = "(yes|no), [a-z ]{1,24}"
        elif rng.random() < 0.3:
            body["thinking_token_budget"] = 4
    return "/v1/chat/completions", body


async def one(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """Outcome (``ok``, ``refused`` or ``failed``) and the problem, if any."""
    try:
        async with client.stream("POST", path, json=body) as r:
            text = (await r.aread()).decode("utf-8", errors="replace")
    except httpx.HTTPError as exc:
        return "failed", f"{path}: connection {type(exc).__name__}: {exc}"
    if r.status_code in RETRY_STATUSES:
        return "refused", retry_problem(r)
    if r.status_code != 200:
        return "failed", f"{path}: HTTP {r.status_code} {text[:200]}"
    if path == "/v1/embeddings":
        data = json.loads(text).get("data", [])
        if len(data) != len(body["input"]) or not all(d.get("embedding") for d in data):
            return "failed", f"{path}: {len(data)} vectors for {len(body['input'])} inputs"
    if body.get("stream"):
        problem = stream_problem(path, r, text)
        return ("failed", problem) if problem else ("ok", None)
    return "ok", None


async def wave(base: str, n: int, seed: int = 0, max_tokens: int = 16) -> dict[str, Any]:
    """``n`` requests on ``n`` connections at once."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base, auth=auth(), timeout=600, limits=limits) as client:
        results = await asyncio.gather(
            *(one(client, *request_for(i, rng, max_tokens)) for i in range(n))
        )
    counts = {k: sum(1 for r in results if r[0] == k) for k in ("ok", "refused", "failed")}
    problems = [p for _, p in results if p]
    return {**counts, "seconds": round(time.monotonic() - started, 1), "problems": problems}


WARM_UP_REQUESTS = 168
"""Distinct requests before a baseline is taken: 144 generations (six in seven of the mix;
the seventh is embeddings), well past the prefix cache's 64 entries, so the cache, MLX's
buffer cache and the heap are at their steady size. With embeddings in the mix and 96 or
112 requests the baseline RSS came out 45-100 MB lower than with 96 generations, and the
waves' RSS-after check tripped, though RSS after the 500 wave was the same as with a
mix without embeddings (1,224 vs 1,225 MB; 2026-11-26)."""


async def warm_up(base: str) -> None:
    """Bring the server to its steady state: caches full, every route used once."""
    await soak(base, seconds=0.0, concurrency=8, requests=WARM_UP_REQUESTS, seed=99)


async def disconnect_storm(base: str, n: int, seed: int = 1) -> dict[str, Any]:
    """``n`` streams whose clients hang up after the first few chunks."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=n + 10)
    problems: list[str] = []
    dropped = 0

    async def hang_up(i: int) -> None:
        nonlocal dropped
        path, body = request_for(i, rng, max_tokens=256)
        if path in ("/v1/completions", "/v1/embeddings"):  # streams of the other routes
            path, body = request_for(i + 2, rng, max_tokens=256)
        body["stream"] = True
        try:
            async with client.stream("POST", path, json=body) as r:
                if r.status_code in RETRY_STATUSES:
                    return
                if r.status_code != 200:
                    problems.append(f"{path}: HTTP {r.status_code}")
                    return
                chunks = 0
                async for _ in r.aiter_bytes():
                    chunks += 1
                    if chunks >= rng.randint(1, 4):
                        dropped += 1
                        return  # leaving the block closes the connection mid-stream
        except httpx.HTTPError as exc:
            problems.append(f"{path}: {type(exc).__name__}: {exc}")

    async with httpx.AsyncClient(base_url=base, auth=auth(), timeout=600, limits=limits) as client:
        await asyncio.gather(*(hang_up(i) for i in range(n)))
    return {"hung_up": dropped, "problems": problems}


async def soak(
    base: str, seconds: float, concurrency: int, seed: int = 2, requests: int = 0
) -> dict[str, Any]:
    """Mixed load at ``concurrency`` for ``seconds`` (or until ``requests`` were sent)."""
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "refused": 0, "failed": 0}
    problems: list[str] = []
    i = 0
    async with httpx.AsyncClient(base_url=base, auth=auth(), timeout=600) as client:

        async def worker() -> None:
            nonlocal i
            while time.monotonic() < deadline or i < requests:
                if requests and i >= requests:
                    return
                i += 1
                outcome, problem = await one(client, *request_for(i, rng, rng.choice([8, 32, 64])))
                counts[outcome] += 1
                if problem:
                    problems.append(problem)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {**counts, "problems": problems}
