"""``/v1/rerank`` (also ``/rerank`` and ``/v2/rerank``: the Cohere and Jina shape that
vLLM, llama-server and oMLX accept) and vLLM's ``/score`` (also ``/v1/score``), for
rerankers (``task = "rerank"``, cross-encoders) and any model that generates.

Both validate everything and tokenize every pair (off the event loop) before the engine
runs the forward passes as one job between its decode steps (:mod:`.scoring` for decoder
rerankers, :mod:`.cross_encoder` for BERT cross-encoders); a client that hangs up stops
the job at its next pass.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec
from litestar import Request, post

from mlxcore.request_builder import MAX_CHARS_PER_TOKEN, check_prompt_size
from mlxcore.server.errors import APIError, invalid
from mlxcore.server.frontend import (
    TASK_ROUTES,
    decode_body,
    model_service,
    served_name,
)
from mlxcore.server.openapi import (
    BODY_OPTION,
    INTEGER,
    NUMBER,
    REPLIES_OPTION,
    STRING,
    array,
    const,
    obj,
    reply,
)
from mlxcore.server.service import GenerationService
from mlxcore_rerank.cross_encoder import CrossEncoder, cross_bytes, cross_pieces, pair_features
from mlxcore_rerank.scoring import Answers, RerankError, pair_tokens, score_bytes, score_pieces

MAX_DOCUMENTS = 1000
"""Most documents (or score pairs) in one request (Cohere's recommended limit)."""

DEFAULT_DOCUMENT_TOKENS = 4096
"""Tokens of a document kept when a request does not say (Cohere's default)."""

_Text = Annotated[str, msgspec.Meta(min_length=1)]


class Document(msgspec.Struct):
    """A document given as an object (Cohere v1 and Jina accept ``{"text": ...}``)."""

    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    query: _Text
    documents: Annotated[list[str | Document], msgspec.Meta(min_length=1, max_length=MAX_DOCUMENTS)]
    model: str | None = None
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = True
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=1)] | None = None
    instruction: _Text | None = None


class ScoreRequest(msgspec.Struct, kw_only=True):
    # two lists longer than one pair up, so they are as long as each other: a rule between
    # two arrays' lengths that JSON Schema cannot state (the 400 names text_2)
    text_1: _Text | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_DOCUMENTS)]
    text_2: _Text | Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_DOCUMENTS)]
    model: str | None = None
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=1)] | None = None
    instruction: _Text | None = None


RERANK_REPLY = obj(
    {
        "id": STRING,
        "model": STRING,
        "results": array(
            obj({"index": INTEGER, "relevance_score": NUMBER}, {"document": obj({"text": STRING})})
        ),
        "usage": obj({"total_tokens": INTEGER}),
    },
    title="RerankResponse",
)
SCORE_REPLY = obj(
    {
        "id": STRING,
        "object": const("list"),
        "created": INTEGER,
        "model": STRING,
        "data": array(obj({"index": INTEGER, "object": const("score"), "score": NUMBER})),
        "usage": obj({"prompt_tokens": INTEGER, "total_tokens": INTEGER}),
    },
    title="ScoreResponse",
)


async def _scorer(request: Request[Any, Any, Any], model: str | None) -> GenerationService:
    """The model that scores: a reranker, or any model that generates (scored the
    decoder-reranker way, as any decoder model answers ``/v1/embeddings``); an embedding
    model is a 400."""
    svc = await model_service(request, model, task=None)
    if svc.task not in ("rerank", "generate"):
        name = svc.names[0] if svc.names else model
        raise APIError(
            400,
            f"the model {name!r} is {TASK_ROUTES.get(svc.task, 'not a reranker')}",
            param="model",
            code="model_not_supported",
        )
    return svc


def _check_count(count: int, field: str) -> None:
    if count > MAX_DOCUMENTS:
        raise invalid(f"at most {MAX_DOCUMENTS} documents per request, got {count}", field)


def _tokenize(
    svc: GenerationService,
    pairs: Sequence[tuple[str, str]],
    fields: Sequence[str],
    instruction: str | None,
    max_document_tokens: int,
) -> list[list[int]]:
    """Each pair's prompt as token ids; a 400 naming the field of one that cannot fit."""
    tokenizer = svc.runtime.tokenizer
    limit = svc.context_length
    out: list[list[int]] = []
    for (query, document), field in zip(pairs, fields, strict=True):
        ids = pair_tokens(tokenizer, query, document, instruction, max_document_tokens)
        if limit is not None and len(ids) > limit:
            raise APIError(
                400,
                f"{field} with the query makes {len(ids)} tokens, more than the model's "
                f"context of {limit} (max_tokens_per_doc cuts documents shorter)",
                param=field,
                code="context_length_exceeded",
            )
        out.append(ids)
    return out


