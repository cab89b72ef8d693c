"""API errors and their OpenAI-shaped JSON: ``{"error": {message, type, param, code}}``.

Front ends raise :class:`APIError`; the app turns it (and any framework or
unexpected error) into the right status and shape. Nothing a client can send
should produce a 500.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

from mlxcore.engine.validation import RequestRejected
from mlxcore.errors import MediaError, OptionError
from mlxcore.structured import CONSTRAINT_CODE

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """An error a front end reports to the client."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None) -> APIError:
    """A 400 naming the offending field."""
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def constraint_error(message: str, param: str) -> APIError:
    """A 400 for a constraint that cannot be held (:data:`CONSTRAINT_CODE`)."""
    return APIError(400, message, param=param, code=CONSTRAINT_CODE)


def from_validation(exc: msgspec.ValidationError | msgspec.DecodeError) -> APIError:
    """A 400 from msgspec's decode/validation error, naming the JSON path.

    ``ValidationError`` subclasses ``DecodeError``: only a plain ``DecodeError`` means
    the body is not JSON at all. A required field missing at the top level names that
    field as ``param``.
    """
    text = str(exc)
    param = None
    if " - at `$." in text:
        text, _, path = text.partition(" - at `$.")
        param = path.rstrip("`")
        text = f"{text} (at {param})"
    elif not isinstance(exc, msgspec.ValidationError):
        text = f"the request body is not valid JSON: {text}"
    elif text.startswith("Object missing required field `"):
        param = text.split("`")[1]
    else:
        text = f"the request body must be a JSON object: {text}"
    return invalid(text, param)


def from_domain(exc: RequestRejected | OptionError | MediaError) -> APIError:
    """A 400 for a request the model session refused (:mod:`mlxcore.request_builder`),
    a plugin option it rejected, or a media part it could not read."""
    if isinstance(exc, RequestRejected):
        code = exc.code or ("invalid_value" if exc.field else None)
        return APIError(400, exc.message, param=exc.field, code=code)
    if isinstance(exc, OptionError):
        return invalid(str(exc), exc.field)
    return invalid(exc.message, exc.field)


def internal_error(exc: BaseException, context: str) -> APIError:
    """A 500 for an unexpected exception: the detail goes to the log under a fresh error
    id, the client gets that id and no internal text."""
    error_id = f"err-{uuid.uuid4().hex[:16]}"
    log.error("%s: internal error %s", context, error_id, exc_info=exc)
    return APIError(
        500,
        f"internal server error (error id {error_id}; the server log has the details)",
        type="server_error",
        code="internal_error",
    )


def overloaded(message: str, retry_after: int = 1) -> APIError:
    """A 503 asking the client to retry after ``retry_after`` seconds."""
    return APIError(
        503,
        message,
        type="overloaded_error",
        code="overloaded",
        headers={"Retry-After": str(retry_after)},
    )


def as_api_error(request: Request[Any, Any, Any], exc: Exception) -> APIError:
    """Any exception raised while serving ``request`` as an :class:`APIError`
    (front ends with their own error shape render it themselves)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestRejected | OptionError | MediaError):
        return from_domain(exc)
    if isinstance(exc, msgspec.ValidationError | msgspec.DecodeError):
        return from_validation(exc)
    if isinstance(exc, HTTPException):
        status = exc.status_code
        detail = exc.detail if isinstance(exc.detail, str) else str(exc)
        if status == 413:
            detail = "the request body is too large"
        return APIError(status, detail, headers=dict(exc.headers or {}))
    return internal_error(exc, f"{request.method} {request.url.path}")


def api_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar exception handler: every error becomes an OpenAI-shaped body."""
    err = as_api_error(request, exc)
    return Response(content=err.body(), status_code=err.status, headers=err.headers)
