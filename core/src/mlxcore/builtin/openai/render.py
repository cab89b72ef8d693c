"""``POST /v1/chat/completions/render`` and ``POST /v1/completions/render``: a request's
prompt token ids without generating (vLLM's render API).

A router that scores workers by their cached prefixes needs each request's token ids.
vllm-router renders chat requests itself, but not those with active tools (its
renderer refuses them): for those it asks the worker's ``/v1/chat/completions/render``,
and reads ``token_ids`` from vLLM's answer (a ``GenerateRequest``). The ids here come
from the function that builds every generation
(:func:`~mlxcore.request_builder.build_generations`), so they are the ids the chat
request will prefill; the same body is accepted and checked and the same 400s are given
(the context and the engine's own checks included): the generation is built and
checked as a submission is, then dropped. Both run on the preparation pool, never on
the engine.
"""

from __future__ import annotations

from typing import Any

import attrs
from litestar import Request, post

from mlxcore import request_builder as builder
from mlxcore.builtin.openai import chat, completions
from mlxcore.builtin.openai.encode import new_id
from mlxcore.builtin.openai.schemas import ChatCompletionRequest, CompletionRequest
from mlxcore.engine.validation import check_request
from mlxcore.request_builder import RequestSpec
from mlxcore.server.frontend import decode_request, model_service, served_name
from mlxcore.server.openapi import (
    BODY_OPTION,
    INTEGER,
    REPLIES_OPTION,
    STRING,
    array,
    nullable,
    obj,
    reply,
)
from mlxcore.server.service import GenerationService

RENDERED = obj(
    {
        "request_id": STRING,
        "model": STRING,
        "token_ids": array(INTEGER),
        "features": nullable(obj({})),
        "stream": {"type": "boolean"},
    },
    title="RenderedRequest",
)


def _ids(svc: GenerationService, spec: RequestSpec) -> list[int]:
    """The prompt ids of ``spec``'s generation, built and checked exactly as a
    generation request is (the engine's own checks included), never started."""
    gen = builder.build_generations(svc.runtime, attrs.evolve(spec, n=1))[0]
    check_request(gen.request, svc.runtime.engine.limits)
    return list(gen.request.prompt_tokens)


def _render_chat(
    svc: GenerationService, body: ChatCompletionRequest, extras: dict[str, Any]
) -> list[int]:
    return _ids(svc, chat.request_spec(svc, body, extras))


def _render_completions(
    svc: GenerationService, body: CompletionRequest, extras: dict[str, Any]
) -> list[list[int]]:
    return [_ids(svc, spec) for spec in completions.request_specs(svc, body, extras)]


def _rendered(model: str, ids: list[int], prefix: str, stream: bool) -> dict[str, Any]:
    return {
        "request_id": new_id(prefix),
        "model": model,
        "token_ids": ids,
        "features": None,
        "stream": stream,
    }


@post(
    "/v1/chat/completions/render",
    status_code=200,
    opt={
        BODY_OPTION: ChatCompletionRequest,
        REPLIES_OPTION: {200: reply("the request's prompt token ids", RENDERED)},
    },
)
async def render_chat(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The token ids a chat completion request's prompt becomes (vLLM's render API:
    what routers read to score workers by their cached prefixes)."""
    body, options = await decode_request(request, ChatCompletionRequest)
    svc = await model_service(request, body.model)
    ids = await svc.prepare(_render_chat, svc, body, options)
    return _rendered(served_name(svc, body.model), ids, "chatcmpl", bool(body.stream))


@post(
    "/v1/completions/render",
    status_code=200,
    opt={
        BODY_OPTION: CompletionRequest,
        REPLIES_OPTION: {200: reply("each prompt's token ids", array(RENDERED))},
    },
)
async def render_completions(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    """The token ids of each prompt of a text completion request (vLLM's render API)."""
    body, options = await decode_request(request, CompletionRequest)
    svc = await model_service(request, body.model)
    rendered = await svc.prepare(_render_completions, svc, body, options)
    model = served_name(svc, body.model)
    return [_rendered(model, ids, "cmpl", bool(body.stream)) for ids in rendered]
