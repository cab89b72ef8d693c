"""``mlxcore agent`` against a real server: ``--print-config`` with a served alias and
an API key, refusals with a clear message, and a stand-in agent program for each agent
that reads the configuration the way that agent does (Codex's ``config.toml``, Claude
Code's variables, OpenCode's JSON) and sends its request through the official SDK.
The real CLIs run through the same command in ``make agents-e2e``."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcore.testing.server import Server, free_port

API_KEY = "test-key"  # the key of conftest.py's qwen_server

STAND_IN = """\
import json, os, sys, tomllib
import anthropic, openai
arguments = sys.argv[1:]
config_path = None
if arguments[0] == "--config":  # Continue's cn gets its configuration as an argument
    config_path, arguments = arguments[1], arguments[2:]
name, prompt = arguments[0], arguments[1]
messages = [{"role": "user", "content": prompt}]
if name == "codex":
    config = tomllib.loads(open(os.path.join(os.environ["CODEX_HOME"], "config.toml")).read())
    provider = config["model_providers"][config["model_provider"]]
    client = openai.OpenAI(base_url=provider["base_url"], api_key=os.environ[provider["env_key"]])
    reply = client.responses.create(model=config["model"], input=prompt, max_output_tokens=4)
    text = reply.output_text
elif name == "claude":
    client = anthropic.Anthropic(
        base_url=os.environ["ANTHROPIC_BASE_URL"],
        auth_token=os.environ["ANTHROPIC_AUTH_TOKEN"],
        api_key=None,
    )
    model = os.environ["ANTHROPIC_MODEL"]
    reply = client.messages.create(model=model, max_tokens=4, messages=messages)
    text = reply.content[0].text
elif name == "qwen":
    settings = json.load(open(os.path.join(os.environ["QWEN_HOME"], "settings.json")))
    (provider,) = settings["modelProviders"]["openai"]
    client = openai.OpenAI(base_url=provider["baseUrl"], api_key=os.environ[provider["envKey"]])
    reply = client.chat.completions.create(
        model=settings["model"]["name"], max_tokens=4, messages=messages
    )
    text = reply.choices[0].message.content
elif name == "continue":
    (model,) = json.load(open(config_path))["models"]
    client = openai.OpenAI(base_url=model["apiBase"], api_key=model["apiKey"])
    reply = client.chat.completions.create(model=model["model"], max_tokens=4, messages=messages)
    text = reply.choices[0].message.content
else:
    config = json.load(open(os.environ["OPENCODE_CONFIG"]))
    provider_name, model = config["model"].split("/", 1)
    options = config["provider"][provider_name]["options"]
    client = openai.OpenAI(base_url=options["baseURL"], api_key=options["apiKey"])
    reply = client.chat.completions.create(model=model, max_tokens=4, messages=messages)
    text = reply.choices[0].message.content
print("answer:", json.dumps(text))
sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
"""


def _agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mlxcore", "agent", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "stand-in"
    path.write_text(f"#!{sys.executable}\n" + STAND_IN)
    path.chmod(0o755)
    return path


def test_print_config_uses_the_chosen_served_name_and_the_context(
    live_qwen_server: Server, tmp_path: Path
) -> None:
    folder = tmp_path / "agents"
    run = _agent(
        "codex", "--base-url", live_qwen_server.base_url, "--api-key", API_KEY,
        "--model", "alias-qwen", "--config-dir", str(folder), "--print-config",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert 'model = "alias-qwen"' in run.stdout
    assert "model_context_window = 40960" in run.stdout
    assert f"MLXCORE_API_KEY={API_KEY}" in run.stdout
    assert not folder.exists()  # printed, nothing written


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "no-such-model"), "does not serve 'no-such-model'"),
        (("--api-key", "wrong"), "401"),
        (("--base-url", "http://127.0.0.1:1"), "no server answers"),
    ],
)
def test_refusals_say_what_to_fix(
    live_qwen_server: Server, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    base = ("--base-url", live_qwen_server.base_url, "--api-key", API_KEY)
    run = _agent("claude", *base, *args, "--config-dir", str(tmp_path), "--print-config")
    assert run.returncode == 2
    assert message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("name", ["codex", "claude", "opencode", "qwen", "continue"])
def test_the_agent_runs_with_what_was_written(
    live_qwen_server: Server, tmp_path: Path, stand_in: Path, name: str
) -> None:
    folder = tmp_path / "agents"
    run = _agent(
        name, "--base-url", live_qwen_server.base_url, "--api-key", API_KEY,
        "--config-dir", str(folder), "--agent-bin", str(stand_in), "--", name, "Say hello",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    assert "answer:" in run.stdout
    assert "mlxcore agent: wrote" in run.stderr and str(folder) in run.stderr
    assert "context 40,960 tokens" in run.stderr


def test_the_agents_exit_status_is_the_commands(
    live_qwen_server: Server, tmp_path: Path, stand_in: Path
) -> None:
    import os

    run = _agent(
        "opencode", "--base-url", live_qwen_server.base_url, "--api-key", API_KEY,
        "--config-dir", str(tmp_path), "--agent-bin", str(stand_in), "--", "opencode", "Hi",
        env={**os.environ, "STAND_IN_EXIT": "3"},
    )  # fmt: skip
    assert run.returncode == 3, run.stderr


def test_a_server_is_started_for_the_agent_and_stopped_after(
    tiny_qwen3: Path, tmp_path: Path, stand_in: Path
) -> None:
    port = free_port()
    run = _agent(
        "codex", "--port", str(port), "--model", str(tiny_qwen3),
        "--config-dir", str(tmp_path), "--agent-bin", str(stand_in), "--", "codex", "Hi",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    assert "mlxcore agent: starting" in run.stderr and "answer:" in run.stdout
    assert (tmp_path / "server.log").is_file()
    with socket.socket() as probe:  # the server it started is gone
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_model_that_does_not_load_is_reported(tmp_path: Path, stand_in: Path) -> None:
    run = _agent(
        "codex", "--port", str(free_port()), "--model", str(tmp_path / "missing"),
        "--config-dir", str(tmp_path), "--agent-bin", str(stand_in),
    )  # fmt: skip
    assert run.returncode == 2
    assert "the server exited" in run.stderr and "Traceback (most recent" not in run.stderr[:200]
