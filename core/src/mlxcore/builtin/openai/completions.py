"""``POST /v1/completions`` (raw text in, text out) and ``GET /v1/models``."""

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
    usage_body,
)
from mlxcore.builtin.openai.replies import TEXT_COMPLETION, TEXT_EVENTS
from mlxcore.builtin.openai.schemas import CompletionRequest, StreamOptions
from mlxcore.output import OutputDelta
from mlxcore.request_builder import RequestSpec, TextPrompt
from mlxcore.server.errors import invalid
from mlxcore.server.frontend import (
    decode_request,
    model_service,
    served_name,
    unless_disconnected,
)
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import Generation, GenerationService, collect, merge_streams


def _prompt(prompt: str | list[str | int]) -> TextPrompt:
    if isinstance(prompt, str):
        return TextPrompt(text=prompt)
    ids = [p for p in prompt if isinstance(p, int)]
    if prompt and len(ids) == len(prompt):
        return TextPrompt(ids=ids)
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return TextPrompt(text=prompt[0])
    raise invalid("prompt must be a string, a one-string list or a list of token ids", "prompt")


def request_spec(
    svc: GenerationService, body: CompletionRequest, extras: dict[str, Any]
) -> RequestSpec:
    """Check the fields only text completions have and describe the request for the
    shared builder (raw text out: no reasoning or tool parsing)."""
    if body.suffix:
        raise invalid("suffix is not supported", "suffix")
    prompt = _prompt(body.prompt)
    top = body.logprobs or 0
    if not 0 <= top <= convert.MAX_TOP_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {convert.MAX_TOP_LOGPROBS}", "logprobs")
    sampling = convert.sampling_params(
        body,
        vocab_size=len(svc.runtime.tokenizer),
        logprobs=body.logprobs is not None,
        top_logprobs=top,
    )
    return RequestSpec(
        prompt=prompt,
        sampling=sampling,
        constraint=convert.output_constraint(body),  # vLLM's extension to completions
        new_id=lambda: new_id("cmpl"),
        max_tokens=body.max_tokens,
        default_max_tokens=16,  # OpenAI's default for this API
        stops=convert.stop_list(body.stop),
        stop_token_ids=body.stop_token_ids or (),
        extras=extras,
        n=body.n,
        parse=False,
    )


def build_generations(
    svc: GenerationService, body: CompletionRequest, extras: dict[str, Any]
) -> list[Generation]:
    """One generation per choice of a text completion request."""
    return builder.build_generations(svc.runtime, request_spec(svc, body, extras))


@post(
    "/v1/completions",
    status_code=200,
    opt={
        BODY_OPTION: CompletionRequest,
        REPLIES_OPTION: {200: reply("the completion", TEXT_COMPLETION, events=TEXT_EVENTS)},
    },
)
async def completions(request: Request[Any, Any, Any]) -> Any:
    """OpenAI (legacy) text completions."""
    body, options = await decode_request(request, CompletionRequest)
    svc = await model_service(request, body.model)
    gens = await svc.prepare(build_generations, svc, body, options)
    echo = ""
    if body.echo:
        echo = await svc.prepare(svc.runtime.tokenizer.decode, list(gens[0].request.prompt_tokens))
    streams = await unless_disconnected(request, svc.start_all(gens))
    model = served_name(svc, body.model)
    lp = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs is not None else None
    if body.stream:
        stream_options = body.stream_options or StreamOptions()
        return openai_stream(_stream(gens, streams, model, lp, stream_options, echo))
    results = await unless_disconnected(request, asyncio.gather(*(collect(s) for s in streams)))
    choices = [
        {
            "index": i,
            "text": echo + out.content,
            "logprobs": lp.completion(out.logprobs) if lp else None,
            "finish_reason": out.finish_reason,
        }
        for i, out in enumerate(results)
    ]
    return Response(
        {
            "id": gens[0].request.request_id,
            "object": "text_completion",
            "created": now(),
            "model": model,
            "choices": choices,
            "usage": usage_body([g.usage for g in gens]),
        }
    )


async def _stream(
    gens: list[Generation],
    streams: list[AsyncIterator[OutputDelta]],
    model: str,
    lp: LogprobEncoder | None,
    options: StreamOptions,
    echo: str,
) -> AsyncIterator[bytes]:
    rid, created = gens[0].request.request_id, now()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model}
        if options.continuous_usage_stats and "usage" not in extra:
            body["usage"] = running_usage(gens)
        return sse({**body, "choices": choices, **extra})

    if echo:
        for i in range(len(gens)):
            yield chunk([{"index": i, "text": echo, "logprobs": None, "finish_reason": None}])
    async for index, d in merge_streams(streams):
        if d.content or d.logprobs or d.finish_reason:
            logprobs = lp.completion(d.logprobs) if lp and d.logprobs else None
            choice = {
                "index": index,
                "text": d.content,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
            }
            yield chunk([choice])
    if options.include_usage:
        yield chunk([], usage=usage_body([g.usage for g in gens]))
    yield SSE_DONE
