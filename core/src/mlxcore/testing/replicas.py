"""Replicas of one model behind a real ``vllm-router``, on 127.0.0.1.

For the replica tests (``make replicas-e2e``) and the router benchmark
(``scripts/replicas.py``): :class:`Replica` is one ``mlxcore serve`` process on a fixed
port (so it can be killed and started again under the URL the router knows), naming
itself in the ``x-mlxcore-replica`` header and publishing its prefix cache as KV events;
:class:`Router` is one ``vllm-router`` process in front of them; :func:`run_sessions`
plays agent sessions through a base URL and reports, turn by turn, which replica served
and how much of the prompt it shared with the session's previous turn was cached there.

Every process is started with a deadline and stopped by PID (SIGINT, then SIGKILL).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from mlxcore.testing.server import free_port, listens_on

READY_TIMEOUT = 120.0
"""Seconds a replica or the router may take to answer its health check."""

BLOCK_SIZE = 16
"""Tokens per KV block, on both sides."""


def router_binary() -> str:
    """The ``vllm-router`` console script of this environment (or on ``PATH``)."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if not found:
        raise FileNotFoundError("vllm-router is not installed (it is in the dev group)")
    return found


def _stop(proc: subprocess.Popen[bytes] | None, *, kill: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s:\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


@attrs.define
class Replica:
    """One ``mlxcore serve`` process on a fixed port (see the module docstring)."""

    name: str
    model: Path
    logs: Path
    flags: tuple[str, ...] = ()
    events: bool = True
    port: int = attrs.field(factory=free_port)
    events_port: int = attrs.field(factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        """The replica's base URL (what the router knows it by)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_address(self) -> str:
        """Where it publishes its KV events."""
        return f"tcp://127.0.0.1:{self.events_port}"

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start it (again) and wait until ``/health`` answers."""
        self.starts += 1
        cmd = [sys.executable, "-m", "mlxcore", "serve", str(self.model)]
        cmd += ["--port", str(self.port), "--replica-name", self.name]
        cmd += ["--log-level", "warning", "--served-model-name", "m", *self.flags]
        if self.events:
            cmd += ["--kv-events-endpoint", self.events_address]
        log = self.logs / f"{self.name}-{self.starts}.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _wait(f"{self.url}/health", self.proc, log, timeout, f"replica {self.name}")
        if listens_on(self.proc.pid, self.port) is False:
            raise RuntimeError(f"another process holds port {self.port}")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        _stop(self.proc, kill=True)

    def stop(self) -> None:
        """SIGINT, then SIGKILL after 15 s."""
        _stop(self.proc)

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None


@attrs.define
class Router:
    """One ``vllm-router`` process in front of ``replicas``.

    ``kv_aware`` reads each replica's KV events and tokenizes requests with the model's
    own tokenizer and chat template (``--kv-event-model``: the model folder).
    """

    policy: str
    replicas: Sequence[Replica]
    model: Path
    logs: Path
    port: int = attrs.field(factory=free_port)
    metrics_port: int = attrs.field(factory=free_port)
    flags: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The router's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line (documented in docs/replicas.md)."""
        cmd = [router_binary(), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--policy", self.policy, "--worker-urls", *(r.url for r in self.replicas)]
        cmd += ["--health-check-endpoint", "/health", "--health-check-interval-secs", "1"]
        cmd += ["--health-failure-threshold", "1", "--health-success-threshold", "1"]
        cmd += ["--request-timeout-secs", "120", "--log-level", "info"]
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port)]
        if self.policy == "kv_aware":
            for replica in self.replicas:
                cmd += ["--kv-event-source", f"{replica.url}={replica.events_address}"]
            cmd += ["--kv-event-model", str(self.model)]
            cmd += ["--kv-event-block-size", str(BLOCK_SIZE)]
        return [*cmd, *self.flags]

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start it and wait until it answers ``/health``."""
        log = self.logs / f"router-{self.policy}-{self.port}.log"
        env = {**os.environ, "NO_COLOR": "1"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, env=env
            )
        _wait(f"{self.url}/health", self.proc, log, timeout, f"vllm-router ({self.policy})")

    def stop(self) -> None:
        """SIGINT, then SIGKILL after 15 s."""
        _stop(self.proc)


@contextlib.contextmanager
def running(replicas: Sequence[Replica]) -> Iterator[Sequence[Replica]]:
    """Start ``replicas`` (one after the other) and stop every one at the end."""
    try:
        for replica in replicas:
            replica.start()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


# -- agent sessions --------------------------------------------------------------------


@attrs.frozen
class Turn:
    """One request of a session, as measured."""

    session: int
    turn: int
    status: int
    replica: str | None
    prompt_tokens: int
    cached_tokens: int
    shared_tokens: int
    """Leading tokens this prompt shares with the session's previous prompt (0 for the
    first turn)."""
    seconds: float
    error: str | None = None

    @property
    def cached_share(self) -> float:
        """Cached tokens over the shared prefix (1.0 when nothing is shared)."""
        return min(1.0, self.cached_tokens / self.shared_tokens) if self.shared_tokens else 1.0


def shared_system_prompt(words: int, salt: str = "") -> str:
    """The long shared instructions of every session (about 2.4 tokens a word with the
    Qwen3 tokenizer); ``salt`` starts it, so runs with different salts share nothing."""
    rules = [f"Rule {i}: when the task mentions item {i}, check field f{i % 97}."
             for i in range(words // 12)]  # fmt: skip
    return f"{salt}You are a coding agent working in a repository.\n" + "\n".join(rules)


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the working tree",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "write_file", "run_tests", "search", "list_dir")
]


def run_sessions(
    base_url: str,
    tokenize_url: str,
    *,
    sessions: int,
    turns: int,
    system: str,
    max_tokens: int = 12,
    user_words: int = 60,
    timeout: float = 180.0,
    first_session: int = 0,
    tools: bool = True,
    session_header: str | None = None,
    stream: bool = False,
) -> list[Turn]:
    """Play ``sessions`` agent sessions at once through ``base_url``, ``turns`` each:
    the shared ``system`` prompt and :data:`TOOLS`, a growing history (each user turn
    new words, each answer appended). ``tokenize_url`` (a replica's ``/tokenize``) gives
    the prompts' tokens, to measure what each turn shares with the one before.
    ``session_header``: send the session's id in this header (as Claude Code sends
    ``x-claude-code-session-id``). ``stream``: streamed requests (a turn whose stream
    ends without ``[DONE]`` counts as failed, status 0)."""
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        futures = [
            pool.submit(
                _session,
                base_url,
                tokenize_url,
                first_session + s,
                turns,
                system,
                max_tokens,
                user_words,
                timeout,
                tools,
                session_header,
                stream,
            )
            for s in range(sessions)
        ]
        return [turn for future in futures for turn in future.result()]


def _session(
    base_url: str,
    tokenize_url: str,
    session: int,
    turns: int,
    system: str,
    max_tokens: int,
    user_words: int,
    timeout: float,
    tools: bool,
    session_header: str | None,
    stream: bool,
) -> list[Turn]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    out: list[Turn] = []
    previous: list[int] = []
    headers = {session_header: f"session-{session}"} if session_header else {}
    with httpx.Client(timeout=timeout, headers=headers) as client:
        for turn in range(turns):
            words = " ".join(f"s{session}t{turn}w{k}" for k in range(user_words))
            messages.append({"role": "user", "content": f"Task {turn}: {words}"})
            body: dict[str, Any] = {"model": "m", "messages": messages}
            if tools:
                body["tools"] = TOOLS
            tokens = client.post(tokenize_url, json=body).json().get("tokens", [])
            shared = _common_prefix(previous, tokens) if turn else 0
            started = time.monotonic()
            request = {**body, "max_tokens": max_tokens, "temperature": 0}
            try:
                status, replica, answer, usage, error = _ask(client, base_url, request, stream)
            except httpx.HTTPError as exc:
                status, replica, answer, usage, error = 0, None, "(no answer)", {}, repr(exc)
            details = usage.get("prompt_tokens_details") or {}
            out.append(
                Turn(
                    session,
                    turn,
                    status,
                    replica,
                    int(usage.get("prompt_tokens", len(tokens))),
                    int(details.get("cached_tokens") or 0),
                    shared,
                    time.monotonic() - started,
                    error,
                )
            )
            messages.append({"role": "assistant", "content": answer})
            previous = tokens
    return out


def _ask(
    client: httpx.Client, base_url: str, request: dict[str, Any], stream: bool
) -> tuple[int, str | None, str, dict[str, Any], str | None]:
    """One chat request: status, serving replica, answer, usage, error (None when whole)."""
    url = f"{base_url}/v1/chat/completions"
    if not stream:
        r = client.post(url, json=request)
        replica = r.headers.get("x-mlxcore-replica")
        if r.status_code != 200:
            return r.status_code, replica, "(no answer)", {}, r.text[:200]
        data = r.json()
        answer = data["choices"][0]["message"].get("content") or ""
        return 200, replica, answer, data.get("usage") or {}, None
    request = {**request, "stream": True, "stream_options": {"include_usage": True}}
    parts: list[str] = []
    usage: dict[str, Any] = {}
    with client.stream("POST", url, json=request) as r:
        replica = r.headers.get("x-mlxcore-replica")
        if r.status_code != 200:
            return r.status_code, replica, "(no answer)", {}, r.read().decode()[:200]
        done = False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    if not done:
        return 0, replica, "".join(parts), usage, "the stream ended without [DONE]"
    return 200, replica, "".join(parts), usage, None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def summary(turns: Sequence[Turn]) -> dict[str, Any]:
    """What the replica tests assert and the benchmark records."""
    later = [t for t in turns if t.turn > 0 and t.status == 200]
    served: dict[str, int] = {}
    for t in turns:
        if t.replica:
            served[t.replica] = served.get(t.replica, 0) + 1
    total = sum(served.values()) or 1
    return {
        "turns": len(turns),
        "failed": sum(1 for t in turns if t.status != 200),
        "min_cached_share": min((t.cached_share for t in later), default=1.0),
        "turns_below_90": sum(1 for t in later if t.cached_share < 0.9),
        "mean_cached_share": sum(t.cached_share for t in later) / max(1, len(later)),
        "served": served,
        "largest_share": max(served.values(), default=0) / total,
        "seconds_max": max((t.seconds for t in turns), default=0.0),
    }
