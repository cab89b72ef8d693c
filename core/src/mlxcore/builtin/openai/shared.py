"""Helpers the OpenAI routes share: the service, model names."""

from __future__ import annotations

from typing import Any

from litestar import Request

from mlxcore.server.errors import APIError
from mlxcore.server.service import GenerationService


def service_of(request: Request[Any, Any, Any]) -> GenerationService:
    """The app's :class:`GenerationService`."""
    svc: GenerationService = request.app.state.service
    return svc


def served_names(svc: GenerationService) -> list[str]:
    """The names clients may use for the model (first is the primary)."""
    return list(svc.config.served_model_name) or [svc.config.model or svc.runtime.info.source]


def check_model(svc: GenerationService, model: str | None) -> None:
    """404 for a model name this server does not serve (``None`` means the default)."""
    if model is None or model == "":
        return
    names = served_names(svc)
    if model not in names:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {', '.join(names)}",
            param="model",
            code="model_not_found",
        )


def served_name(svc: GenerationService, model: str | None) -> str:
    """The name to report in responses."""
    return model or served_names(svc)[0]
