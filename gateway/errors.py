"""Errors a client can cause, and how each reaches the wire.

Routes raise `APIError`s; the handlers here turn those, Litestar's own HTTP errors and an
engine that died into the OpenAI error JSON (TGI routes use TGI's shape so its clients
parse them). Anything else is a server bug: logged with its traceback, answered 500.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from loragate.engine import EngineDeadError, InvalidParam

log = logging.getLogger(__name__)


class APIError(Exception):
    status_code = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


class InvalidRequestError(APIError):
    status_code = 400
    error_type = "invalid_request_error"


class NotFoundError(APIError):
    status_code = 404
    error_type = "invalid_request_error"


class QueueFullError(APIError):
    status_code = 429
    error_type = "rate_limit_error"


class EngineUnavailableError(APIError):
    status_code = 503
    error_type = "server_error"


class AuthenticationError(APIError):
    """No key, or a key that is not valid: one message for every case, so nothing is hinted."""

    status_code = 401
    error_type = "authentication_error"


class PermissionDeniedError(APIError):
    status_code = 403
    error_type = "permission_error"


class ConflictError(APIError):
    status_code = 409
    error_type = "invalid_request_error"


class QuotaExceededError(APIError):
    status_code = 429
    error_type = "rate_limit_error"


class RegistryDownError(APIError):
    """The shared registry (Redis) cannot be reached, and this call needs it: the one error
    the store seam (registry_seam.py) raises for an outage."""

    status_code = 503
    error_type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "the registry store is unreachable, so this is not possible right now; adapters "
            "and tenants already known keep being served. Retry later.",
            code="registry_unavailable",
            headers={"Retry-After": "1"},
        )


class PluginFailedError(APIError):
    """A plugin (sampler, logits processor, ...) raised for this request alone."""

    status_code = 500
    error_type = "plugin_error"


class RequestFailedError(APIError):
    """Serving this request failed on the engine (the engine and other requests go on)."""

    status_code = 500
    error_type = "server_error"


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorDetail


class TGIErrorResponse(msgspec.Struct, kw_only=True):
    """TGI's error body, which the text-generation and lorax clients parse."""

    error: str
    error_type: str


@dataclass
class ErrorInfo:
    status_code: int
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def classify(exc: Exception) -> ErrorInfo:
    """Status, message and field at fault for any exception a request can raise."""
    if isinstance(exc, APIError):
        return ErrorInfo(
            exc.status_code, exc.message, exc.error_type, exc.param, exc.code, exc.headers
        )
    if isinstance(exc, ValidationException):
        return _validation_info(exc)
    if isinstance(exc, HTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return ErrorInfo(exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {}))
    if isinstance(exc, EngineDeadError):
        return ErrorInfo(503, f"the engine is not running: {exc}", "server_error")
    log.error("unhandled error while serving a request", exc_info=exc)
    return ErrorInfo(500, "internal server error", "server_error")


_MISSING_FIELD = re.compile(r"missing required field `([^`]+)`")
_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`")


def _validation_info(exc: ValidationException) -> ErrorInfo:
    """Name the field msgspec refused, e.g. `max_tokens` or `parameters.top_k`."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    first = extra[0] if extra and isinstance(extra[0], dict) else {}
    message = str(first.get("message") or exc.detail)
    key = first.get("key")
    param = None if key in (None, "data") else str(key)
    missing = _MISSING_FIELD.search(message)
    if missing:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
    at = _AT_PATH.search(message)
    if at and at.group(1):
        param = f"{param}.{at.group(1)}" if param else at.group(1)
        message = _AT_PATH.sub("", message)
    if message.startswith("'data'") or not extra:
        message = "the request body must be a JSON object"
    text = f"{param}: {message}" if param and not missing else message
    return ErrorInfo(400, text, "invalid_request_error", param, "invalid_value")


def openai_error_response(request: Request, exc: Exception) -> Response:
    info = classify(exc)
    body = ErrorResponse(
        error=ErrorDetail(message=info.message, type=info.type, param=info.param, code=info.code)
    )
    return Response(body, status_code=info.status_code, headers=info.headers)


_TGI_TYPES = {
    400: "validation",
    401: "authentication",
    403: "authentication",
    404: "not_found",
    413: "validation",
    429: "overloaded",
}
# The TGI / LoRAX routes: their clients parse TGI's error body, whoever answers.
TGI_PATHS = frozenset({"/", "/generate", "/generate_stream", "/info"})


def tgi_error_body(status_code: int, message: str) -> TGIErrorResponse:
    return TGIErrorResponse(error=message, error_type=_TGI_TYPES.get(status_code, "generation"))


def tgi_error_response(request: Request, exc: Exception) -> Response:
    info = classify(exc)
    body = tgi_error_body(info.status_code, info.message)
    return Response(body, status_code=info.status_code, headers=info.headers)


def param_of(exc: ValueError, names: dict[str, str]) -> str | None:
    """The request field a refusal names: an `InvalidParam`'s field, under the name the
    client's request gave it (`names`: the engine's name -> the request's); None for a
    refusal that names no field, or one this request does not have."""
    return names.get(exc.field) if isinstance(exc, InvalidParam) else None
