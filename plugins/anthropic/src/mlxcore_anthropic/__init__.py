"""mlxcore plugin ``anthropic``: Anthropic's Messages API on the same engine.

``POST /v1/messages`` (stream and non-stream: text, thinking and tool_use
blocks) and ``POST /v1/messages/count_tokens``, with errors in Anthropic's
shape. Requests go through mlxcore's one output pipeline: the same parsers,
stop strings and prefix cache as the OpenAI routes. On by default once
installed.
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The Messages API router."""
    from mlxcore_anthropic.routes import messages_router

    return [messages_router()]
