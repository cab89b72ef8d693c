"""What each agent CLI needs to talk to an mlxcore server: the files to write into a
directory of mlxcore's own and the environment to run it with (``mlxcore agent``).

Every agent here is pointed at the server by settings it documents, with its telemetry,
update checks and other traffic to its vendor turned off, and never reads or writes the
user's own configuration: each gets its configuration directory (Claude Code's
``CLAUDE_CONFIG_DIR``, Codex's ``CODEX_HOME``, OpenCode's ``OPENCODE_CONFIG``, Qwen
Code's ``QWEN_HOME``, Continue's ``CONTINUE_GLOBAL_DIR`` and ``--config``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import attrs

PROVIDER = "mlxcore"
"""The provider name written into the agents' configurations."""

DEFAULT_OUTPUT_TOKENS = 4096
"""The answer length an agent is told the model allows (at most a quarter of the
context)."""


@attrs.frozen
class AgentTarget:
    """The server an agent talks to.

    Attributes:
        base_url: the server's root (``http://127.0.0.1:8000``), no ``/v1``.
        model: the model name the server answers to.
        context: the model's context window in tokens.
        api_key: the server's ``--api-key``, or None when it takes any.
    """

    base_url: str
    model: str
    context: int
    api_key: str | None = None

    @property
    def key(self) -> str:
        """The key to send: the server's, or a placeholder it ignores."""
        return self.api_key or "sk-local"

    @property
    def output_tokens(self) -> int:
        """The longest answer the agent is told to ask for."""
        return max(256, min(DEFAULT_OUTPUT_TOKENS, self.context // 4))


@attrs.frozen
class AgentSetup:
    """How to run one agent against a target.

    Attributes:
        program: the executable's name on ``PATH``.
        package: the npm package that installs it.
        files: paths (inside the agent's directory) and their contents.
        env: variables to set for the agent.
        route: the API route the agent uses (for messages and checks).
        args: arguments the agent gets before the user's own.
    """

    program: str
    package: str
    files: dict[Path, str]
    env: dict[str, str]
    route: str
    args: tuple[str, ...] = ()

    def write(self) -> list[Path]:
        """Write :attr:`files` (creating their folders); the paths written."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return list(self.files)


QUIET = {"NO_UPDATE_NOTIFIER": "1", "DO_NOT_TRACK": "1"}
"""Variables every agent gets: npm's update notice and the common opt-out of tracking."""


def claude(target: AgentTarget, directory: Path) -> AgentSetup:
    """Claude Code: Anthropic's Messages API, configured by environment variables.
    The bearer token (``ANTHROPIC_AUTH_TOKEN``) rather than ``ANTHROPIC_API_KEY``:
    an interactive session would first ask whether to use an unknown API key."""
    home = directory / "claude"
    env = {
        "CLAUDE_CONFIG_DIR": str(home),
        "ANTHROPIC_BASE_URL": target.base_url,
        "ANTHROPIC_AUTH_TOKEN": target.key,
        "ANTHROPIC_MODEL": target.model,
        "ANTHROPIC_SMALL_FAST_MODEL": target.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(target.output_tokens),
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    settings = {"env": {k: v for k, v in env.items() if k != "CLAUDE_CONFIG_DIR"}}
    files = {home / "settings.json": json.dumps(settings, indent=2) + "\n"}
    return AgentSetup("claude", "@anthropic-ai/claude-code", files, env, "/v1/messages")


def codex(target: AgentTarget, directory: Path) -> AgentSetup:
    """Codex CLI: the Responses API through a provider of its ``config.toml``."""
    home = directory / "codex"
    lines = [
        f"model = {json.dumps(target.model)}",
        f'model_provider = "{PROVIDER}"',
        f"model_context_window = {target.context}",
        f"model_max_output_tokens = {target.output_tokens}",
        "check_for_update_on_startup = false",
        "",
        f"[model_providers.{PROVIDER}]",
        f'name = "{PROVIDER}"',
        f"base_url = {json.dumps(target.base_url + '/v1')}",
        'wire_api = "responses"',
        'env_key = "MLXCORE_API_KEY"',
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[otel]",
        'exporter = "none"',
        "",
    ]
    env = {"CODEX_HOME": str(home), "MLXCORE_API_KEY": target.key}
    files = {home / "config.toml": "\n".join(lines)}
    return AgentSetup("codex", "@openai/codex", files, env, "/v1/responses")


def opencode(target: AgentTarget, directory: Path) -> AgentSetup:
    """OpenCode: Chat Completions through the ``@ai-sdk/openai-compatible`` provider."""
    path = directory / "opencode" / "opencode.json"
    limit = {"context": target.context, "output": target.output_tokens}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": PROVIDER,
        "options": {"baseURL": target.base_url + "/v1", "apiKey": target.key},
        "models": {target.model: {"name": target.model, "limit": limit, "tool_call": True}},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: provider},
        "model": f"{PROVIDER}/{target.model}",
        "small_model": f"{PROVIDER}/{target.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    env = {
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
    }
    files = {path: json.dumps(config, indent=2) + "\n"}
    return AgentSetup("opencode", "opencode-ai", files, env, "/v1/chat/completions")


def qwen(target: AgentTarget, directory: Path) -> AgentSetup:
    """Qwen Code: Chat Completions through an ``openai`` model provider of its
    ``settings.json`` in its own ``QWEN_HOME``."""
    home = directory / "qwen"
    generation = {"contextWindowSize": target.context, "max_tokens": target.output_tokens}
    provider = {
        "id": target.model,
        "name": target.model,
        "baseUrl": target.base_url + "/v1",
        "envKey": "MLXCORE_API_KEY",
        "generationConfig": generation,
    }
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": target.model, "generationConfig": generation},
        "modelProviders": {"openai": [provider]},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    env = {
        "QWEN_HOME": str(home),
        "MLXCORE_API_KEY": target.key,
        "OPENAI_API_KEY": target.key,
        "OPENAI_BASE_URL": target.base_url + "/v1",
        "OPENAI_MODEL": target.model,
        "QWEN_TELEMETRY_ENABLED": "0",
        "QWEN_USAGE_STATISTICS_ENABLED": "0",
    }
    files = {home / "settings.json": json.dumps(settings, indent=2) + "\n"}
    return AgentSetup("qwen", "@qwen-code/qwen-code", files, env, "/v1/chat/completions")


def continue_cli(target: AgentTarget, directory: Path) -> AgentSetup:
    """Continue's ``cn``: an ``openai`` model of a ``config.yaml`` given with
    ``--config`` (its own ``CONTINUE_GLOBAL_DIR`` for sessions and state). The YAML is
    written as JSON, which YAML reads."""
    home = directory / "continue"
    path = home / "config.yaml"
    model = {
        "name": target.model,
        "provider": "openai",
        "model": target.model,
        "apiBase": target.base_url + "/v1",
        "apiKey": target.key,
        "roles": ["chat", "edit", "apply"],
        "capabilities": ["tool_use"],
        "defaultCompletionOptions": {
            "contextLength": target.context,
            "maxTokens": target.output_tokens,
        },
    }
    config = {"name": "mlxcore", "version": "1.0.0", "schema": "v1", "models": [model]}
    env = {
        "CONTINUE_GLOBAL_DIR": str(home),
        "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
        "CONTINUE_METRICS_ENABLED": "0",
    }
    files = {path: json.dumps(config, indent=2) + "\n"}
    return AgentSetup(
        "cn", "@continuedev/cli", files, env, "/v1/chat/completions", ("--config", str(path))
    )


AGENTS: dict[str, Callable[[AgentTarget, Path], AgentSetup]] = {
    "claude": claude,
    "codex": codex,
    "opencode": opencode,
    "qwen": qwen,
    "continue": continue_cli,
}
"""The agents ``mlxcore agent`` sets up, by the name the user types."""


def agent_setup(name: str, target: AgentTarget, directory: Path) -> AgentSetup:
    """``name``'s set-up for ``target``, its files under ``directory``; the quiet
    variables every agent gets are included."""
    setup = AGENTS[name](target, directory)
    return attrs.evolve(setup, env={**QUIET, **setup.env})
