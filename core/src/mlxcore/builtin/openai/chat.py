"""``POST /v1/chat/completions``: stream and non-stream, tools, reasoning, logprobs, n."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
from litestar import Request, Response, post

from mlxcore import structured
from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.encode import (
    SSE_DONE,
    LogprobEncoder,
    new_id,
    now,
    openai_stream,
    sse,
    tool_call_body,
    tool_call_head,
    usage_body,
)
from mlxcore.builtin.openai.schemas import ChatCompletionRequest
from mlxcore.engine.request import GenerationRequest
from mlxcore.output import OutputDelta
from mlxcore.server.requests import (
    body_extras,
    check_model,
    decode_body,
    served_name,
    service_of,
    unless_disconnected,
    validated_options,
)
from mlxcore.server.service import Generation, GenerationService, collect

KNOWN_FIELDS = frozenset(ChatCompletionRequest.__struct_fields__)


def build_generations(
    svc: GenerationService, body: ChatCompletionRequest, options: dict[str, Any]
) -> list[Generation]:
    """Validate ``body`` and prepare one :class:`Generation` per choice (``n``);
    ``options`` are the body's extra fields, for plugins."""
    convert.check_chat_fields(body)
    media = svc.runtime.media
    messages, media_parts = convert.normalize_chat(body.messages, media)
    tools = body.tools if body.tool_choice != "none" else None
    kwargs = dict(body.chat_template_kwargs or {})
    rendered = svc.chat_prompt(messages, tools, kwargs)
    prompt_text, prompt = rendered.text, rendered.ids
    checkpoints = rendered.checkpoints()
    plugin_options = validated_options(svc, _plugin_options(options))
    payload = cache_key = None
    if media_parts:  # expand the media placeholders before the prompt length counts
        prepared = media.prepare(prompt_text, media_parts, plugin_options)
        prompt, payload, checkpoints = prepared.ids, prepared.payload, ()
        cache_key = None if prepared.cache_key is None else tuple(prepared.cache_key)
    top = body.top_logprobs or 0
    if top and not body.logprobs:
        raise convert.invalid("top_logprobs requires logprobs: true", "top_logprobs")
    use_completion = body.max_completion_tokens is not None
    budget = convert.max_tokens(
        body.max_completion_tokens if use_completion else body.max_tokens,
        svc.config.max_tokens_default,
        svc.context_length,
        "max_completion_tokens" if use_completion else "max_tokens",
        prompt_len=len(prompt),
    )
    sampling = convert.sampling_params(
        body,
        vocab_size=len(svc.runtime.tokenizer),
        logprobs=body.logprobs,
        top_logprobs=top,
    )
    stops = convert.stop_list(body.stop)
    thinks = (
        svc.runtime.parsers.reasoning is not None and kwargs.get("enable_thinking") is not False
    )
    forced_options, forced_parser = convert.constraint_options(body, thinks=thinks)
    options = {**plugin_options, **forced_options}
    gens = []
    for i in range(body.n):
        params = sampling
        if i and sampling.seed is not None:
            params = attrs.evolve(sampling, seed=(sampling.seed + i) & (2**64 - 1))
        req = GenerationRequest(
            prompt_tokens=tuple(prompt),
            checkpoints=checkpoints,
            max_tokens=budget,
            sampling=params,
            options=options,
            request_id=new_id("chatcmpl"),
            media=payload,
            cache_key=cache_key,
        )
        svc.validate(req)
        pipe = svc.pipeline(
            stops=stops,
            tools=tools,
            prompt_text=prompt_text,
            tool_parser=forced_parser() if forced_parser else None,
        )
        gens.append(Generation(req, pipe))
    return gens


def _plugin_options(extras: dict[str, Any]) -> dict[str, Any]:
    """Body extras minus the keys the front end itself sets (never client-controlled)."""
    reserved = (structured.OPTION, structured.START_AFTER_OPTION)
    return {k: v for k, v in extras.items() if k not in reserved}


@post("/v1/chat/completions", status_code=200, opt={"body": ChatCompletionRequest})
async def chat_completions(request: Request[Any, Any, Any]) -> Any:
    """OpenAI chat completions."""
    svc = service_of(request)
    body = await decode_body(request, ChatCompletionRequest)
    options = await body_extras(request, KNOWN_FIELDS)
    check_model(svc, body.model)
    gens = await svc.prepare(build_generations, svc, body, options)
    streams = await unless_disconnected(request, svc.start_all(gens))
    model = served_name(svc, body.model)
    logprobs = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs else None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return openai_stream(_stream(gens, streams, model, logprobs, include_usage))
    return Response(await unless_disconnected(request, _complete(gens, streams, model, logprobs)))


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
    include_usage: bool,
) -> AsyncIterator[bytes]:
    rid, created = gens[0].request.request_id, now()

    def chunk(
        index: int, delta: dict[str, Any], finish: str | None = None, lp: Any = None
    ) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return sse(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
        )

    for index in range(len(gens)):
        yield chunk(index, {"role": "assistant", "content": ""})
    tool_index = [0] * len(gens)
    async for index, d in _merge(streams):
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        lp = logprobs.chat(d.logprobs) if logprobs and d.logprobs else None
        if delta or lp is not None:
            yield chunk(index, delta, None, lp)
        for call in d.tool_calls:
            # as OpenAI streams them: id and name first, then the argument text
            head, arguments = tool_call_head(call, tool_index[index])
            yield chunk(index, {"tool_calls": [head]})
            yield chunk(index, {"tool_calls": [arguments]})
            tool_index[index] += 1
        if d.finish_reason is not None:
            yield chunk(index, {}, d.finish_reason)
    if include_usage:
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


async def _merge(
    streams: list[AsyncIterator[OutputDelta]],
) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Interleave several delta streams, tagging each delta with its choice index."""
    if len(streams) == 1:
        async for d in streams[0]:
            yield 0, d
        return
    queue: asyncio.Queue[tuple[int, OutputDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[OutputDelta]) -> None:
        try:
            async for d in stream:
                await queue.put((index, d))
        except BaseException as exc:
            await queue.put((index, exc))
            return
        await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            index, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
