"""Built-in plugin: the OpenAI routes (chat, completions, embeddings, responses)."""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.request_builder import warn_once

ROUTER_FIELDS: dict[str, object] = {
    "skip_special_tokens": True,
    "include_reasoning": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "no_stop_trim": False,
    "return_hidden_states": False,
    "continue_final_message": False,
}
"""Fields vllm-router (and SGLang clients) add to every chat request, with the values
that ask for what mlxcore does anyway: accepted quietly at these values; any other value
is ignored with a warning (docs/replicas.md)."""


@hookimpl
def mlxcore_request_options() -> list[str]:
    """The router-added fields of :data:`ROUTER_FIELDS`."""
    return list(ROUTER_FIELDS)


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """A router-added field at another value than mlxcore's behaviour: a warning (once)."""
    for name, neutral in ROUTER_FIELDS.items():
        if name in options and options[name] is not None and options[name] != neutral:
            warn_once(
                f"router-field:{name}",
                "request field %r = %r is not supported (mlxcore behaves as %r); it is ignored",
                name,
                options[name],
                neutral,
            )


@hookimpl(trylast=True)
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, the Responses
    API (``/v1/responses`` and its stored-response routes), and vLLM's ``/tokenize``
    ``/detokenize``, ``/tokenizer_info`` and render API (``/v1/chat/completions/render``,
    ``/v1/completions/render``)."""
    from mlxcore.builtin.openai.chat import chat_completions
    from mlxcore.builtin.openai.completions import completions
    from mlxcore.builtin.openai.embeddings import create_embeddings
    from mlxcore.builtin.openai.render import render_chat, render_completions
    from mlxcore.builtin.openai.responses.routes import ROUTES
    from mlxcore.builtin.openai.tokenize import detokenize, tokenize, tokenizer_info

    tokenizer_routes = [tokenize, detokenize, tokenizer_info, render_chat, render_completions]
    return [chat_completions, completions, create_embeddings, *ROUTES, *tokenizer_routes]
