"""``POST /v1/embeddings`` in OpenAI's shape (see :mod:`mlxcore.embeddings` for how the
vectors are computed)."""

from __future__ import annotations

import base64
import struct
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, post

from mlxcore.builtin.openai.replies import EMBEDDING_LIST
from mlxcore.embeddings import EmbeddingError, hidden_size
from mlxcore.request_builder import check_prompt_size
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import decode_body, model_service, served_name
from mlxcore.server.openapi import (
    BODY_OPTION,
    CONTEXT_TOKENS_TITLE,
    DIMENSIONS_TITLE,
    REPLIES_OPTION,
    TOKEN_ID,
    reply,
)
from mlxcore.server.service import GenerationService

MAX_INPUTS = 2048
"""Most inputs in one request (OpenAI's limit)."""


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    # a string, strings, token ids, or lists of token ids: checked in :func:`_inputs`
    input: Annotated[
        Annotated[str, msgspec.Meta(min_length=1)]
        | Annotated[list[Any], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)],
        # one input's token ids, or inputs that are strings or lists of token ids (msgspec
        # takes one array type per union)
        msgspec.Meta(extra_json_schema={"allOf": [{"anyOf": [
            {"items": TOKEN_ID, "title": CONTEXT_TOKENS_TITLE},
            {"items": {"anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": TOKEN_ID, "title": CONTEXT_TOKENS_TITLE},
            ]}},
        ]}]}),
    ]  # fmt: skip
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1, title=DIMENSIONS_TITLE)] | None = None
    user: str | None = None


def _inputs(svc: GenerationService, body: EmbeddingRequest) -> list[list[int]]:
    """Token ids of every input; a 400 naming the input for anything wrong."""
    raw = body.input
    items: list[Any]
    if isinstance(raw, str):
        items = [raw]
    elif raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        items = [raw]  # one input given as token ids
    else:
        items = list(raw)
    if not items:
        raise invalid("input must not be empty", "input")
    if len(items) > MAX_INPUTS:
        raise invalid(f"at most {MAX_INPUTS} inputs per request, got {len(items)}", "input")
    vocab = svc.runtime.engine.limits.vocab_size
    limit = svc.context_length
    out: list[list[int]] = []
    for i, item in enumerate(items):
        field = f"input[{i}]" if len(items) > 1 or not isinstance(raw, str) else "input"
        if isinstance(item, str):
            if not item:
                raise invalid("an input must not be an empty string", field)
            check_prompt_size(svc.runtime, len(item), field)
            ids = list(svc.runtime.tokenizer.encode(item))
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            ids = list(item)
            if any(not 0 <= t < vocab for t in ids):
                raise invalid(f"token ids must be in [0, {vocab})", field)
        else:
            raise invalid("each input must be a non-empty string or list of token ids", field)
        if not ids:
            raise invalid("this input has no tokens", field)
        if limit is not None and len(ids) > limit:
            raise APIError(
                400,
                f"{field} has {len(ids)} tokens, more than the model's context of {limit}",
                param=field,
                code="context_length_exceeded",
            )
        out.append(ids)
    return out


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_dimensions(svc: GenerationService, dimensions: int | None) -> None:
    """A 400 unless ``dimensions`` (when given) is between 1 and the model's width."""
    if dimensions is None:
        return
    try:
        width = hidden_size(svc.runtime.model)
    except EmbeddingError as exc:
        raise invalid(str(exc), "model") from None
    if not 1 <= dimensions <= width:
        raise invalid(f"dimensions must be between 1 and {width} for this model", "dimensions")


async def embed(
    request: Request[Any, Any, Any],
    svc: GenerationService,
    inputs: list[list[int]],
    dimensions: int | None,
) -> list[list[float]]:
    """The vectors of ``inputs`` (token ids each), computed as an engine job: a 503 with
    Retry-After when the engine is full or restarting, a 400 when the model cannot embed;
    the job is cancelled when the client goes away. Every front end's embeddings."""
    work, cost = svc.runtime.embedding_work(inputs, pooling=svc.pooling, dimensions=dimensions)
    try:
        vectors: list[list[float]] = await svc.run_job(request, "embedding", work, cost)
    except EmbeddingError as exc:
        raise invalid(str(exc), "model") from None
    return vectors


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's client decodes it
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


@post(
    "/v1/embeddings",
    status_code=200,
    opt={
        BODY_OPTION: EmbeddingRequest,
        REPLIES_OPTION: {200: reply("the embeddings", EMBEDDING_LIST)},
    },
)
async def create_embeddings(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """OpenAI embeddings: one vector per input, in order."""
    body = await decode_body(request, EmbeddingRequest)
    svc = await model_service(request, body.model, task=None)
    if svc.adapter is not None:
        raise invalid(
            f"{body.model!r} is a LoRA adapter: embeddings come from the base model's name",
            "model",
        )
    check_dimensions(svc, body.dimensions)
    inputs = await svc.prepare(_inputs, svc, body)
    vectors = await embed(request, svc, inputs, body.dimensions)
    tokens = sum(len(ids) for ids in inputs)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": served_name(svc, body.model),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
