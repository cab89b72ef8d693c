"""The Responses API: ``POST /v1/responses`` and the stored-response routes.

A Responses request goes through the same request builder and output pipeline as a
chat completion: its items become chat-template messages (:mod:`.items`), the builder
renders, tokenizes, checks and constrains them, and the pipeline's deltas become output
items and stream events (:mod:`.events`). Finished responses are kept in a bounded
store (:mod:`.store`) for ``previous_response_id`` and the ``GET`` routes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import attrs
from litestar import Request, get, post, route

from mlxcore import request_builder as builder
from mlxcore import thinking
from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.encode import new_id
from mlxcore.builtin.openai.responses import items as item_conv
from mlxcore.builtin.openai.responses.events import OutputWriter, new_item_id
from mlxcore.builtin.openai.responses.replies import (
    INPUT_ITEMS,
    RESPONSE,
    RESPONSE_EVENTS,
    STORED_OR_DELETED,
)
from mlxcore.builtin.openai.responses.schemas import ResponsesRequest
from mlxcore.builtin.openai.responses.store import ResponseStore, not_found
from mlxcore.builtin.openai.schemas import ChatCompletionRequest
from mlxcore.engine.events import Usage
from mlxcore.media import MediaPart
from mlxcore.output import OutputDelta
from mlxcore.request_builder import ChatPrompt, RequestSpec
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import (
    decode_request,
    model_service,
    served_name,
)
from mlxcore.server.keys import KeyTable
from mlxcore.server.openapi import (
    BODY_OPTION,
    ERRORS_OPTION,
    QUERY_OPTION,
    REPLIES_OPTION,
    reply,
)
from mlxcore.server.service import Generation, GenerationService
from mlxcore.server.sse import EventStream, event_stream
from mlxcore.server.tenants import current_owner, owned

THINKING_OFF_EFFORTS = ("none", "minimal")
"""``reasoning.effort`` values that turn the template's thinking switch off."""


@attrs.define
class Prepared:
    """A Responses request ready to run: its generation and what the answer needs."""

    generation: Generation
    input_items: list[dict[str, Any]]
    namespaces: dict[str, str]


@attrs.define
class Running:
    """A response being generated (for ``GET`` and ``cancel`` while it runs)."""

    response: dict[str, Any]
    generation: Generation


def store_of(request: Request[Any, Any, Any]) -> ResponseStore:
    """The app's response store (made on first use from the server's settings; each
    key's own cap from the keys file)."""
    state = request.app.state
    if "responses_store" not in state:
        config = request.app.state.config
        keys: KeyTable | None = getattr(state, "api_keys", None)

        def cap(owner: str | None) -> int | None:
            key = keys.named(owner) if keys is not None and owner is not None else None
            return key.max_stored_bytes if key is not None else None

        state["responses_store"] = ResponseStore(
            config.responses_store_size, config.responses_ttl, cap=cap
        )
        state["responses_running"] = {}
    return cast(ResponseStore, state["responses_store"])


def running_of(request: Request[Any, Any, Any]) -> dict[tuple[str | None, str], Running]:
    """Responses in progress, by owner and id (:func:`~mlxcore.server.tenants.owned`)."""
    store_of(request)
    return cast(dict[tuple[str | None, str], Running], request.app.state["responses_running"])


def _with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored and listed: each with an id, message text as parts."""
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            out.append(item)
            continue
        kind = item.get("type", "message")
        copy = {"type": kind, **item}
        copy.setdefault("id", new_item_id("msg" if kind == "message" else "item"))
        if kind == "message" and isinstance(copy.get("content"), str):
            part = "output_text" if copy.get("role") == "assistant" else "input_text"
            copy["content"] = [{"type": part, "text": copy["content"]}]
        out.append(copy)
    return out


def _template_kwargs(body: ResponsesRequest) -> dict[str, Any]:
    """The request's template variables, with ``reasoning.effort`` as the thinking switch."""
    kwargs = dict(body.chat_template_kwargs or {})
    effort = body.reasoning.effort if body.reasoning else None
    if effort is not None:
        kwargs.setdefault("enable_thinking", effort not in THINKING_OFF_EFFORTS)
    return kwargs


def _effort_budget(body: ResponsesRequest) -> int | None:
    """The thinking budget ``reasoning.effort`` stands for (see :mod:`mlxcore.thinking`)."""
    try:
        return thinking.effort_budget(body.reasoning.effort if body.reasoning else None)
    except ValueError as exc:
        raise invalid(str(exc), "reasoning.effort") from None


