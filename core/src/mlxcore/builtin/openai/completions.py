"""``POST /v1/completions`` (raw text in, text out) and ``GET /v1/models``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
from litestar import Request, Response, get, post

from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.chat import _merge
from mlxcore.builtin.openai.encode import (
    SSE_DONE,
    LogprobEncoder,
    new_id,
    now,
    openai_stream,
    sse,
    usage_body,
)
from mlxcore.builtin.openai.schemas import CompletionRequest
from mlxcore.engine.request import GenerationRequest
from mlxcore.output import OutputDelta
from mlxcore.server.errors import invalid
from mlxcore.server.requests import (
    body_extras,
    check_model,
    decode_body,
    served_name,
    served_names,
    service_of,
    unless_disconnected,
    validated_options,
)
from mlxcore.server.service import Generation, GenerationService, collect


def _prompt_tokens(svc: GenerationService, prompt: str | list[str | int]) -> list[int]:
    if isinstance(prompt, str):
        return svc.encode(prompt)
    ids = [p for p in prompt if isinstance(p, int)]
    if prompt and len(ids) == len(prompt):
        vocab = len(svc.runtime.tokenizer)
        if any(not 0 <= t < vocab for t in ids):
            raise invalid("prompt token ids must be inside the vocabulary", "prompt")
        return ids
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return svc.encode(prompt[0])
    raise invalid("prompt must be a string, a one-string list or a list of token ids", "prompt")


KNOWN_FIELDS = frozenset(CompletionRequest.__struct_fields__)


def build_generations(
    svc: GenerationService, body: CompletionRequest, options: dict[str, Any]
) -> list[Generation]:
    """Validate ``body`` and prepare one generation per choice."""
    if body.suffix:
        raise invalid("suffix is not supported", "suffix")
    prompt = _prompt_tokens(svc, body.prompt)
    if not prompt:
        raise invalid("prompt must not be empty", "prompt")
    top = body.logprobs or 0
    if not 0 <= top <= convert.MAX_TOP_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {convert.MAX_TOP_LOGPROBS}", "logprobs")
    sampling = convert.sampling_params(
        body,
        vocab_size=len(svc.runtime.tokenizer),
        logprobs=body.logprobs is not None,
        top_logprobs=top,
    )
    budget = convert.max_tokens(
        body.max_tokens, 16, svc.context_length, prompt_len=len(prompt), prompt_param="prompt"
    )
    stops = convert.stop_list(body.stop)
    options = validated_options(svc, options)
    gens = []
    for i in range(body.n):
        params = sampling
        if i and sampling.seed is not None:
            params = attrs.evolve(sampling, seed=(sampling.seed + i) & (2**64 - 1))
        req = GenerationRequest(
            prompt_tokens=tuple(prompt),
            max_tokens=budget,
            sampling=params,
            options=options,
            request_id=new_id("cmpl"),
        )
        svc.validate(req)
        gens.append(Generation(req, svc.pipeline(stops=stops, parse=False)))
    return gens


@post("/v1/completions", status_code=200, opt={"body": CompletionRequest})
async def completions(request: Request[Any, Any, Any]) -> Any:
    """OpenAI (legacy) text completions."""
    svc = service_of(request)
    body = await decode_body(request, CompletionRequest)
    options = await body_extras(request, KNOWN_FIELDS)
    check_model(svc, body.model)
    gens = await svc.prepare(build_generations, svc, body, options)
    echo = ""
    if body.echo:
        echo = await svc.prepare(svc.runtime.tokenizer.decode, list(gens[0].request.prompt_tokens))
    streams = await unless_disconnected(request, svc.start_all(gens))
    model = served_name(svc, body.model)
    lp = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs is not None else None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return openai_stream(_stream(gens, streams, model, lp, include_usage, echo))
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
    include_usage: bool,
    echo: str,
) -> AsyncIterator[bytes]:
    rid, created = gens[0].request.request_id, now()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model}
        return sse({**body, "choices": choices, **extra})

    if echo:
        for i in range(len(gens)):
            yield chunk([{"index": i, "text": echo, "logprobs": None, "finish_reason": None}])
    async for index, d in _merge(streams):
        if d.content or d.logprobs or d.finish_reason:
            logprobs = lp.completion(d.logprobs) if lp and d.logprobs else None
            choice = {
                "index": index,
                "text": d.content,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
            }
            yield chunk([choice])
    if include_usage:
        yield chunk([], usage=usage_body([g.usage for g in gens]))
    yield SSE_DONE


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Every served name, with ``root`` = the resolved local model path (as vLLM reports)."""
    svc = service_of(request)
    root = str(svc.runtime.info.path)
    created = now()
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "mlxcore",
            "root": root,
            "parent": None,
        }
        for name in served_names(svc)
    ]
    return {"object": "list", "data": data}
