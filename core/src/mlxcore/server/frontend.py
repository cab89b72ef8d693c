"""Helpers every HTTP front end shares: the service, model names, body decoding, hang-ups."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import msgspec
from litestar import Request

from mlxcore.models.default import DEFAULT_MODEL_NAME
from mlxcore.models.names import model_name
from mlxcore.server.errors import APIError, from_validation, invalid
from mlxcore.server.router import ModelRouter
from mlxcore.server.service import GenerationService

T = TypeVar("T")

TASK_ROUTES = {
    "embed": "an embedding model: it serves /v1/embeddings only",
    "rerank": "a reranker: it serves /v1/rerank and /score only",
    "stt": "a speech-to-text model: it serves /v1/audio/transcriptions and "
    "/v1/audio/translations only",
    "tts": "a text-to-speech model: it serves /v1/audio/speech only",
}
"""What a model of each task other than ``generate`` answers, for the 400 elsewhere."""

MAX_EXTRA_FIELDS = 128
"""The most top-level fields outside a route's schema one body may carry (plugins'
options and fields this server ignores). They live as long as the request does, so a
body with thousands of made-up names would hold thousands of objects through a whole
generation (measured: 200 bodies of 20,000 names left the heap 17-26% larger after the
server went idle); more is a 400, answered before anything outlives the decoding."""


async def model_service(
    request: Request[Any, Any, Any], model: str | None, task: str | None = "generate"
) -> GenerationService:
    """The service of the model ``model`` names (``None``/empty: the default), loaded on
    demand: a 404 listing the names for an unknown one, a 503 when it cannot be loaded,
    a 400 when it does not do ``task`` (``None``: any model)."""
    router: ModelRouter = request.app.state.router
    svc = await router.service(model)
    if task is not None and svc.task != task:
        name = svc.names[0] if svc.names else model
        serves = TASK_ROUTES.get(svc.task)
        raise APIError(
            400,
            f"the model {name!r} is {serves}"
            if serves is not None
            else f"the model {name!r} does not serve this route",
            param="model",
            code="model_not_supported",
        )
    return svc


def _is_json(content_type: str) -> bool:
    """True for a JSON media type, or none at all (as FastAPI, and so vLLM, accept)."""
    media = content_type.partition(";")[0].strip().lower()
    return not media or media.endswith(("/json", "+json"))


def _integral_floats(value: Any, depth: int = 0) -> Any:
    """``value`` with every float that holds a whole number as an int: JSON does not tell
    ``1`` from ``1.0`` (JSON Schema calls both integers), msgspec's int fields would."""
    if depth > 64:
        return value  # deeper nesting is refused by the schema anyway
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats(v, depth + 1) for v in value]
    return value


async def decode_request(
    request: Request[Any, Any, Any], body_type: type[T]
) -> tuple[T, dict[str, Any]]:
    """The JSON body decoded strictly as ``body_type``, and its top-level fields outside
    that schema (they become the plugins' per-request options,
    ``GenerationRequest.options``, so a plugin can take a setting such as
    ``"speculative": false`` without the front ends knowing about it).

    The bytes are parsed once. A non-JSON ``Content-Type`` is a 415; a body that does
    not arrive within ``--header-timeout`` a 408; bytes that are not UTF-8 (anywhere,
    even in fields that are ignored), not JSON, nested too deeply or not the expected
    shape are a 400 naming the field where there is one; so is a body with more than
    :data:`MAX_EXTRA_FIELDS` top-level fields outside the schema.
    """
    content_type = request.headers.get("content-type", "")
    if not _is_json(content_type):
        raise APIError(
            415,
            f"the request body must be JSON (Content-Type: application/json), got {content_type!r}",
            code="unsupported_media_type",
        )
    try:
        timeout = request.app.state.config.header_timeout or None
        raw = await asyncio.wait_for(request.body(), timeout)
    except TimeoutError:
        raise APIError(408, "the request body did not arrive in time", code="timeout") from None
    try:
        raw.decode("utf-8")  # msgspec does not check the keys it skips
        # every body is walked: fields typed Any (embeddings' input) are read as ints too
        document = _integral_floats(msgspec.json.decode(raw))
        body = msgspec.convert(document, body_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation(exc) from None
    except UnicodeDecodeError as exc:
        raise invalid(
            f"the request body is not valid UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None
    known = frozenset(getattr(body_type, "__struct_encode_fields__", ()))
    extras = {k: v for k, v in document.items() if k not in known}
    if len(extras) > MAX_EXTRA_FIELDS:
        raise invalid(
            f"the request body has {len(extras)} fields this route does not define; "
            f"at most {MAX_EXTRA_FIELDS} are accepted"
        )
    return body, extras


async def decode_body(request: Request[Any, Any, Any], body_type: type[T]) -> T:
    """The JSON body decoded strictly as ``body_type`` (see :func:`decode_request`)."""
    body, _ = await decode_request(request, body_type)
    return body


def served_names(svc: GenerationService) -> list[str]:
    """The names clients may use for the model (first is the primary)."""
    if svc.names:
        return list(svc.names)
    if svc.config.served_model_name:
        return list(svc.config.served_model_name)
    if svc.config.model is None:
        return [DEFAULT_MODEL_NAME]
    return [model_name(svc.config.model)]


def served_name(svc: GenerationService, model: str | None) -> str:
    """The name to report in responses: the one asked for, else the primary name."""
    return model or served_names(svc)[0]
