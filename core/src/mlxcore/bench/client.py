"""The HTTP measurements: one stream, N concurrent streams, and a cached follow-up turn.

Every request is a greedy, streamed ``/v1/chat/completions`` call with
``stream_options.include_usage``, read with httpx. A stream's first generated output is the
first chunk with content, reasoning or tool calls (or the finish, if nothing came); its last
token is the chunk that carries ``finish_reason``. Token counts come from the usage chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import httpx

from mlxcore.bench import workloads
from mlxcore.bench.results import StreamRun, median_of
from mlxcore.errors import MlxcoreError

log = logging.getLogger(__name__)

_TIMEOUT = httpx.Timeout(1800.0, connect=30.0)
#: The OpenAI usage fields; anything else in a usage chunk is a plugin's extension.
_STANDARD_USAGE = frozenset(
    {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    }
)


@attrs.define
class HttpTarget:
    """Where the server is and which model name it serves."""

    base_url: str
    model: str
    sampling: dict[str, Any] = attrs.field(factory=dict)
    """Sampling fields every request carries (``temperature`` 0 unless set here)."""


async def stream_chat(
    client: httpx.AsyncClient,
    target: HttpTarget,
    messages: list[Any],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
    *,
    times: list[float] | None = None,
) -> StreamRun:
    """Stream one chat completion and time it; ``extra`` adds fields to the request body.

    ``times``, when given, receives the arrival time (``time.perf_counter()``) of every
    chunk that carries output, as it arrives (so a caller that cancels the stream still
    has them); the run's :attr:`~StreamRun.chunk_times` holds the same list.
    """
    body = {
        **workloads.chat_body(target.model, messages, max_tokens),
        **target.sampling,
        **(extra or {}),
    }
    arrivals: list[float] = [] if times is None else times
    first: float | None = None
    last: float | None = None
    usage: dict[str, Any] = {}
    finish: str | None = None
    start = time.perf_counter()
    async with _open_stream(client, f"{target.base_url}/v1/chat/completions", body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise MlxcoreError(f"the server answered {r.status_code}: {text[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            now = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                produced = (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("tool_calls")
                )
                if produced:
                    arrivals.append(now)
                    first = now if first is None else first
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
                    first = now if first is None else first
                    last = now
    end = time.perf_counter()
    if first is None or last is None:
        raise MlxcoreError("the stream ended without a finish_reason")
    details = usage.get("prompt_tokens_details") or {}
    return StreamRun(
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", len(arrivals))),
        ttft_s=first - start,
        decode_s=last - first,
        total_s=end - start,
        cached_tokens=int(details.get("cached_tokens") or 0),
        finish_reason=finish,
        usage_extra={k: v for k, v in usage.items() if k not in _STANDARD_USAGE},
        chunk_times=arrivals,
    )


#: Attempts at a request whose connection failed before any response arrived.
CONNECT_ATTEMPTS = 4


@contextlib.asynccontextmanager
async def _open_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streamed response; a connection dropped before the
    response began is retried (servers built on ``http.server`` reset connections past
    their small listen backlog when many arrive at once). The retries count in the
    caller's timings, as they would for any client."""
    for attempt in range(CONNECT_ATTEMPTS):
        request = client.build_request("POST", url, json=body)
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
            if attempt == CONNECT_ATTEMPTS - 1:
                raise
            log.debug("request failed before any response (%r); retrying", exc)
            await asyncio.sleep(0.05 * (attempt + 1))
            continue
        try:
            yield response
        finally:
            await response.aclose()
        return


def http_client(connections: int = 32, *, keepalive: bool = True) -> httpx.AsyncClient:
    """An async HTTP client with the bench's long timeouts and ``connections`` connections
    (``keepalive=False``: a new connection per request, for servers that close them)."""
    kept = connections if keepalive else 0
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=kept)
    return httpx.AsyncClient(timeout=_TIMEOUT, limits=limits)


async def _once(target: HttpTarget, messages: list[Any], max_tokens: int) -> StreamRun:
    async with http_client() as client:
        return await stream_chat(client, target, messages, max_tokens)


def stream_once(target: HttpTarget, messages: list[Any], max_tokens: int) -> StreamRun:
    """Stream one chat completion on a fresh connection and time it."""
    return asyncio.run(_once(target, messages, max_tokens))