CHOICE_MODES = ("none", "auto", "required")


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """A Responses ``tool_choice`` in Chat Completions' form (a string is checked with
    the chat fields)."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "allowed_tools" and choice.get("mode", "auto") in CHOICE_MODES:
        return choice.get("mode", "auto")
    raise invalid(
        "tool_choice must be none, auto, required or {type: function, name}", "tool_choice"
    )


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    """``text.format`` in Chat Completions' ``response_format`` form."""
    fmt = body.text.format if body.text else None
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise invalid("text.format of type json_schema needs a schema object", "text.format")
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return dict(fmt)


def prepare(
    svc: GenerationService,
    body: ResponsesRequest,
    extras: dict[str, Any],
    history: list[dict[str, Any]],
) -> Prepared:
    """Check a Responses request and prepare its generation (preparation pool)."""
    if body.background:
        raise invalid("background responses are not supported by this server", "background")
    if body.n != 1:
        raise invalid("n is not a Responses API field", "n")
    given = item_conv.as_items(body.input)
    if not given and not history:
        raise invalid("input must not be empty", "input")
    tools, namespaces = item_conv.template_tools(body.tools)
    choice = _tool_choice(body.tool_choice)
    chat = ChatCompletionRequest(
        messages=[],
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=_response_format(body),
        chat_template_kwargs=body.chat_template_kwargs,
    )
    convert.check_chat_fields(chat)
    parts: list[MediaPart] = []
    media = svc.runtime.media
    messages = item_conv.chat_messages(history, media, parts, field="previous_response_id")
    messages += item_conv.chat_messages(given, media, parts)
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
    sampling = convert.sampling_params(
        body, vocab_size=len(svc.runtime.tokenizer), logprobs=False, top_logprobs=0
    )
    try:
        constraint = convert.constraint(chat)
    except APIError as exc:
        if exc.param == "response_format":
            exc.param = "text.format"
        raise
    spec = RequestSpec(
        prompt=ChatPrompt(
            messages, tools if choice != "none" and tools else None, _template_kwargs(body), parts
        ),
        sampling=sampling,
        new_id=lambda: new_id("resp").replace("-", "_"),
        max_tokens=body.max_output_tokens,
        default_max_tokens=svc.config.default_max_tokens,
        max_tokens_field="max_output_tokens",
        extras=extras,
        constraint=constraint,
        thinking_budget=_effort_budget(body),
        priority=body.priority,
        cache_salt=body.cache_salt,
    )
    (generation,) = builder.build_generations(svc.runtime, spec)
    return Prepared(generation, _with_ids(given), namespaces)


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def base_response(body: ResponsesRequest, rid: str, model: str, tools: Any) -> dict[str, Any]:
    """The response object before any output (``status: in_progress``)."""
    text = {"format": (body.text.format if body.text and body.text.format else {"type": "text"})}
    reasoning = {"effort": body.reasoning.effort if body.reasoning else None, "summary": None}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": reasoning,
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": tools,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled",
        "usage": None,
        "metadata": body.metadata or {},
        "user": body.user,
        "prompt_cache_key": body.prompt_cache_key,
    }


def _final(
    svc: GenerationService,
    response: dict[str, Any],
    writer: OutputWriter,
    gen: Generation,
    finish: str | None,
) -> dict[str, Any]:
    """The finished response object (status from the finish reason)."""
    out = dict(response)
    out["output"] = writer.output
    out["usage"] = _usage(gen.usage)
    out["completed_at"] = int(time.time())
    if finish == "length":
        out["status"] = "incomplete"
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish == "cancelled":
        out["status"] = "cancelled"
    else:
        out["status"] = "completed"
    return out


@post(
    "/v1/responses",
    status_code=200,
    opt={
        BODY_OPTION: ResponsesRequest,
        REPLIES_OPTION: {200: reply("the response", RESPONSE, events=RESPONSE_EVENTS)},
    },
)
async def create_response(request: Request[Any, Any, Any]) -> Any:
    """OpenAI Responses: create a model response."""
    body, extras = await decode_request(request, ResponsesRequest)
    svc = await model_service(request, body.model)
    store = store_of(request)
    owner = current_owner()
    history: list[dict[str, Any]] = []
    if body.previous_response_id:
        history = store.conversation(body.previous_response_id, "previous_response_id", owner)
    prepared = await svc.prepare(prepare, svc, body, extras, history)
    gen = prepared.generation
    deltas = await unless_disconnected(request, svc.start(gen))
    model = served_name(svc, body.model)
    rid = gen.request.request_id
    response = base_response(body, rid, model, body.tools or [])
    running = running_of(request)
    running[owned(rid)] = Running(response, gen)
    encrypted = "reasoning.encrypted_content" in (body.include or [])
    writer = OutputWriter(namespaces=prepared.namespaces, encrypted_reasoning=encrypted)

    def finished(finish: str | None) -> dict[str, Any]:
        running.pop((owner, rid), None)
        final = _final(svc, response, writer, gen, finish)
        if body.store:  # instructions are per request: never carried to the next turn
            store.put(final, prepared.input_items, writer.output, body.previous_response_id, owner)
        return final

    if body.stream:
        return _stream(writer, response, deltas, finished, lambda: running.pop((owner, rid), None))
    try:
        collected = await unless_disconnected(request, _all(deltas))
    finally:
        running.pop((owner, rid), None)
    finish = None
    for delta in collected:
        writer.write(delta)
        finish = delta.finish_reason or finish
    writer.finish(finish == "length")
    return finished(finish)


