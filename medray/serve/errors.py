"""One error path for the ingress: every failure becomes an OpenAI-shaped JSON body
`{"error": {"message", "type", "code"}}` with a 4xx for client input (5xx only for faults of
the service itself: an LLM replica down, or a bug)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from medray.serve.schemas import ErrorBody

log = logging.getLogger("medray.serve")

# Documented on every route (OpenAPI `responses`).
ERROR_STATUSES = {
    400: "bad request: malformed JSON, invalid text, an OpenAI route's body off its schema, "
         "a prompt over the model's context length (max_model_len in /v1/models; "
         "/v1/qa: a question that alone does not fit context_tokens), or an image for a "
         "text-only model",
    401: "missing or invalid API key",
    404: "unknown model, adapter or route",
    413: "a field, an image or the body is over its size limit",
    422: "the body does not match the route's schema, or an image in it is no image",
    429: "too many requests in flight",
    503: "no LLM replica is ready",
}


# OpenAI's error types by status, for errors relayed from vLLM (whose own types are
# exception names such as BadRequestError).
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 409: "conflict_error",
                413: "invalid_request_error", 422: "invalid_request_error",
                429: "rate_limit_error"}


def context_error(limit: int, tokens: int, param: str | None, what: str = "the prompt",
                  new_tokens: int = 1) -> APIError:
    """A prompt over the context window: 400, naming the limit and the prompt's length."""
    return APIError(400, "invalid_request_error", (
        f"This model's maximum context length is {limit} tokens; {what} has {tokens} "
        f"tokens, which leaves no room for {new_tokens} generated token"
        f"{'s' if new_tokens != 1 else ''}. Shorten the prompt."), param)


class APIError(Exception):
    def __init__(self, status: int, kind: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.kind, self.message, self.param, self.headers)


def error_response(status: int, kind: str, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status, "param": param}}
    # ensure_ascii: a lone surrogate echoed from the request still serialises.
    return JSONResponse(json.loads(json.dumps(body, ensure_ascii=True)), status_code=status,
                        headers=headers)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """'field.path: message; ...' without echoing the input (it may be huge, or clinical)."""
    errors = exc.errors(include_input=False, include_url=False) if isinstance(
        exc, ValidationError) else exc.errors()
    parts, first = [], None
    for err in errors[:10]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        first = first or loc
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts), first


def from_validation(exc: ValidationError, status: int = 422) -> APIError:
    message, param = validation_message(exc)
    return APIError(status, "invalid_request_error", message, param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail),
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(422, "invalid_request_error", message, param)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in the ingress: %s", type(exc).__name__)
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__})")


def openapi_errors() -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": text}
            for code, text in ERROR_STATUSES.items()}
