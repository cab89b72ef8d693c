"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, Router, post

from mlxcore import request_builder as builder
from mlxcore import structured
from mlxcore.engine.events import Usage
from mlxcore.media import MediaPart
from mlxcore.output import OutputDelta
from mlxcore.request_builder import ChatPrompt, OutputConstraint, RequestSpec
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.errors import APIError, as_api_error, constraint_error, invalid
from mlxcore.server.frontend import (
    decode_body,
    decode_request,
    model_service,
    served_name,
)
from mlxcore.server.openapi import BODY_OPTION, ERRORS_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import Generation, GenerationService, collect
from mlxcore.server.sse import event_stream
from mlxcore_anthropic import convert
from mlxcore_anthropic.encode import (
    EventWriter,
    content_blocks,
    error_body,
    error_event,
    event,
    new_message_id,
    stop_reason,
    usage_body,
)
from mlxcore_anthropic.replies import EVENTS, MESSAGE, TOKEN_COUNT
from mlxcore_anthropic.schemas import CountTokensRequest, MessagesRequest


def chat_prompt(svc: GenerationService, body: MessagesRequest | CountTokensRequest) -> ChatPrompt:
    """The request's messages, system prompt and tools in the chat template's shape."""
    media = svc.runtime.media
    parts: list[MediaPart] = []
    messages = convert.chat_messages(body.messages, convert.system_text(body.system), media, parts)
    tools = convert.template_tools(body.tools)
    if isinstance(body, MessagesRequest) and body.tool_choice is not None:
        choice = body.tool_choice.type
        if choice == "none":
            tools = None
        elif choice not in ("auto", "any", "tool"):
            raise invalid(f"unknown tool_choice type {choice!r}", "tool_choice.type")
    kwargs = {"enable_thinking": thinks(svc, body)}
    return ChatPrompt(messages, tools, kwargs, parts)


def thinks(svc: GenerationService, body: MessagesRequest | CountTokensRequest) -> bool:
    """Whether the model thinks: as the request's ``thinking`` says, else as the
    server's ``--default-chat-template-kwargs`` say, else not (Anthropic's default)."""
    if body.thinking is not None:
        return convert.thinking_enabled(body)
    return svc.config.default_chat_template_kwargs.get("enable_thinking") is True


def request_spec(
    svc: GenerationService, body: MessagesRequest, extras: dict[str, Any]
) -> RequestSpec:
    """Describe a Messages request for the shared builder (``extras``: plugin options)."""
    prompt = chat_prompt(svc, body)
    return RequestSpec(
        prompt=prompt,
        sampling=convert.sampling(body),
        new_id=new_message_id,
        max_tokens=body.max_tokens,
        cap_max_tokens=True,
        stops=list(body.stop_sequences or []),
        stops_field="stop_sequences",
        extras=extras,
        constraint=_forced_tool_choice(body, prompt.tools),
        parallel_tool_calls=not (
            body.tool_choice is not None and body.tool_choice.disable_parallel_tool_use
        ),
        thinking_budget=body.thinking.budget_tokens
        if body.thinking is not None and body.thinking.type == "enabled"
        else None,
        cache_salt=body.cache_salt,
    )


def build_generation(
    svc: GenerationService, body: MessagesRequest, extras: dict[str, Any]
) -> Generation:
    """Validate a Messages request and prepare its generation."""
    (generation,) = builder.build_generations(svc.runtime, request_spec(svc, body, extras))
    return generation