async def _all(deltas: AsyncIterator[OutputDelta]) -> list[OutputDelta]:
    return [d async for d in deltas]


def _stream(
    writer: OutputWriter,
    response: dict[str, Any],
    deltas: AsyncIterator[OutputDelta],
    finished: Any,
    forget: Any,
) -> EventStream:
    async def events() -> AsyncIterator[bytes]:
        try:
            writer.emit({"type": "response.created", "response": dict(response)})
            writer.emit({"type": "response.in_progress", "response": dict(response)})
            for chunk in writer.drain():
                yield chunk
            finish = None
            async for delta in deltas:
                writer.write(delta)
                finish = delta.finish_reason or finish
                for chunk in writer.drain():
                    yield chunk
            writer.finish(finish == "length")
            final = finished(finish)
            kind = {"incomplete": "response.incomplete", "cancelled": "response.cancelled"}
            writer.emit(
                {"type": kind.get(final["status"], "response.completed"), "response": final}
            )
            for chunk in writer.drain():
                yield chunk
        finally:
            forget()

    def error_frame(err: APIError) -> bytes:
        failed = dict(
            response, status="failed", error={"code": err.code or err.type, "message": err.message}
        )
        writer.emit(
            {
                "type": "error",
                "code": err.code or err.type,
                "message": err.message,
                "param": err.param,
            }
        )
        writer.emit({"type": "response.failed", "response": failed})
        return b"".join(writer.drain())

    return event_stream(events(), error_frame)


@route(
    "/v1/responses/{response_id:str}",
    http_method=["GET", "DELETE"],
    status_code=200,
    opt={REPLIES_OPTION: {200: reply("the response, or its deletion", STORED_OR_DELETED)}},
)
async def stored_response(request: Request[Any, Any, Any], response_id: str) -> dict[str, Any]:
    """``GET``: a stored response (or one still running, as it stands). ``DELETE``: forget
    a stored response. (One handler for both: Litestar's ``Allow`` header lists the
    methods of the first handler of a path only.)"""
    owner = current_owner()
    if request.method == "DELETE":
        store_of(request).delete(response_id, owner)
        return {"id": response_id, "object": "response.deleted", "deleted": True}
    current = running_of(request).get(owned(response_id))
    if current is not None:
        return current.response
    return store_of(request).get(response_id, owner=owner).response


@post(
    "/v1/responses/{response_id:str}/cancel",
    status_code=200,
    opt={
        ERRORS_OPTION: {409: "the response is not in progress (only a running one can stop)"},
        REPLIES_OPTION: {200: reply("the response, cancelled", RESPONSE)},
    },
)
async def cancel_response(request: Request[Any, Any, Any], response_id: str) -> dict[str, Any]:
    """Stop a response that is still being generated; it ends as ``cancelled``."""
    current = running_of(request).get(owned(response_id))
    if current is None:
        store_of(request).get(response_id, owner=current_owner())  # 404 when unknown
        raise APIError(
            409,
            "only a response still in progress can be cancelled",
            param="response_id",
            code="conflict",
        )
    if current.generation.handle is not None:
        current.generation.handle.cancel()
    return dict(current.response, status="cancelled")


@get(
    "/v1/responses/{response_id:str}/input_items",
    opt={
        REPLIES_OPTION: {200: reply("a page of input items", INPUT_ITEMS)},
        QUERY_OPTION: {
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
            "order": {"enum": ["asc", "desc"], "default": "desc"},
            "after": {"type": "string", "description": "the id of the item to list after"},
        },
    },
)
async def list_input_items(
    request: Request[Any, Any, Any],
    response_id: str,
    limit: int = 20,
    order: str = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The items a stored response was given (its own input, not earlier turns')."""
    if not 1 <= limit <= 100:
        raise invalid("limit must be between 1 and 100", "limit")
    if order not in ("asc", "desc"):
        raise invalid("order must be asc or desc", "order")
    data = list(store_of(request).get(response_id, owner=current_owner()).input_items)
    if order == "desc":
        data.reverse()
    if after is not None:
        ids = [item.get("id") for item in data]
        if after not in ids:
            raise not_found(after, "after")
        data = data[ids.index(after) + 1 :]
    page = data[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(data) > limit,
    }


ROUTES = [create_response, stored_response, cancel_response, list_input_items]
"""Every Responses API route handler."""
