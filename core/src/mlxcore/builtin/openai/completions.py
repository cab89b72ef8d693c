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
from mlxcore.builtin.openai.schemas import MAX_PROMPTS, CompletionRequest, StreamOptions
from mlxcore.output import OutputDelta
from mlxcore.request_builder import RequestSpec, TextPrompt
from mlxcore.server.disconnect import unless_disconnected
from mlxcore.server.errors import invalid
from mlxcore.server.frontend import (
    decode_request,
    model_service,
    served_name,
)
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import Generation, GenerationService, collect, merge_streams


def _prompts(prompt: str | list[Any]) -> list[TextPrompt]:
    """The request's prompts: one string, one list of token ids, or several of either."""
    if isinstance(prompt, str):
        return [TextPrompt(text=prompt)]
    if prompt and all(_is_token(p) for p in prompt):
        return [TextPrompt(ids=prompt)]
    if len(prompt) > MAX_PROMPTS:
        raise invalid(f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", "prompt")
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, str) and item:
            out.append(TextPrompt(text=item, field=f"prompt[{i}]"))
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(TextPrompt(ids=item, field=f"prompt[{i}]"))
        else:
            raise invalid(
                "prompt must be a string, token ids, or a list of strings or of token-id lists",
                f"prompt[{i}]",
            )
    kinds = {type(p.text) for p in out}
    if len(kinds) > 1:
        raise invalid("prompts must be all strings or all token-id lists", "prompt")
    return out


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def request_specs(
    svc: GenerationService, body: CompletionRequest, extras: dict[str, Any]
) -> list[RequestSpec]:
    """Check the fields only text completions have and describe each prompt's request
    for the shared builder (raw text out: no reasoning or tool parsing)."""
    if body.suffix:
        raise invalid("suffix is not supported", "suffix")
    prompts = _prompts(body.prompt)
    top = body.logprobs or 0
    if not 0 <= top <= convert.MAX_TOP_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {convert.MAX_TOP_LOGPROBS}", "logprobs")
    scored = body.prompt_logprobs
    if body.echo and body.logprobs is not None:  # the echoed prompt carries logprobs too
        scored = max(top, scored or 0)
    sampling = convert.sampling_params(
        body,
        vocab_size=len(svc.runtime.tokenizer),
        logprobs=body.logprobs is not None,
        top_logprobs=top,
        prompt_logprobs=scored,
    )
    constraint = convert.output_constraint(body)  # vLLM's extension to completions
    return [
        RequestSpec(
            prompt=prompt,
            sampling=sampling,
            constraint=constraint,
            new_id=lambda: new_id("cmpl"),
            max_tokens=body.max_tokens,
            default_max_tokens=16,  # OpenAI's default for this API
            stops=convert.stop_list(body.stop),
            stop_token_ids=body.stop_token_ids or (),
            extras=extras,
            n=body.n,
            parse=False,
            priority=body.priority,
            cache_salt=body.cache_salt,
        )
        for prompt in prompts
    ]


def build_generations(
    svc: GenerationService, body: CompletionRequest, extras: dict[str, Any]
) -> list[Generation]:
    """The generations of a text completion request: ``n`` per prompt, in order (the
    choice ``index`` is the position in this list, as OpenAI numbers them)."""
    return [
        gen
        for spec in request_specs(svc, body, extras)
        for gen in builder.build_generations(svc.runtime, spec)
    ]


