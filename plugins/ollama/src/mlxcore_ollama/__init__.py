"""mlxcore plugin ``ollama``: Ollama's API on the same engine and output pipeline.

``POST /api/chat`` and ``/api/generate`` (NDJSON streams by default, or one object),
``/api/embed`` and ``/api/embeddings``, and the model routes ``/api/tags``,
``/api/show``, ``/api/ps`` and ``/api/version``, ``/api/pull`` and ``/api/delete``
(through mlxcore's model manager; ``--no-ollama-pull`` turns them off), with Ollama's
error shape
(``{"error": "..."}``) and its timings in the final object. Clients that only speak
Ollama (Open WebUI's Ollama connection, the ``ollama`` Python and JavaScript clients)
point at the server's address; ``mlxcore serve --port 11434`` takes Ollama's own port.
On by default once installed.
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.hookspecs import OptionGroup
from mlxcore.settings import add_flags


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--no-ollama-pull``."""
    from mlxcore_ollama.settings import OllamaSettings

    add_flags(parser, OllamaSettings)


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The ``/api`` router."""
    from mlxcore_ollama.routes import ollama_router

    return [ollama_router()]
