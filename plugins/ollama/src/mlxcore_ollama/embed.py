"""``POST /api/embed`` (inputs to vectors, L2-normalised as Ollama returns them) and the
older ``POST /api/embeddings`` (one prompt, one vector as the model gives it)."""

from __future__ import annotations

import math
import time
from typing import Any

from litestar import Request, post

from mlxcore.builtin.openai.embeddings import check_dimensions
from mlxcore.builtin.openai.embeddings import embed as embed_job
from mlxcore.request_builder import check_prompt_size
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import decode_body
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import GenerationService
from mlxcore_ollama import models
from mlxcore_ollama.replies import EMBED, EMBEDDING
from mlxcore_ollama.schemas import MAX_INPUTS, EmbeddingsRequest, EmbedRequest

"""Most inputs in one request (as the OpenAI route)."""


def _token_ids(svc: GenerationService, texts: list[str], truncate: bool) -> list[list[int]]:
    """Each input's tokens; one longer than the context is cut (``truncate``) or a 400."""
    limit = svc.context_length
    out = []
    for i, text in enumerate(texts):
        field = f"input[{i}]"
        check_prompt_size(svc.runtime, len(text), field)
        ids = list(svc.runtime.tokenizer.encode(text)) or list(svc.runtime.tokenizer.encode(" "))
        if limit is not None and len(ids) > limit:
            if not truncate:
                raise APIError(
                    400,
                    f"{field} has {len(ids)} tokens, more than the model's context of {limit}",
                    code="context_length_exceeded",
                )
            ids = ids[:limit]
        out.append(ids)
    return out


async def _vectors(
    request: Request[Any, Any, Any],
    svc: GenerationService,
    texts: list[str],
    truncate: bool,
    dimensions: int | None,
) -> tuple[list[list[float]], int]:
    """The embeddings of ``texts`` and their token count, computed as an engine job."""
    inputs = await svc.prepare(_token_ids, svc, texts, truncate)
    vectors = await embed_job(request, svc, inputs, dimensions)
    return vectors, sum(len(ids) for ids in inputs)


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


@post(
    "/embed",
    status_code=200,
    opt={BODY_OPTION: EmbedRequest, REPLIES_OPTION: {200: reply("the vectors", EMBED)}},
)
async def embed(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama embed: one normalised vector per input, in order."""
    started = time.perf_counter()
    body = await decode_body(request, EmbedRequest)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    if not texts:
        raise invalid("input must not be empty", "input")
    if len(texts) > MAX_INPUTS:
        raise invalid(f"at most {MAX_INPUTS} inputs per request, got {len(texts)}", "input")
    svc = await models.service(request, body.model, task=None)
    if svc.adapter is not None:
        raise invalid("a LoRA adapter has no embeddings of its own: use the base model", "model")
    check_dimensions(svc, body.dimensions)
    vectors, tokens = await _vectors(request, svc, texts, body.truncate, body.dimensions)
    return {
        "model": body.model,
        "embeddings": [_normalised(v) for v in vectors],
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }


@post(
    "/embeddings",
    status_code=200,
    opt={BODY_OPTION: EmbeddingsRequest, REPLIES_OPTION: {200: reply("the vector", EMBEDDING)}},
)
async def embeddings(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama's older embeddings route: one prompt (an empty one: an empty vector)."""
    body = await decode_body(request, EmbeddingsRequest)
    svc = await models.service(request, body.model, task=None)
    if not body.prompt:
        return {"embedding": []}
    vectors, _ = await _vectors(request, svc, [body.prompt], True, None)
    return {"embedding": vectors[0]}


HANDLERS = [embed, embeddings]
