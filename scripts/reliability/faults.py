"""Fault injection: strategies that raise or hang (plugin ``mlxcore.testing.faults``).

For each fault, ordinary requests run beside one request that triggers it. What must
hold: the faulty request fails with an error in its API's shape, the others finish
(or fail cleanly) within a few seconds, a hang turns /health to 503 within the
watchdog period, and the server serves again afterwards. No request waits forever
(every client call here has a deadline).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from common import auth

WATCHDOG = 5.0
CHAT = "/v1/chat/completions"


def _body(
    content: str, max_tokens: int, fault: str | None = None, stream: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if fault:
        body["fault"] = fault
    return body


async def _run(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, int, str]:
    """(monotonic time the response ended, status, text)."""
    async with client.stream("POST", CHAT, json=body) as r:
        text = (await r.aread()).decode(errors="replace")
    return time.monotonic(), r.status_code, text


def _failed(status: int, text: str) -> bool:
    """An error answer: an error status, or an error frame in a stream."""
    return status >= 400 or '{"error"' in text


async def _health_503_within(client: httpx.AsyncClient, seconds: float) -> tuple[float, str] | None:
    """(seconds until /health said 503, its reason), or None."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        r = await client.get("/health")
        if r.status_code == 503:
            return time.monotonic() - started, str(r.json().get("reason", ""))
        await asyncio.sleep(0.1)
    return None


async def _recovers(client: httpx.AsyncClient, seconds: float = 30.0) -> float | None:
    """Seconds until a plain request succeeds again (None: it never did)."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        _, status, _ = await _run(client, _body("ping", 4, stream=False))
        if status == 200:
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return None


async def scenario(base: str, fault: str) -> dict[str, Any]:
    """Four ordinary streams, then one request with ``fault``; what happened to each."""
    problems: list[str] = []
    async with httpx.AsyncClient(base_url=base, auth=auth(), timeout=60) as client:
        others = [
            asyncio.ensure_future(_run(client, _body(f"Count to ten, take {i}.", 48)))
            for i in range(4)
        ]
        await asyncio.sleep(0.3)
        hang = fault.endswith(":hang")
        faulty = asyncio.ensure_future(_run(client, _body("Trigger.", 48, fault)))
        probe = asyncio.ensure_future(_health_503_within(client, WATCHDOG + 5)) if hang else None
        sent = time.monotonic()
        try:
            ended, f_status, f_text = await faulty
        except httpx.HTTPError as exc:
            return {"problems": [f"{fault}: the faulty request got no answer ({exc!r})"]}
        outcomes = []
        for task in others:
            try:
                outcomes.append(await task)
            except httpx.HTTPError as exc:
                problems.append(f"{fault}: an ordinary request got no answer ({exc!r})")
        late = max((o[0] - ended for o in outcomes), default=0.0)
        # a decode step that raises before touching the batch is retried without the
        # sequence at fault (engine/quarantine.py): only a fault in removing a sequence or
        # a hang still ends the whole batch
        batch_wide = fault.startswith("decoder-remove") or hang
        if batch_wide and late > 5.0:
            problems.append(f"{fault}: an ordinary request ended {late:.1f} s after the fault")
        if not batch_wide and any(_failed(s, t) for _, s, t in outcomes):
            problems.append(f"{fault}: a request-level fault failed other requests")
        if fault not in RETRIED and not _failed(f_status, f_text):
            problems.append(f"{fault}: the faulty request did not fail ({f_status})")
        if f_status >= 500 and f_status != 503 and '"message"' not in f_text:
            problems.append(f"{fault}: error body not in OpenAI shape: {f_text[:120]}")
        unhealthy_after = await probe if probe is not None else None
        if hang and unhealthy_after is None:
            problems.append(f"{fault}: /health never turned 503 during the hang")
        recovered = await _recovers(client)
        if recovered is None:
            problems.append(f"{fault}: the server did not serve again within 30 s")
    return {
        "faulty_request_seconds": round(ended - sent, 2),
        "faulty_status": f_status,
        "others": ["failed" if _failed(s, t) else "ok" for _, s, t in outcomes],
        "others_ended_after_fault_seconds": round(max(late, 0.0), 2),
        "health_503_after_request_seconds": None
        if unhealthy_after is None
        else round(unhealthy_after[0], 2),
        "health_reason": None if unhealthy_after is None else unhealthy_after[1],
        "recovered_after_seconds": None if recovered is None else round(recovered, 2),
        "problems": problems,
    }


RETRIED = ("decoder:raise",)
"""Faults that fire once and are retried away: the faulty request may finish normally."""
FAULTS = (
    "setup:raise",
    "prefill:raise",
    "processor:raise",
    "decoder:raise",
    "decoder:poison",
    "decoder-remove:raise",
    "prefill:hang",
    "decoder:hang",
)
