"""``POST /v1/chat/completions``: stream and non-stream, tools, reasoning, logprobs, n."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post

from mlxcore import request_builder as builder
from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.encode import (
    SSE_DONE,
    LogprobEncoder,
    new_id,
    now,
    openai_stream,
    running_usage,
    sse,
    tool_call_body,
    tool_call_part,
    usage_body,
)
from mlxcore.builtin.openai.replies import CHAT_COMPLETION, CHAT_EVENTS
from mlxcore.builtin.openai.schemas import ChatCompletionRequest, StreamOptions
from mlxcore.output import OutputDelta
from mlxcore.output.calls import CallStream
from mlxcore.request_builder import ChatPrompt, RequestSpec
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.frontend import (
    decode_request,
    model_service,
    served_name,
)
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import Generation, GenerationService, collect, merge_streams


def request_spec(
    svc: GenerationService, body: ChatCompletionRequest, extras: dict[str, Any]
) -> RequestSpec:
    """Check the fields only Chat Completions has and describe the request for the
    shared builder; ``extras`` are the body's fields outside the schema, for plugins."""
    convert.check_chat_fields(body)
    messages, media_parts = convert.normalize_chat(body.messages, svc.runtime.media)
    top = body.top_logprobs or 0
    if top and not body.logprobs:
        raise convert.invalid("top_logprobs requires logprobs: true", "top_logprobs")
    use_completion = body.max_completion_tokens is not None
    sampling = convert.sampling_params(
        body,
        vocab_size=len(svc.runtime.tokenizer),
        logprobs=body.logprobs,
        top_logprobs=top,
        prompt_logprobs=body.prompt_logprobs,
    )
    return RequestSpec(
        prompt=ChatPrompt(
            messages,
            body.tools if body.tool_choice != "none" else None,
            dict(body.chat_template_kwargs or {}),
            media_parts,
        ),
        sampling=sampling,
        new_id=lambda: new_id("chatcmpl"),
        max_tokens=body.max_completion_tokens if use_completion else body.max_tokens,
        default_max_tokens=svc.config.default_max_tokens,
        max_tokens_field="max_completion_tokens" if use_completion else "max_tokens",
        stops=convert.stop_list(body.stop),
        stop_token_ids=body.stop_token_ids or (),
        extras=extras,
        constraint=convert.constraint(body),
        n=body.n,
        thinking_budget=convert.thinking_budget(body),
        priority=body.priority,
        cache_salt=body.cache_salt,
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )


def build_generations(
    svc: GenerationService, body: ChatCompletionRequest, extras: dict[str, Any]
) -> list[Generation]:
    """One :class:`Generation` per choice (``n``) of a chat completion request."""
    return builder.build_generations(svc.runtime, request_spec(svc, body, extras))


@post(
    "/v1/chat/completions",
    status_code=200,
    opt={
        BODY_OPTION: ChatCompletionRequest,
        REPLIES_OPTION: {200: reply("the completion", CHAT_COMPLETION, events=CHAT_EVENTS)},
    },
)
async def chat_completions(request: Request[Any, Any, Any]) -> Any:
    """OpenAI chat completions."""
    body, options = await decode_request(request, ChatCompletionRequest)
    svc = await model_service(request, body.model)
    gens = await svc.prepare(build_generations, svc, body, options)
    streams = await unless_disconnected(request, svc.start_all(gens))
    model = served_name(svc, body.model)
    logprobs = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs else None
    scored = None if body.prompt_logprobs is None else LogprobEncoder(svc.runtime.tokenizer)
    if body.stream:
        stream_options = body.stream_options or StreamOptions()
        return openai_stream(_stream(gens, streams, model, logprobs, stream_options, scored))
    answer = await unless_disconnected(request, _complete(gens, streams, model, logprobs))
    if scored is not None:  # vLLM's extra: the prompt is the same for every choice
        answer["prompt_logprobs"] = scored.vllm_prompt(gens[0].prompt_logprobs or [])
    return Response(answer)


async def _complete(
    gens: list[Generation],
    streams: list[AsyncIterator[OutputDelta]],
    model: str,
    logprobs: LogprobEncoder | None,
) -> dict[str, Any]:
    results = await asyncio.gather(*(collect(s) for s in streams))
    choices = []
    for index, out in enumerate(results):
        message: dict[str, Any] = {"role": "assistant", "content": out.content or None}
        if out.reasoning:
            message["reasoning_content"] = out.reasoning
        if out.tool_calls:
            message["tool_calls"] = [tool_call_body(c, i) for i, c in enumerate(out.tool_calls)]
        elif message["content"] is None:
            message["content"] = ""
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": logprobs.chat(out.logprobs) if logprobs else None,
                "finish_reason": out.finish_reason,
            }
        )
    return {
        "id": gens[0].request.request_id,
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage_body([g.usage for g in gens]),
    }


async def _stream(
    gens: list[Generation],
    streams: list[AsyncIterator[OutputDelta]],
    model: str,
    logprobs: LogprobEncoder | None,
    options: StreamOptions,
    scored: LogprobEncoder | None = None,
) -> AsyncIterator[bytes]:
    rid, created = gens[0].request.request_id, now()

    def chunk(
        index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None, **extra: Any
    ) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }
        if options.continuous_usage_stats:
            body["usage"] = running_usage(gens)
        return sse({**body, **extra})

    for index in range(len(gens)):
        yield chunk(index, {"role": "assistant", "content": ""})
    calls = [CallStream() for _ in gens]
    async for index, d in merge_streams(streams):
        if scored is not None and index == 0:  # once the prefill scored the prompt
            yield chunk(0, {}, prompt_logprobs=scored.vllm_prompt(gens[0].prompt_logprobs or []))
            scored = None
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        lp = logprobs.chat(d.logprobs) if logprobs and d.logprobs else None
        if delta or lp is not None:
            yield chunk(index, delta, None, lp)
        for event in calls[index].events(d):
            # as OpenAI streams them: id and name first, then argument fragments
            part = tool_call_part(event)
            if part is not None:
                yield chunk(index, {"tool_calls": [part]})
        if d.finish_reason is not None:
            yield chunk(index, {}, d.finish_reason)
    if options.include_usage:
        usage = usage_body([g.usage for g in gens])
        yield sse(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
    yield SSE_DONE