async def _scores(
    request: Request[Any, Any, Any],
    svc: GenerationService,
    pairs: list[tuple[str, str]],
    fields: list[str],
    instruction: str | None,
    max_document_tokens: int | None,
) -> tuple[list[float], int]:
    """The scores of ``pairs`` (query, document) and the tokens they took."""
    keep = max_document_tokens or DEFAULT_DOCUMENT_TOKENS
    query_field = "text_1" if fields and fields[0].startswith("text_") else "query"
    for query in {query for query, _ in pairs}:
        check_prompt_size(svc.runtime, len(query), query_field)
    # documents are cut to ``keep`` tokens: what lies past their first ``keep`` tokens'
    # longest possible text is never tokenized
    most = keep * MAX_CHARS_PER_TOKEN
    pairs = [(query, document[:most]) for query, document in pairs]
    model = svc.runtime.model
    work: Callable[[], Any]
    if isinstance(model, CrossEncoder):
        features = await svc.prepare(_features, svc, pairs, keep)
        tokens = sum(len(ids) for ids, _ in features)
        work, cost = (lambda: cross_pieces(model, features)), cross_bytes(model, features)
    else:
        try:
            answers = Answers.of(svc.runtime.tokenizer)
        except RerankError as exc:
            raise invalid(str(exc), "model") from None
        inputs = await svc.prepare(_tokenize, svc, pairs, fields, instruction, keep)
        tokens = sum(len(ids) for ids in inputs)
        work, cost = (lambda: score_pieces(model, inputs, answers)), score_bytes(model, inputs)
    try:
        scores = await svc.run_job(request, "rerank", work, cost)
    except RerankError as exc:
        raise invalid(str(exc), "model") from None
    return scores, tokens


def _features(
    svc: GenerationService, pairs: Sequence[tuple[str, str]], max_document_tokens: int
) -> list[tuple[list[int], list[int]]]:
    """A cross-encoder's token and segment ids for each pair (documents cut to fit)."""
    model = svc.runtime.model
    limit = min(model.max_tokens, svc.context_length or model.max_tokens)
    tokenizer = svc.runtime.tokenizer
    return [pair_features(tokenizer, q, d, limit, max_document_tokens) for q, d in pairs]


@post(
    ["/v1/rerank", "/rerank", "/v2/rerank"],
    status_code=200,
    opt={
        BODY_OPTION: RerankRequest,
        REPLIES_OPTION: {200: reply("the documents by relevance, best first", RERANK_REPLY)},
    },
)
async def rerank(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Documents ordered by their relevance to the query (Cohere's and Jina's shape)."""
    body = await decode_body(request, RerankRequest)
    _check_count(len(body.documents), "documents")
    svc = await _scorer(request, body.model)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    pairs = [(body.query, text) for text in texts]
    fields = [f"documents[{i}]" for i in range(len(texts))]
    scores, tokens = await _scores(
        request, svc, pairs, fields, body.instruction, body.max_tokens_per_doc
    )
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": served_name(svc, body.model),
        "results": results,
        "usage": {"total_tokens": tokens},
    }


def _score_pairs(body: ScoreRequest) -> tuple[list[tuple[str, str]], list[str]]:
    """vLLM's pairing: one text against each of the others, or two lists pairwise."""
    first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    _check_count(max(len(first), len(second)), "text_2" if len(second) > 1 else "text_1")
    if len(first) == 1:
        return [(first[0], t) for t in second], [f"text_2[{i}]" for i in range(len(second))]
    if len(second) == 1:
        return [(t, second[0]) for t in first], [f"text_1[{i}]" for i in range(len(first))]
    if len(first) != len(second):
        raise invalid(
            f"text_1 and text_2 must be as long as each other when both are lists "
            f"({len(first)} and {len(second)})",
            "text_2",
        )
    return list(zip(first, second, strict=True)), [f"text_2[{i}]" for i in range(len(second))]


@post(
    ["/score", "/v1/score"],
    status_code=200,
    opt={
        BODY_OPTION: ScoreRequest,
        REPLIES_OPTION: {200: reply("one score per pair, in order", SCORE_REPLY)},
    },
)
async def score(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """vLLM's ``/score``: the relevance of each (text_1, text_2) pair."""
    body = await decode_body(request, ScoreRequest)
    pairs, fields = _score_pairs(body)
    svc = await _scorer(request, body.model)
    scores, tokens = await _scores(
        request, svc, pairs, fields, body.instruction, body.max_tokens_per_doc
    )
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": served_name(svc, body.model),
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
