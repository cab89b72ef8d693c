"""Shared pieces of the reliability suite: servers, memory sampling, response checks."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import psutil

from mlxcore.testing.server import Server, ServerPool

KEYS: list[str] = []
"""API keys the run's clients send, in turn (``--keys N``; empty: a server without keys).
The first is an admin key, the others ordinary ones."""


class RotatingKeys(httpx.Auth):
    """Each request with the next of :data:`KEYS` (so fuzz, load and soak traffic is
    split over the keys: several tenants at once)."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        if KEYS:
            key = KEYS[next(self._next) % len(KEYS)]
            request.headers["Authorization"] = f"Bearer {key}"
        yield request


_SHARED_AUTH = RotatingKeys()


def auth() -> httpx.Auth:
    """The clients' authentication: the keys in turn (nothing without keys)."""
    return _SHARED_AUTH


def keys_flags(logs: Path, count: int) -> list[str]:
    """Write a keys file of ``count`` keys (the first an admin) into ``logs``, fill
    :data:`KEYS`, and return the ``mlxcore serve`` flags that use it."""
    lines = []
    KEYS.clear()
    for i in range(count):
        KEYS.append(f"sk-reliability-{i}")
        role = 'role = "admin"\n' if i == 0 else ""
        lines.append(f'[keys.k{i}]\nkey = "{KEYS[-1]}"\n{role}')
    path = logs / "keys.toml"
    path.write_text("\n".join(lines))
    return ["--api-keys-file", str(path)]


OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions")
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
RETRY_STATUSES = (429, 503, 529)


@contextmanager
def serving(logs: Path, model: str | None, *flags: str) -> Iterator[Server]:
    """A real ``mlxcore serve`` (the embedded default model unless ``model``)."""
    from mlxcore.models.default import ensure_default_model

    pool = ServerPool(logs)
    try:
        yield pool(model or str(ensure_default_model()), *flags)
    finally:
        pool.close()