def _forced_tool_choice(
    body: MessagesRequest, tools: list[dict[str, Any]] | None
) -> OutputConstraint | None:
    """The constraint and parser for ``tool_choice`` ``any`` / ``tool`` (else ``None``)."""
    choice = body.tool_choice
    if choice is None or choice.type not in ("any", "tool"):
        return None
    openai_choice: Any = "required"
    if choice.type == "tool":
        if not choice.name:
            raise invalid("tool_choice of type tool needs a name", "tool_choice.name")
        openai_choice = {"type": "function", "function": {"name": choice.name}}
    try:
        forced = structured.tool_choice_constraint(
            tools, openai_choice, parallel=not choice.disable_parallel_tool_use
        )
    except structured.ConstraintError as exc:
        raise constraint_error(str(exc), exc.field or "tool_choice") from None
    if forced is None:
        return None
    value, parser = forced
    return OutputConstraint(
        value,
        lambda: parser,
        tool_mode="named" if choice.type == "tool" else "required",
        tool_name=choice.name if choice.type == "tool" else None,
        parallel=choice.type != "tool" and not choice.disable_parallel_tool_use,
    )


@post(
    "/messages",
    status_code=200,
    opt={
        BODY_OPTION: MessagesRequest,
        REPLIES_OPTION: {200: reply("the message", MESSAGE, events=EVENTS)},
        ERRORS_OPTION: {529: "overloaded; retry after Retry-After seconds"},
    },
)
async def messages(request: Request[Any, Any, Any]) -> Any:
    """Anthropic Messages."""
    body, extras = await decode_request(request, MessagesRequest)
    svc = await model_service(request, body.model)
    gen = await svc.prepare(build_generation, svc, body, extras)
    deltas = await unless_disconnected(request, svc.start(gen))
    model = served_name(svc, body.model)
    show_thinking = thinks(svc, body)
    if body.stream:
        return event_stream(_events(gen, deltas, model, show_thinking), error_event)
    out = await unless_disconnected(request, collect(deltas))
    reason, sequence = stop_reason(out.finish_reason, gen.pipeline)
    return {
        "id": gen.request.request_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(out, show_thinking=show_thinking),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_body(gen.usage),
    }


async def _events(
    gen: Generation, deltas: AsyncIterator[OutputDelta], model: str, show_thinking: bool
) -> AsyncIterator[bytes]:
    cached = gen.handle.cached_tokens if gen.handle is not None else 0
    start_usage = usage_body(Usage(len(gen.request.prompt_tokens), 0, cached))
    message: dict[str, Any] = {
        "id": gen.request.request_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    yield event("message_start", {"type": "message_start", "message": message})
    yield event("ping", {"type": "ping"})
    writer = EventWriter(show_thinking=show_thinking)
    finish: str | None = None
    async for d in deltas:
        for chunk in writer.write(d):
            yield chunk
        finish = d.finish_reason or finish
    for chunk in writer.close():
        yield chunk
    reason, sequence = stop_reason(finish, gen.pipeline)
    delta = {"stop_reason": reason, "stop_sequence": sequence}
    usage = usage_body(gen.usage)
    yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield event("message_stop", {"type": "message_stop"})


@post(
    "/messages/count_tokens",
    status_code=200,
    opt={
        BODY_OPTION: CountTokensRequest,
        REPLIES_OPTION: {200: reply("the count", TOKEN_COUNT)},
        ERRORS_OPTION: {529: "overloaded; retry after Retry-After seconds"},
    },
)
async def count_tokens(request: Request[Any, Any, Any]) -> dict[str, int]:
    """How many input tokens a Messages request's prompt has."""
    body = await decode_body(request, CountTokensRequest)
    svc = await model_service(request, body.model)
    prompt = await svc.prepare(
        lambda: builder.prepare_prompt(
            svc.runtime, builder.with_server_defaults(svc.runtime, chat_prompt(svc, body)), {}
        )
    )
    return {"input_tokens": len(prompt.ids)}


def anthropic_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Every error on these routes in Anthropic's shape."""
    err: APIError = as_api_error(request, exc)
    status, body = error_body(err)
    return Response(content=body, status_code=status, headers=err.headers)


def messages_router() -> Router:
    """The ``/v1`` router with the Messages routes and Anthropic-shaped errors."""
    return Router(
        path="/v1",
        route_handlers=[messages, count_tokens],
        exception_handlers={Exception: anthropic_errors},
    )