@post(
    "/v1/completions",
    status_code=200,
    opt={
        BODY_OPTION: CompletionRequest,
        REPLIES_OPTION: {200: reply("the completion", TEXT_COMPLETION, events=TEXT_EVENTS)},
    },
)
async def completions(request: Request[Any, Any, Any]) -> Any:
    """OpenAI (legacy) text completions: one or several prompts, ``n`` choices each."""
    body, options = await decode_request(request, CompletionRequest)
    svc = await model_service(request, body.model)
    gens = await svc.prepare(build_generations, svc, body, options)
    echo = None
    if body.echo or body.prompt_logprobs is not None:
        echo = Echo(svc.runtime.tokenizer, body)
        await svc.prepare(echo.prepare, gens)
    streams = await unless_disconnected(request, svc.start_all(gens))
    model = served_name(svc, body.model)
    lp = LogprobEncoder(svc.runtime.tokenizer) if body.logprobs is not None else None
    if body.stream:
        stream_options = body.stream_options or StreamOptions()
        return openai_stream(_stream(gens, streams, model, lp, stream_options, echo, body.n))
    results = await unless_disconnected(request, asyncio.gather(*(collect(s) for s in streams)))
    choices = []
    for i, (gen, out) in enumerate(zip(gens, results, strict=True)):
        choice = {
            "index": i,
            "text": out.content,
            "logprobs": lp.completion(out.logprobs) if lp else None,
        }
        if echo is not None:
            await echo.add_to(choice, gen)
        choices.append({**choice, "finish_reason": out.finish_reason})
    return Response(
        {
            "id": gens[0].request.request_id,
            "object": "text_completion",
            "created": now(),
            "model": model,
            "choices": choices,
            "usage": prompts_usage(gens, body.n),
        }
    )


def prompts_usage(gens: list[Generation], n: int) -> dict[str, Any]:
    """``usage`` over every prompt (each prompt's tokens counted once, not per choice)."""
    groups = [usage_body([g.usage for g in gens[i : i + n]]) for i in range(0, len(gens), n)]
    total = groups[0]
    for other in groups[1:]:
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            total[key] += other[key]
        total["prompt_tokens_details"]["cached_tokens"] += other["prompt_tokens_details"][
            "cached_tokens"
        ]
        total["completion_tokens_details"]["reasoning_tokens"] += other[
            "completion_tokens_details"
        ]["reasoning_tokens"]
    return total


class Echo:
    """What a choice adds about its prompt: the prompt text (``echo``), with its tokens'
    logprobs in the legacy shape when ``logprobs`` is set, and vLLM's
    ``prompt_logprobs``. The prompt logprobs come from the prefill (the first tokens'
    event), so they are added once the generation has started."""

    def __init__(self, tokenizer: Any, body: CompletionRequest) -> None:
        self.encoder = LogprobEncoder(tokenizer)
        self.tokenizer = tokenizer
        self.text = body.echo
        self.legacy = body.echo and body.logprobs is not None
        self.vllm = body.prompt_logprobs is not None
        self.texts: dict[tuple[int, ...], str] = {}

    def prepare(self, gens: list[Generation]) -> None:
        """Decode each prompt once (preparation pool)."""
        if self.text:
            for gen in gens:
                key = gen.request.prompt_tokens
                if key not in self.texts:
                    self.texts[key] = self.tokenizer.decode(list(key))

    async def add_to(self, choice: dict[str, Any], gen: Generation) -> None:
        """Prefix the choice's text (and logprobs) with its prompt's; add
        ``prompt_logprobs`` (computed once for the ``n`` choices of a prompt: a choice
        waits for its first sibling's)."""
        prompt = gen.request.prompt_tokens
        scores = await gen.prompt_scores() if self.legacy or self.vllm else None
        if self.text:
            choice["text"] = self.texts[prompt] + choice["text"]
        if self.legacy:
            head = self.encoder.echoed_prompt(prompt, scores)
            tail = choice["logprobs"]
            if tail:
                for key in ("tokens", "token_logprobs", "top_logprobs"):
                    head[key] += tail[key]
            choice["logprobs"] = head
        if self.vllm:
            choice["prompt_logprobs"] = self.encoder.vllm_prompt(scores or [])


async def _stream(
    gens: list[Generation],
    streams: list[AsyncIterator[OutputDelta]],
    model: str,
    lp: LogprobEncoder | None,
    options: StreamOptions,
    echo: Echo | None,
    n: int,
) -> AsyncIterator[bytes]:
    rid, created = gens[0].request.request_id, now()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model}
        if options.continuous_usage_stats and "usage" not in extra:
            body["usage"] = running_usage(gens)
        return sse({**body, "choices": choices, **extra})

    echoed: set[int] = set()
    async for index, d in merge_streams(streams):
        if echo is not None and index not in echoed:  # the prompt first, once it is scored
            echoed.add(index)
            head: dict[str, Any] = {"index": index, "text": "", "logprobs": None}
            await echo.add_to(head, gens[index])
            yield chunk([{**head, "finish_reason": None}])
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
        yield chunk([], usage=prompts_usage(gens, n))
    yield SSE_DONE