async def concurrent_streams(
    client: httpx.AsyncClient,
    target: HttpTarget,
    prompts: list[list[Any]],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> tuple[list[StreamRun], dict[str, Any]]:
    """Stream one chat per prompt, all at once; return the runs and their summary:
    aggregate tok/s (all tokens / wall time from the first request to the last token),
    wall time, tokens, median and max TTFT, median per-stream decode tok/s."""
    start = time.perf_counter()
    runs: list[StreamRun] = await asyncio.gather(
        *(stream_chat(client, target, m, max_tokens, extra) for m in prompts)
    )
    wall = time.perf_counter() - start
    tokens = sum(r.completion_tokens for r in runs)
    return runs, {
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "wall_s": wall,
        "completion_tokens": tokens,
        "ttft_median_s": median_of([r.ttft_s for r in runs]),
        "ttft_max_s": max(r.ttft_s for r in runs),
        "stream_decode_tok_s_median": median_of([r.decode_tok_s for r in runs]),
    }


async def _concurrent_once(
    client: httpx.AsyncClient, target: HttpTarget, n: int, max_tokens: int
) -> dict[str, Any]:
    prompts = [workloads.writing_messages(i) for i in range(n)]
    return (await concurrent_streams(client, target, prompts, max_tokens))[1]


def _level_summary(n: int, reps: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return median_of([r[key] for r in reps])

    return {
        "concurrency": n,
        "aggregate_tok_s": round(med("aggregate_tok_s"), 3),
        "completion_tokens": int(med("completion_tokens")),
        "wall_s": round(med("wall_s"), 4),
        "ttft_median_s": round(med("ttft_median_s"), 6),
        "stream_decode_tok_s_median": round(med("stream_decode_tok_s_median"), 3),
        "repeats": len(reps),
        "runs": [{k: round(v, 6) for k, v in r.items()} for r in reps],
    }


async def _concurrency(
    target: HttpTarget, levels: tuple[int, ...], max_tokens: int, repeats: int
) -> list[dict[str, Any]]:
    reps: dict[int, list[dict[str, Any]]] = {n: [] for n in levels}
    async with http_client(max(levels) * 2) as client:
        await _concurrent_once(client, target, max(levels), min(8, max_tokens))
        for r in range(repeats):
            for n in levels if r % 2 == 0 else reversed(levels):
                rep = await _concurrent_once(client, target, n, max_tokens)
                log.info(
                    "HTTP concurrency %d, run %d/%d: %.1f tok/s aggregate, %d tokens in %.1f s",
                    n,
                    r + 1,
                    repeats,
                    rep["aggregate_tok_s"],
                    rep["completion_tokens"],
                    rep["wall_s"],
                )
                reps[n].append(rep)
    return [_level_summary(n, reps[n]) for n in levels]


def measure_concurrency(
    target: HttpTarget, levels: tuple[int, ...], *, max_tokens: int, repeats: int
) -> list[dict[str, Any]]:
    """Aggregate tok/s of N concurrent streams (distinct prompts) for each N in ``levels``.

    Aggregate = all tokens generated / the wall time from sending the first request to the
    end of the last stream. A short warm-up at the highest level runs first; then each
    repeat goes through every level (up, then down on the next repeat), so a change in the
    machine's load during the run does not fall on one level only.
    """
    return asyncio.run(_concurrency(target, levels, max_tokens, repeats))


async def _prefix(
    target: HttpTarget,
    count_tokens: Callable[[str], int],
    prefix_tokens: int,
    max_tokens: int,
    repeats: int,
    rng: random.Random,
) -> list[dict[str, Any]]:
    pairs = []
    async with http_client() as client:
        for i in range(repeats):
            text, word = workloads.long_prefix(count_tokens, prefix_tokens, rng)
            cold_msgs = workloads.prefix_messages(text, workloads.COLD_QUESTION)
            warm_msgs = workloads.prefix_messages(text, workloads.FOLLOWUP_QUESTION)
            cold = await stream_chat(client, target, cold_msgs, max_tokens)
            cached = await stream_chat(client, target, warm_msgs, max_tokens)
            log.info(
                "prefix %d/%d (%s): cold TTFT %.3f s (%d prompt tokens), cached TTFT %.3f s "
                "(%d cached tokens)",
                i + 1,
                repeats,
                word,
                cold.ttft_s,
                cold.prompt_tokens,
                cached.ttft_s,
                cached.cached_tokens,
            )
            pairs.append({"seed_word": word, "cold": cold.to_json(), "cached": cached.to_json()})
    return pairs


def measure_prefix_cache(
    target: HttpTarget,
    count_tokens: Callable[[str], int],
    *,
    prefix_tokens: int,
    max_tokens: int,
    repeats: int,
    rng: random.Random,
) -> dict[str, Any]:
    """Cold vs cached TTFT of a turn sharing a long system prompt.

    Each repeat builds a new prefix (a fresh seed word at its very start, so nothing served
    before shares it), sends it with one question (cold), then with another (cached).
    """
    pairs = asyncio.run(_prefix(target, count_tokens, prefix_tokens, max_tokens, repeats, rng))

    def med(side: str, key: str) -> float:
        return median_of([p[side][key] for p in pairs])

    return {
        "prefix_tokens_target": prefix_tokens,
        "prompt_tokens": int(med("cold", "prompt_tokens")),
        "cold_ttft_s": round(med("cold", "ttft_s"), 6),
        "cached_ttft_s": round(med("cached", "ttft_s"), 6),
        "cold_cached_tokens": int(med("cold", "cached_tokens")),
        "cached_tokens": int(med("cached", "cached_tokens")),
        "followup_prompt_tokens": int(med("cached", "prompt_tokens")),
        "repeats": len(pairs),
        "runs": pairs,
    }
