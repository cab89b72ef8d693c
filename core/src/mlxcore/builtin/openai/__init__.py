"""Built-in plugin: the OpenAI-compatible routes (chat completions, completions, models)."""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig


@hookimpl(trylast=True)
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``."""
    from mlxcore.builtin.openai.chat import chat_completions
    from mlxcore.builtin.openai.completions import completions, list_models

    return [chat_completions, completions, list_models]
