"""``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info`` in vLLM's shapes
(llama-server's field names accepted too).

``/tokenize`` takes a ``prompt`` (raw text, as ``/v1/completions`` tokenizes it) or
``messages`` (rendered with the model's chat template exactly as ``/v1/chat/completions``
renders them, tools and ``chat_template_kwargs`` included), so its ``count`` is the
``prompt_tokens`` a generation of the same input reports. ``/detokenize`` turns ids back
into text. Both run on the preparation pool, never on the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from litestar import Request, get, post

from mlxcore import request_builder as builder
from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.schemas import FUNCTION_TOOL, Message
from mlxcore.request_builder import ChatPrompt
from mlxcore.server.errors import invalid
from mlxcore.server.frontend import decode_body, model_service
from mlxcore.server.openapi import (
    BODY_OPTION,
    INTEGER,
    PROMPT_TOKEN_ID,
    QUERY_OPTION,
    REPLIES_OPTION,
    STRING,
    array,
    exactly_one,
    given,
    nullable,
    obj,
    reply,
)
from mlxcore.server.service import GenerationService

MAX_DETOKENIZE = 1 << 20
"""Most ids one ``/detokenize`` request may hold."""

PromptId = Annotated[int, msgspec.Meta(ge=0, title=PROMPT_TOKEN_ID["title"])]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """Exactly one of ``prompt`` (``content`` in llama-server) and ``messages``."""

    schema_rules: ClassVar[dict[str, Any]] = exactly_one(
        {"anyOf": [given("prompt"), given("content")]}, given("messages")
    )
    model: str | None = None
    prompt: str | None = None
    content: str | None = None
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)] | None = None
    tools: Annotated[
        list[dict[str, Any]] | None, msgspec.Meta(extra_json_schema={"items": FUNCTION_TOOL})
    ] = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    """Raw prompts only: the tokenizer's BOS and the like (a chat template writes its own)."""
    return_token_strs: bool = False
    with_pieces: bool = False
    """llama-server's name for ``return_token_strs``."""


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: Annotated[list[PromptId], msgspec.Meta(max_length=MAX_DETOKENIZE)]


TOKENIZE_REPLY = obj(
    {
        "count": INTEGER,
        "tokens": array(INTEGER),
        "max_model_len": nullable(INTEGER),
        "token_strs": nullable(array(STRING)),
    },
    title="TokenizeResponse",
)
DETOKENIZE_REPLY = obj({"prompt": STRING, "content": STRING}, title="DetokenizeResponse")
_TOKEN = nullable(STRING)
TOKENIZER_INFO_REPLY = obj(
    {
        "tokenizer_class": STRING,
        "eos_token": _TOKEN,
        "bos_token": _TOKEN,
        "pad_token": _TOKEN,
        "unk_token": _TOKEN,
        "chat_template": _TOKEN,
        "model_max_length": nullable(INTEGER),
        "vocab_size": INTEGER,
    },
    title="TokenizerInfo",
)


def _tokenize(svc: GenerationService, body: TokenizeRequest) -> list[int]:
    rt = svc.runtime
    text = body.prompt if body.prompt is not None else body.content
    if (text is None) == (body.messages is None):
        raise invalid("give exactly one of prompt and messages", "prompt")
    convert.check_tools(body.tools)  # in the document's shape, used or not
    if text is not None:
        builder.check_prompt_size(rt, len(text), "prompt")
        ids: list[int] = rt.tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
        return ids
    assert body.messages is not None
    messages, media = convert.normalize_chat(body.messages, rt.media)
    prompt = ChatPrompt(messages, body.tools, dict(body.chat_template_kwargs or {}), media)
    prompt = builder.with_server_defaults(rt, prompt)
    if body.add_generation_prompt or media:
        return builder.prepare_prompt(rt, prompt, {}).ids
    return _render_without_generation_prompt(svc, prompt)


def _render_without_generation_prompt(svc: GenerationService, prompt: ChatPrompt) -> list[int]:
    """The conversation as the template writes it when no answer is to follow."""
    rt = svc.runtime
    builder.check_chat_size(rt, prompt)  # the same size limit as a generation
    try:
        text = rt.tokenizer.apply_chat_template(
            prompt.messages,
            tools=prompt.tools,
            add_generation_prompt=False,
            tokenize=False,
            **prompt.template_kwargs,
        )
    except Exception as exc:
        raise builder.rejected(
            f"the chat template could not render these messages: {exc}", "messages"
        ) from None
    ids: list[int] = rt.tokenizer.encode(text, add_special_tokens=False)
    return ids


@post(
    "/tokenize",
    status_code=200,
    opt={
        BODY_OPTION: TokenizeRequest,
        REPLIES_OPTION: {200: reply("the prompt's token ids", TOKENIZE_REPLY)},
    },
)
async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The token ids a prompt or a conversation becomes for this model (vLLM's shape)."""
    body = await decode_body(request, TokenizeRequest)
    svc = await model_service(request, body.model, task=None)
    ids = await svc.prepare(_tokenize, svc, body)
    strs = None
    if body.return_token_strs or body.with_pieces:
        strs = svc.runtime.tokenizer.convert_ids_to_tokens(ids)
    return {
        "count": len(ids),
        "max_model_len": svc.context_length,
        "tokens": ids,
        "token_strs": strs,
    }


def _detokenize(svc: GenerationService, ids: list[int]) -> str:
    rt = svc.runtime
    vocab = min(rt.engine.limits.vocab_size, len(rt.tokenizer))
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            message = f"token id {token} is outside the vocabulary [0, {vocab})"
            raise invalid(message, f"tokens[{i}]")
    text: str = rt.tokenizer.decode(ids)
    return text


@post(
    "/detokenize",
    status_code=200,
    opt={
        BODY_OPTION: DetokenizeRequest,
        REPLIES_OPTION: {200: reply("the text of the ids", DETOKENIZE_REPLY)},
    },
)
async def detokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The text of token ids (``prompt`` as vLLM names it, ``content`` as llama-server)."""
    body = await decode_body(request, DetokenizeRequest)
    svc = await model_service(request, body.model, task=None)
    text = await svc.prepare(_detokenize, svc, body.tokens)
    return {"prompt": text, "content": text}


SPECIAL_TOKENS = ("eos_token", "bos_token", "pad_token", "unk_token")


def _special(tokenizer: Any, name: str) -> str | None:
    value = getattr(tokenizer, name, None)
    return value if isinstance(value, str) else None


@get(
    "/tokenizer_info",
    opt={
        REPLIES_OPTION: {200: reply("the model's tokenizer settings", TOKENIZER_INFO_REPLY)},
        QUERY_OPTION: {"model": {"type": "string", "description": "a served model name"}},
    },
)
async def tokenizer_info(
    request: Request[Any, Any, Any], model: str | None = None
) -> dict[str, Any]:
    """The tokenizer's special tokens and chat template (vLLM's shape: what
    lm-evaluation-harness's remote tokenizer reads)."""
    svc = await model_service(request, model, task=None)
    tokenizer = svc.runtime.tokenizer
    template = getattr(tokenizer, "chat_template", None)
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # past mlx-lm's wrapper
    return {
        "tokenizer_class": type(inner).__name__,
        **{
            name: _special(tokenizer, name)
            for name in ("eos_token", "bos_token", "pad_token", "unk_token")
        },
        "chat_template": template if isinstance(template, str) else None,
        "model_max_length": svc.context_length,
        "vocab_size": len(tokenizer),
    }
