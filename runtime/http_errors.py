"""Errors in OpenAI's format, {"error": {"message", "type", "param", "code"}} (on /v1/messages, Anthropic's:
messages_api.error_body): the server's exception handlers and how /openapi.json documents them.

Bad input is a 4xx (request validation is a 400, as OpenAI answers, not FastAPI's 422); a request
the engine failed is a 500 and one cut by a draining server a 503 (FAILED).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from .messages_api import error_body as anthropic_error
from .openai_api import APIError, error_body
from .protocol import InvalidRequestError, ShuttingDown

log = logging.getLogger("kiln.server")

FAILED = {      # finish reasons that end a request without an answer: APIError's arguments
    "error": (500, "the engine failed while generating; see the server log", None, "server_error",
              "internal_error"),
    "shutdown": (503, "the server is shutting down and cancelled this request; send it again (to another "
                      "replica, or once the server is back)", None, "server_error", "shutting_down"),
}


class ErrorDetail(BaseModel):
    message: str
    type: str                     # invalid_request_error | server_error
    param: str | None             # the request field at fault
    code: str | None              # e.g. invalid_api_key, model_not_found, shutting_down


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {   # a route's documented error answers (FastAPI `responses`)
    "4XX": {"model": ErrorResponse, "description": "Bad input, a missing API key or an unknown model"},
    "5XX": {"model": ErrorResponse, "description": "The engine failed (500) or the server is shutting down (503)"},
}


def document_errors(app: FastAPI) -> None:
    """/openapi.json without FastAPI's 422 "Validation Error" answers: validation answers 400 (ERRORS)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = openapi


def install_error_handlers(app: FastAPI) -> None:
    def answer(request: Request, status: int, message: str, type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> JSONResponse:
        """The error in OpenAI's shape, or in Anthropic's on its Messages API's routes."""
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        body = anthropic_error(status, message) if request.url.path.startswith("/v1/messages") \
            else error_body(message, type, param, code)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return answer(request, e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(request: Request, e: InvalidRequestError) -> JSONResponse:
        return answer(request, 400, str(e), param=e.param)

    @app.exception_handler(ValueError)       # tokenizer / chat template validation
    async def value_error(request: Request, e: ValueError) -> JSONResponse:
        return answer(request, 400, str(e))

    @app.exception_handler(ShuttingDown)
    async def shutting_down(request: Request, _e: ShuttingDown) -> JSONResponse:
        status, message, param, type_, code = FAILED["shutdown"]
        return answer(request, status, message, type_, param, code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":
            message = f"{where} is not supported by this server; leave it out (GET /openapi.json lists the fields)"
        if first.get("type") == "json_invalid":
            reason = first.get("ctx", {}).get("error", "")
            return answer(request, 400, f"the request body is not valid JSON: {reason}".rstrip(": "))
        return answer(request, 400, message, param=loc[0] if loc else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return answer(request, e.status_code, str(e.detail), code=None)

    @app.exception_handler(Exception)
    async def server_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return answer(request, 500, f"internal server error: {type(e).__name__}", "server_error",
                      code="internal_error")
