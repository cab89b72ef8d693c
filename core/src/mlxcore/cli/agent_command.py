"""``mlxcore agent NAME``: run an agent CLI against a local server, started when none
answers, with the agent's configuration written into a directory of mlxcore's own
(:mod:`mlxcore.agent_setup`)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from mlxcore.agent_setup import AGENTS, AgentSetup, AgentTarget, agent_setup

HELP = "run an agent CLI (claude, codex, opencode, qwen, continue) against a local server"

START_TIMEOUT = 600.0
"""Seconds a server started here may take to load its model."""

FALLBACK_CONTEXT = 32768
"""The context told to the agent when the server does not state one."""


class AgentCommandError(Exception):
    """Something the user must fix (the message says what)."""


def default_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/mlxcore/agents`` (``~/.config/mlxcore/agents``)."""
    root = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(root) / "mlxcore" / "agents"


def add_agent_command(cmd: argparse.ArgumentParser) -> None:
    """The ``agent`` subcommand's flags."""
    cmd.add_argument("agent", choices=sorted(AGENTS), help="the agent CLI to run")
    cmd.add_argument(
        "--model",
        default=None,
        help="the model to serve when no server answers (default: the embedded one); "
        "on a running server, which of its models the agent uses (default: its first)",
    )
    cmd.add_argument(
        "--base-url",
        default=None,
        help="a running server (default: http://127.0.0.1:PORT, started when none answers)",
    )
    cmd.add_argument("--port", type=int, default=8000, help="the local server's port")
    cmd.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    cmd.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="where the agent's configuration is written (default ~/.config/mlxcore/agents)",
    )
    cmd.add_argument(
        "--print-config",
        action="store_true",
        help="print the files and variables the agent would get, write and run nothing",
    )
    cmd.add_argument("--agent-bin", default=None, help="the agent's executable (default: PATH)")
    cmd.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag for the server started here (repeat: --serve-arg=--max-num-seqs=4)",
    )
    cmd.epilog = "Arguments after -- go to the agent: mlxcore agent claude -- -p 'Say hello'"


def split_agent_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``mlxcore agent`` arguments before ``--``, and the agent's own after it."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _server(args: argparse.Namespace, log_dir: Path) -> Iterator[tuple[str, bool]]:
    """(the server's root URL, whether it was started here): a running one, or one
    started for the block and stopped after it."""
    base = (args.base_url or f"http://127.0.0.1:{args.port}").rstrip("/")
    if _answers(base):
        yield base, False
        return
    if args.base_url or args.print_config:
        raise AgentCommandError(f"no server answers at {base} (start one: mlxcore serve MODEL)")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "server.log"
    command = [sys.executable, "-m", "mlxcore", "serve", *([args.model] if args.model else [])]
    command += ["--port", str(args.port), *args.serve_arg]
    if args.api_key:
        command += ["--api-key", args.api_key]
    print(f"mlxcore agent: starting {shlex.join(command[1:])} (log: {log_path})", file=sys.stderr)
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(base):
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise AgentCommandError(f"the server exited ({proc.returncode}):\n{tail}")
            if time.monotonic() > deadline:
                raise AgentCommandError(f"the server did not answer in {START_TIMEOUT:.0f} s")
            time.sleep(0.5)
        yield base, True
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _target(base: str, args: argparse.Namespace, started: bool) -> AgentTarget:
    """The served model the agent uses and its context window, asked of the server."""
    headers = _headers(args.api_key)
    reply = httpx.get(f"{base}/v1/models", headers=headers, timeout=30)
    if reply.status_code != 200:
        raise AgentCommandError(f"GET {base}/v1/models: {reply.status_code} {reply.text[:200]}")
    names = [str(m["id"]) for m in reply.json().get("data", [])]
    if not names:
        raise AgentCommandError(f"{base} serves no model")
    model = names[0]
    if args.model and not started:
        if args.model not in names:
            raise AgentCommandError(f"{base} does not serve {args.model!r}: it serves {names}")
        model = args.model
    context = FALLBACK_CONTEXT
    sized = httpx.post(
        f"{base}/tokenize", json={"model": model, "prompt": ""}, headers=headers, timeout=30
    )
    if sized.status_code == 200 and isinstance(sized.json().get("max_model_len"), int):
        context = int(sized.json()["max_model_len"])
    return AgentTarget(base, model, context, args.api_key)


def describe(setup: AgentSetup) -> str:
    """The set-up as a reader checks it: each file, the arguments, the variables."""
    parts = [f"# {path}\n{text.rstrip()}\n" for path, text in setup.files.items()]
    if setup.args:
        parts.append(f"# arguments\n{setup.program} {shlex.join(setup.args)}\n")
    parts.append(
        "# environment\n" + "".join(f"{k}={shlex.quote(v)}\n" for k, v in setup.env.items())
    )
    return "\n".join(parts)


def _run(args: argparse.Namespace) -> int:
    directory = args.config_dir or default_config_dir()
    with _server(args, directory) as (base, started):
        target = _target(base, args, started)
        setup = agent_setup(args.agent, target, directory)
        if args.print_config:
            print(describe(setup), end="")
            return 0
        program = args.agent_bin or shutil.which(setup.program)
        if program is None:
            raise AgentCommandError(
                f"{setup.program} is not on PATH: npm install -g {setup.package} "
                "(or give --agent-bin)"
            )
        for path in setup.write():
            print(f"mlxcore agent: wrote {path}", file=sys.stderr)
        print(
            f"mlxcore agent: {setup.program} -> {base}{setup.route}, model {target.model}, "
            f"context {target.context:,} tokens",
            file=sys.stderr,
        )
        env = {**os.environ, **setup.env}
        return subprocess.run([program, *setup.args, *args.agent_args], env=env).returncode


def run_agent(args: argparse.Namespace) -> int:
    """Run ``mlxcore agent``; the agent's exit status, or 2 with a message."""
    try:
        return _run(args)
    except AgentCommandError as exc:
        print(f"mlxcore agent: error: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"mlxcore agent: error: the server did not answer: {exc}", file=sys.stderr)
        return 2
