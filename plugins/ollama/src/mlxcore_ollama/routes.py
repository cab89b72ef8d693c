"""``POST /api/chat``, ``/api/generate``, ``/api/embed`` and ``/api/embeddings``: Ollama's
generation and embedding routes, built by the shared request builder and answered
through the one output pipeline (NDJSON lines while streaming, one object otherwise).
The model routes are in :mod:`mlxcore_ollama.models`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request, Response, Router, post

from mlxcore import request_builder as builder
from mlxcore.builtin.openai.encode import LogprobEncoder
from mlxcore.output import OutputDelta
from mlxcore.request_builder import ChatPrompt, Generation, RequestSpec, TextPrompt
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.errors import APIError, as_api_error, invalid
from mlxcore.server.frontend import decode_request
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION
from mlxcore.server.service import GenerationService, collect
from mlxcore.server.sse import event_stream
from mlxcore_ollama import convert, embed, manage, models
from mlxcore_ollama.encode import created_at, done_reason, error_line, line, timings, tool_calls
from mlxcore_ollama.replies import CHAT, GENERATE, NDJSON, streamed
from mlxcore_ollama.schemas import ChatRequest, GenerateRequest, GenerationFields, Message


def _spec(
    svc: GenerationService,
    body: GenerationFields,
    prompt: ChatPrompt | TextPrompt,
    extras: dict[str, Any],
) -> RequestSpec:
    """What a chat or generate request asks of the shared builder."""
    rt = svc.runtime
    opts = convert.options(body, len(rt.tokenizer), svc.context_length)
    _, budget = convert.think(body.think)
    return RequestSpec(
        prompt=prompt,
        sampling=opts.sampling,
        new_id=lambda: "ollama-" + uuid.uuid4().hex[:24],
        max_tokens=opts.max_tokens,
        default_max_tokens=svc.config.default_max_tokens,
        max_tokens_field="options.num_predict",
        cap_max_tokens=True,
        stops=opts.stops,
        stops_field="options.stop",
        extras={**extras, **opts.extras},
        constraint=convert.constraint(body.format),
        thinking_budget=budget,
        parse=not (isinstance(body, GenerateRequest) and body.raw),
        cache_salt=body.cache_salt,
    )


def _template_kwargs(body: GenerationFields) -> dict[str, Any]:
    enabled, _ = convert.think(body.think)
    return {} if enabled is None else {"enable_thinking": enabled}


def chat_generation(
    svc: GenerationService, body: ChatRequest, extras: dict[str, Any]
) -> Generation:
    """Validate an ``/api/chat`` request and prepare its generation."""
    messages, parts = convert.template_messages(body.messages or [], svc.runtime.media)
    prompt = ChatPrompt(messages, convert.check_tools(body.tools), _template_kwargs(body), parts)
    (generation,) = builder.build_generations(svc.runtime, _spec(svc, body, prompt, extras))
    return generation


def generate_generation(
    svc: GenerationService, body: GenerateRequest, extras: dict[str, Any]
) -> Generation:
    """Validate an ``/api/generate`` request and prepare its generation: the prompt
    through the chat template as one user turn (after ``system``), or as given with
    ``raw``."""
    if body.context:
        raise invalid(
            "context (the token list of an earlier answer) is not supported; "
            "send the conversation to /api/chat instead",
            "context",
        )
    if body.template:
        raise invalid("a template in the request is not accepted; the model's is used", "template")
    if body.suffix:
        raise invalid("suffix (fill in the middle) is not supported", "suffix")
    prompt: ChatPrompt | TextPrompt
    if body.raw:
        if body.images:
            raise invalid("images need the chat template; leave raw off", "images")
        prompt = TextPrompt(text=body.prompt or "")
    else:
        turns = [Message(role="system", content=body.system)] if body.system else []
        turns.append(Message(role="user", content=body.prompt or "", images=body.images))
        messages, parts = convert.template_messages(turns, svc.runtime.media)
        prompt = ChatPrompt(messages, None, _template_kwargs(body), parts)
    (generation,) = builder.build_generations(svc.runtime, _spec(svc, body, prompt, extras))
    return generation


@post(
    "/chat",
    status_code=200,
    opt={BODY_OPTION: ChatRequest, REPLIES_OPTION: {200: streamed("the answer", CHAT)}},
)
async def chat(request: Request[Any, Any, Any]) -> Any:
    """Ollama chat: streamed NDJSON unless ``stream`` is false."""
    body, extras = await decode_request(request, ChatRequest)
    svc = await models.service(request, body.model)
    if not body.messages:  # Ollama's way to load (or, with keep_alive 0, unload) a model
        done = await models.load_or_unload(request, body.model, body.keep_alive, chat=True)
        return _one_object(done, body.stream)
    gen = await svc.prepare(chat_generation, svc, body, extras)
    return await _answer(request, svc, gen, body, _chat_object)


@post(
    "/generate",
    status_code=200,
    opt={BODY_OPTION: GenerateRequest, REPLIES_OPTION: {200: streamed("the answer", GENERATE)}},
)
async def generate(request: Request[Any, Any, Any]) -> Any:
    """Ollama generate: streamed NDJSON unless ``stream`` is false."""
    body, extras = await decode_request(request, GenerateRequest)
    svc = await models.service(request, body.model)
    if not body.prompt and not body.images:
        done = await models.load_or_unload(request, body.model, body.keep_alive, chat=False)
        return _one_object(done, body.stream)
    gen = await svc.prepare(generate_generation, svc, body, extras)
    return await _answer(request, svc, gen, body, _generate_object)


def _one_object(body: dict[str, Any], stream: bool) -> Any:
    """An answer of one object: a one-line stream when the client asked for a stream."""
    if not stream:
        return Response(body)

    async def lines() -> AsyncIterator[bytes]:
        yield line(body)

    return event_stream(lines(), error_line, keepalive=None, media_type=NDJSON)


Shape = Callable[[str, OutputDelta, bool], dict[str, Any]]
"""Builds one answer object (chat or generate) from a delta."""


def _chat_object(model: str, d: OutputDelta, show_thinking: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": d.content}
    if d.reasoning and show_thinking:
        message["thinking"] = d.reasoning
    if d.tool_calls:
        message["tool_calls"] = tool_calls(d.tool_calls)
    return {"model": model, "created_at": created_at(), "message": message, "done": False}


def _generate_object(model: str, d: OutputDelta, show_thinking: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": model, "created_at": created_at(), "response": d.content}
    if d.reasoning and show_thinking:
        out["thinking"] = d.reasoning
    out["done"] = False
    return out


async def _answer(
    request: Request[Any, Any, Any],
    svc: GenerationService,
    gen: Generation,
    body: GenerationFields,
    shape: Shape,
) -> Any:
    deltas = await unless_disconnected(request, svc.start(gen))
    show_thinking = body.think is not False
    scored = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs else None

    def render(d: OutputDelta) -> dict[str, Any]:
        out = shape(body.model, d, show_thinking)
        if scored is not None and d.logprobs:  # Ollama's items: OpenAI's chat ones
            out["logprobs"] = scored.chat(d.logprobs)["content"]
        return out

    if body.stream:
        lines = _lines(gen, deltas, render, show_thinking)
        return event_stream(lines, error_line, keepalive=None, media_type=NDJSON)
    out = await unless_disconnected(request, collect(deltas))
    answer = render(out)
    answer.update(done=True, done_reason=done_reason(out.finish_reason), **timings(gen))
    return Response(answer)


async def _lines(
    gen: Generation,
    deltas: AsyncIterator[OutputDelta],
    render: Callable[[OutputDelta], dict[str, Any]],
    show_thinking: bool,
) -> AsyncIterator[bytes]:
    finish: str | None = None
    async for d in deltas:
        finish = d.finish_reason or finish
        if d.content or (d.reasoning and show_thinking) or d.tool_calls or d.logprobs:
            yield line(render(d))
    last = render(OutputDelta())
    last.update(done=True, done_reason=done_reason(finish), **timings(gen))
    yield line(last)


def ollama_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Every error on these routes in Ollama's shape: ``{"error": "..."}``."""
    err: APIError = as_api_error(request, exc)
    return Response(content={"error": err.message}, status_code=err.status, headers=err.headers)


def ollama_router() -> Router:
    """The ``/api`` router with Ollama's routes and Ollama-shaped errors."""
    return Router(
        path="/api",
        route_handlers=[chat, generate, *embed.HANDLERS, *models.HANDLERS, *manage.HANDLERS],
        exception_handlers={Exception: ollama_errors},
    )
