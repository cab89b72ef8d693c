"""Built-in plugin: the OpenAI routes (chat, completions, embeddings, responses)."""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig


@hookimpl(trylast=True)
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, the Responses
    API (``/v1/responses`` and its stored-response routes), and vLLM's ``/tokenize``
    ``/detokenize`` and ``/tokenizer_info``."""
    from mlxcore.builtin.openai.chat import chat_completions
    from mlxcore.builtin.openai.completions import completions
    from mlxcore.builtin.openai.embeddings import create_embeddings
    from mlxcore.builtin.openai.responses.routes import ROUTES
    from mlxcore.builtin.openai.tokenize import detokenize, tokenize, tokenizer_info

    tokenizer_routes = [tokenize, detokenize, tokenizer_info]
    return [chat_completions, completions, create_embeddings, *ROUTES, *tokenizer_routes]
