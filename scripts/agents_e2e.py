"""The real agent CLIs against a real ``mlxcore serve`` (``make agents-e2e``; not part of
``make test``: it installs the CLIs from the npm registry).

Codex CLI (Responses API), Claude Code (Anthropic Messages), OpenCode, Qwen Code and
Continue's ``cn`` (Chat Completions) are installed into ``.tools/agents`` at the pinned
versions (``LATEST=1``: the newest on the registry), each started by ``mlxcore agent
NAME`` (which writes its configuration, telemetry and updates off) in its own throw-away
HOME, pointed at 127.0.0.1 only. The server runs the tiny Qwen3 test model (40,960
tokens of context: the agents' prompts are 8-20K tokens) with the scripted test plugin,
so the random model gives every request a short finished answer. For each client:
turn 1 and a continued turn 2 must exit 0, the requests must reach that client's route
with no 4xx/5xx, and turn 2 must report cached prompt tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from mlxcore.testing.models import build_test_model

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "agents"
PINNED = {
    "@openai/codex": "0.169.0",
    "@anthropic-ai/claude-code": "2.1.331",
    "opencode-ai": "1.18.33",
    "@qwen-code/qwen-code": "0.24.4",
    "@continuedev/cli": "1.5.47",
}
ANSWER = "Hello! How can I help?"


def install() -> Path:
    """Install the CLIs; the ``node_modules/.bin`` folder."""
    TOOLS.mkdir(parents=True, exist_ok=True)
    latest = os.environ.get("LATEST") == "1"
    specs = [f"{name}@{'latest' if latest else version}" for name, version in PINNED.items()]
    subprocess.run(
        ["npm", "install", "--no-fund", "--no-audit", "--prefix", str(TOOLS), *specs],
        check=True,
    )
    return TOOLS / "node_modules" / ".bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


COUNTERS = ("mlxcore_http_responses_total{", "mlxcore_cached_prompt_tokens_total ")


def metrics(base: str) -> dict[str, float]:
    """The counters this script reads from ``/metrics``."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(
            ("mlxcore_http_responses_total{", "mlxcore_cached_prompt_tokens_total ")
        ):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


TURNS = ("Say hello", "Again")
"""What the user types: the first starts a session, the others continue it."""


def launcher(name: str, bin_dir: Path, base: str, home: Path) -> list[str]:
    """``mlxcore agent NAME``: the agent's configuration written by mlxcore into
    ``home``, the installed CLI, the server at ``base``; what follows goes to the agent."""
    folder = home / "mlxcore-agents"
    program = {"continue": "cn"}.get(name, name)
    return [sys.executable, "-m", "mlxcore", "agent", name, "--base-url", base,
            "--config-dir", str(folder), "--agent-bin", str(bin_dir / program), "--"]  # fmt: skip


def codex(bin_dir: Path, base: str, home: Path, turns: tuple[str, ...] = TURNS) -> dict[str, Any]:
    env = {**os.environ, "HOME": str(home)}
    exe = launcher("codex", bin_dir, base, home)
    runs = [run([*exe, "exec", "--skip-git-repo-check", "--json", turns[0]], home, env)]
    for text in turns[1:]:
        resume = [*exe, "exec", "--skip-git-repo-check", "--json", "resume", "--last", text]
        runs.append(run(resume, home, env))
    cached = 0
    for line in runs[-1].stdout.splitlines():
        with_usage = json.loads(line) if line.startswith("{") else {}
        if with_usage.get("type") == "turn.completed":
            cached = int(with_usage.get("usage", {}).get("cached_input_tokens", 0))
    return {"runs": runs, "client_cached": cached, "route": "/v1/responses"}


def claude(bin_dir: Path, base: str, home: Path, turns: tuple[str, ...] = TURNS) -> dict[str, Any]:
    env = {**os.environ, "HOME": str(home)}
    exe = launcher("claude", bin_dir, base, home)
    runs = [run([*exe, "-p", turns[0]], home, env)]
    for text in turns[1:]:
        runs.append(run([*exe, "--continue", "-p", text, "--output-format", "json"], home, env))
    try:
        cached = int(json.loads(runs[-1].stdout)["usage"]["cache_read_input_tokens"])
    except (ValueError, KeyError, TypeError):
        cached = 0
    return {"runs": runs, "client_cached": cached, "route": "/v1/messages"}


def chat_agent(
    name: str, first: tuple[str, ...], again: tuple[str, ...]
) -> Callable[..., dict[str, Any]]:
    """A Chat Completions agent run in a project folder: its first turn is ``first``
    then the text, each next one ``again`` then the text."""

    def client(
        bin_dir: Path, base: str, home: Path, turns: tuple[str, ...] = TURNS
    ) -> dict[str, Any]:
        work = home / "project"
        work.mkdir()
        env = {**os.environ, "HOME": str(home)}
        exe = launcher(name, bin_dir, base, home)
        runs = [run([*exe, *first, turns[0]], work, env)]
        for text in turns[1:]:
            runs.append(run([*exe, *again, text], work, env))
        return {"runs": runs, "client_cached": None, "route": "/v1/chat/completions"}

    return client


CLIENTS = {
    "codex": codex,
    "claude": claude,
    "opencode": chat_agent("opencode", ("run",), ("run", "--continue")),
    "qwen": chat_agent("qwen", ("-p",), ("--continue", "-p")),
    "continue": chat_agent("continue", ("-p",), ("-p", "--resume")),
}


def main() -> int:
    bin_dir = install()
    model = build_test_model("qwen3")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="mlxcore-agents-")) / "server.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlxcore", "serve", str(model), "--port", str(port),
         "--accept-any-model-name", "--plugin", "mlxcore.testing.scripted",
         "--test-script", ANSWER],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    failures: list[str] = []
    results: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        for name, client in CLIENTS.items():
            home = Path(tempfile.mkdtemp(prefix=f"mlxcore-{name}-"))
            before = metrics(base)
            outcome = client(bin_dir, base, home)
            after = metrics(base)
            shutil.rmtree(home, ignore_errors=True)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            route = outcome["route"]
            ok_key = f'mlxcore_http_responses_total{{method="POST",route="{route}",status="200"}}'
            bad = {k: v for k, v in delta.items() if 'status="4' in k or 'status="5' in k}
            cached = delta.get("mlxcore_cached_prompt_tokens_total", 0)
            codes = [r.returncode for r in outcome["runs"]]
            results[name] = {
                "exit_codes": codes,
                "route_requests": delta.get(ok_key, 0),
                "errors": bad,
                "server_cached_tokens": cached,
                "client_reported_cached": outcome["client_cached"],
            }
            if codes != [0, 0]:
                failures.append(f"{name}: exit codes {codes}")
                for r in outcome["runs"]:
                    print(r.stdout[-2000:], r.stderr[-2000:], sep="\n")
            if not delta.get(ok_key):
                failures.append(f"{name}: no request reached {outcome['route']}")
            if bad:
                failures.append(f"{name}: error responses {bad}")
            if cached <= 0 or outcome["client_cached"] == 0:
                failures.append(f"{name}: the second turn read nothing from the prefix cache")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    print(json.dumps(results, indent=2))
    for failure in failures:
        print("FAIL", failure)
    log.close()
    print("server log:", log_path)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
