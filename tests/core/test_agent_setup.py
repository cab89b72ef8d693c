"""``mlxcore agent``'s per-agent set-up (mlxcore/agent_setup.py): each agent's files
parse in its own format, point at the server with the served name and context, and stay
inside mlxcore's directory; telemetry and update checks are off."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mlxcore.agent_setup import AGENTS, AgentTarget, agent_setup

OWN_HOMES = (
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
    "OPENCODE_CONFIG",
    "QWEN_HOME",
    "CONTINUE_GLOBAL_DIR",
)
"""The variables that give each agent a configuration directory of its own."""
TARGET = AgentTarget("http://127.0.0.1:8123", "qwen3.5-local", 40960, "secret")


def _inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_files_stay_in_the_agents_directory(name: str, tmp_path: Path) -> None:
    setup = agent_setup(name, TARGET, tmp_path)
    written = setup.write()
    assert written and all(_inside(p, tmp_path) and p.is_file() for p in written)
    homes = [v for k, v in setup.env.items() if k in OWN_HOMES]
    assert len(homes) == 1 and _inside(Path(homes[0]), tmp_path)
    assert setup.env["NO_UPDATE_NOTIFIER"] == "1"


def test_codex_gets_a_responses_provider_with_the_context(tmp_path: Path) -> None:
    setup = agent_setup("codex", TARGET, tmp_path)
    config = tomllib.loads(next(iter(setup.files.values())))
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8123/v1"
    assert provider["wire_api"] == "responses"
    assert setup.env[provider["env_key"]] == "secret"
    assert config["model"] == "qwen3.5-local"
    assert config["model_context_window"] == 40960
    assert config["model_max_output_tokens"] == 4096
    assert config["analytics"]["enabled"] is False
    assert setup.route == "/v1/responses"


def test_opencode_gets_an_openai_compatible_provider(tmp_path: Path) -> None:
    setup = agent_setup("opencode", TARGET, tmp_path)
    config = json.loads(next(iter(setup.files.values())))
    provider = config["provider"]["mlxcore"]
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8123/v1", "apiKey": "secret"}
    assert provider["models"]["qwen3.5-local"]["limit"] == {"context": 40960, "output": 4096}
    assert config["model"] == "mlxcore/qwen3.5-local"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert setup.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"


def test_claude_uses_a_bearer_token_and_no_vendor_traffic(tmp_path: Path) -> None:
    setup = agent_setup("claude", TARGET, tmp_path)
    env = setup.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "secret" and "ANTHROPIC_API_KEY" not in env
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "qwen3.5-local"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_TELEMETRY"] == "1"
    settings = json.loads(next(iter(setup.files.values())))
    assert settings["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"


@pytest.mark.parametrize(("context", "output"), [(1024, 256), (8192, 2048), (262144, 4096)])
def test_the_answer_length_fits_the_context(context: int, output: int) -> None:
    assert AgentTarget("http://x", "m", context).output_tokens == output


def test_without_a_server_key_a_placeholder_is_sent() -> None:
    assert AgentTarget("http://x", "m", 4096).key == "sk-local"


def test_qwen_code_gets_an_openai_provider_in_its_own_home(tmp_path: Path) -> None:
    setup = agent_setup("qwen", TARGET, tmp_path)
    settings = json.loads(next(iter(setup.files.values())))
    assert settings["security"]["auth"]["selectedType"] == "openai"
    (provider,) = settings["modelProviders"]["openai"]
    assert provider["baseUrl"] == "http://127.0.0.1:8123/v1"
    assert setup.env[provider["envKey"]] == "secret"
    assert settings["model"]["name"] == provider["id"] == "qwen3.5-local"
    assert settings["model"]["generationConfig"]["contextWindowSize"] == 40960
    assert settings["telemetry"]["enabled"] is False
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert setup.env["QWEN_TELEMETRY_ENABLED"] == "0"


def test_continue_gets_its_config_as_an_argument(tmp_path: Path) -> None:
    setup = agent_setup("continue", TARGET, tmp_path)
    (path,) = setup.files
    assert setup.program == "cn" and setup.args == ("--config", str(path))
    config = json.loads(setup.files[path])  # JSON is YAML: what cn reads
    (model,) = config["models"]
    assert model["provider"] == "openai" and model["apiBase"] == "http://127.0.0.1:8123/v1"
    assert model["apiKey"] == "secret" and model["model"] == "qwen3.5-local"
    assert model["defaultCompletionOptions"]["contextLength"] == 40960
    assert setup.env["CONTINUE_CLI_ENABLE_TELEMETRY"] == "0"