@attrs.define
class MemorySampler:
    """Samples a process's RSS (and MLX's memory from /metrics) in the background."""

    server: Server
    period: float = 0.2
    rss: list[tuple[float, int]] = attrs.field(factory=list)
    _stop: threading.Event = attrs.field(factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        proc = psutil.Process(self.server.proc.pid)

        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.rss.append((time.monotonic(), proc.memory_info().rss))
                except psutil.Error:
                    return
                self._stop.wait(self.period)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def peak(self) -> int:
        return max((r for _, r in self.rss), default=0)

    def mean_between(self, start: float, end: float) -> float:
        values = [r for t, r in self.rss if start <= t <= end]
        return sum(values) / len(values) if values else 0.0


def rss(server: Server) -> int:
    """The server process's resident memory now."""
    return int(psutil.Process(server.proc.pid).memory_info().rss)


def metrics(server: Server) -> dict[str, float]:
    """``/metrics`` as name -> value (labels dropped, last value wins)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30, auth=auth()).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name.split("{")[0]] = float(value)
    return out


def settle(server: Server, seconds: float = 30.0) -> int:
    """Wait until the server is idle (nothing running or waiting), then a little more
    for the idle buffer-cache release; return its RSS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        body = httpx.get(f"{server.base_url}/health", timeout=30).json()
        if body.get("running") == 0 and body.get("waiting") == 0:
            break
        time.sleep(0.5)
    time.sleep(2.5)
    return rss(server)


def error_shape_problem(path: str, response: httpx.Response) -> str | None:
    """Why an error response is not in its API's documented shape (``None``: it is)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{response.status_code} body is not JSON: {response.text[:120]!r}"
    if path.startswith("/api/"):  # Ollama's: {"error": "message"}
        ok = isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]
        return None if ok else f"not an Ollama error: {str(body)[:160]}"
    if path.startswith("/v1/messages"):
        ok = (
            isinstance(body, dict)
            and body.get("type") == "error"
            and isinstance(body.get("error"), dict)
            and isinstance(body["error"].get("type"), str)
            and isinstance(body["error"].get("message"), str)
        )
        return None if ok else f"not an Anthropic error: {str(body)[:160]}"
    ok = (
        isinstance(body, dict)
        and isinstance(body.get("error"), dict)
        and isinstance(body["error"].get("message"), str)
        and isinstance(body["error"].get("type"), str)
    )
    return None if ok else f"not an OpenAI error: {str(body)[:160]}"


def retry_problem(response: httpx.Response) -> str | None:
    """A refusal for load must say when to come back."""
    if response.status_code in RETRY_STATUSES and "retry-after" not in response.headers:
        return f"{response.status_code} without Retry-After"
    return None


def stream_problem(path: str, response: httpx.Response, text: str) -> str | None:
    """Why a 200 streaming response is broken (``None``: it is well formed)."""
    kind = response.headers.get("content-type", "")
    if path.startswith("/api/"):
        return ndjson_problem(kind, text)
    if not kind.startswith("text/event-stream"):
        return f"stream sent as {kind!r}"
    events = parse_sse(text)
    if path.startswith("/v1/messages"):
        names = [e[0] for e in events]
        if "error" in names:
            return f"error event in stream: {events[names.index('error')][1][:160]}"
        if not names or names[-1] != "message_stop":
            return f"stream did not end with message_stop: {names[-3:]}"
        return None
    if path.startswith("/v1/responses"):
        names = [e[0] for e in events]
        if "error" in names:
            return f"error event in stream: {events[names.index('error')][1][:160]}"
        ends = ("response.completed", "response.incomplete")
        if not names or names[-1] not in ends:
            return f"stream did not end with response.completed/incomplete: {names[-3:]}"
        return None
    datas = [d for _, d in events]
    if not datas or datas[-1] != "[DONE]":
        return "stream did not end with [DONE]"
    for data in datas[:-1]:
        if '"error"' in data and data.lstrip().startswith('{"error"'):
            return f"error frame in stream: {data[:160]}"
    return None


def ndjson_problem(kind: str, text: str) -> str | None:
    """Why an Ollama stream is broken: every line a JSON object, no error line, the last
    one ``done``."""
    if not kind.startswith("application/x-ndjson"):
        return f"stream sent as {kind!r}"
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        return f"a stream line is not JSON: {exc}"
    if any(not isinstance(line, dict) or "error" in line for line in lines):
        return f"error line in stream: {text[-160:]}"
    if not lines or lines[-1].get("done") is not True:
        return "stream did not end with done: true"
    return None


def parse_sse(text: str) -> list[tuple[str, str]]:
    """``(event, data)`` pairs of an SSE body, as httpx-sse reads them."""
    from httpx_sse._decoders import SSEDecoder

    decoder = SSEDecoder()
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        sse = decoder.decode(line)
        if sse is not None:
            out.append((sse.event, sse.data))
    sse = decoder.decode("")
    if sse is not None:
        out.append((sse.event, sse.data))
    return out


def greedy_reference(server: Server) -> str:
    """The text of one fixed greedy chat request (compared before and after a run)."""
    body = {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24,
        "temperature": 0,
    }
    r = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120, auth=auth())
    r.raise_for_status()
    text: str = r.json()["choices"][0]["message"]["content"]
    return text


def sampled_works(server: Server) -> bool:
    """An unseeded sampled request (chat and messages) still succeeds."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "top_k": 40}
    msg = {**chat, "max_tokens": 8, "temperature": 0.9}
    a = httpx.post(
        f"{server.v1}/chat/completions",
        json={**chat, "temperature": 1.0},
        timeout=120,
        auth=auth(),
    )
    b = httpx.post(f"{server.v1}/messages", json=msg, timeout=120, auth=auth())
    return a.status_code == 200 and b.status_code == 200


def mb(n: float) -> str:
    return f"{n / 2**20:.0f} MB"


def report(name: str, figures: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """Print one part's figures and problems; return them for the JSON summary."""
    print(f"\n== {name}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    for key, value in figures.items():
        print(f"   {key}: {value}")
    for problem in problems[:20]:
        print(f"   PROBLEM: {problem}")
    return {"figures": figures, "problems": problems}
