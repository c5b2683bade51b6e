"""The HTTP door's errors: ``{"error": CODE, "message": text}`` with a status that says whose fault it is.

Why one module: the routes raise :class:`ApiError` for what they check
themselves, the processor raises typed ``UnimqError``s, FastAPI and Starlette
raise their own (validation, 404, 405), and anything else may escape a route.
:func:`install_error_handlers` turns all of them into the one JSON shape, with
a 4xx status for the client's mistakes (bad JSON, a missing CloudEvents
attribute, a wrong specversion, a body over the limit, an unknown receipt
handle, ...) and 5xx only for the server's own trouble (store full, store
stopping); :data:`STATUS_OF_CODE` is the processor's codes' table.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core_broker.errors import UnimqError

from .http_auth import WWW_AUTHENTICATE

__all__ = ["ApiError", "STATUS_OF_CODE", "error_response", "install_error_handlers"]

log = logging.getLogger("unimq.http")

STATUS_OF_CODE = {
    "BAD_REQUEST": 400,
    "INVALID_CLOUDEVENT": 400,
    "ILLEGAL_FILTER_EXPRESSION": 400,
    "INVALID_RECEIPT_HANDLE": 400,
    "INVALID_SUBSCRIPTION": 400,
    "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE": 400,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "TOPIC_NOT_FOUND": 404,
    "USER_NOT_FOUND": 404,
    "PERMISSION_NOT_FOUND": 404,
    "USER_EXISTS": 409,
    "QUOTA_NOT_FOUND": 404,
    "TOO_MANY_REQUESTS": 429,  # a traffic limit (gateway.access.traffic): with Retry-After
    "SUBSCRIPTION_NOT_FOUND": 404,
    "NOT_ACCEPTABLE": 406,  # format=arrow on a server without pyarrow
    "TOPIC_EXISTS": 409,
    "MESSAGE_BODY_TOO_LARGE": 413,
    "PAYLOAD_TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "CORRUPT_RECORD": 500,
    "INTERNAL_ERROR": 500,
    "SERVICE_UNAVAILABLE": 503,
    "NOT_ENOUGH_REPLICAS": 503,  # retriable: the group's in-sync set is below min_insync_replicas
    "NOT_MASTER": 503,  # retriable: a failover is under way
    "QUEUE_MOVED": 503,  # retriable: a static topic's logic queue is being remapped
    "MASTER_PERSISTENCE_TIMEOUT": 504,
    "STORE_FULL": 507,
}


class ApiError(Exception):
    """A route's own refusal: answered with ``status`` as ``{"error": code, "message": message}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app``'s routes in the door's JSON error shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(UnimqError)
    async def _unimq_error(request: Request, exc: UnimqError) -> JSONResponse:
        status = STATUS_OF_CODE.get(exc.code, 400)
        if status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, exc.code, exc)
        retry = exc.details.get("retry_after_s") if status == 429 else None
        resp = error_response(status, exc.code, str(exc), **({"retry_after_s": retry} if retry is not None else {}))
        if retry is not None:  # RFC 9110 10.2.3: whole seconds
            resp.headers["retry-after"] = str(max(1, math.ceil(float(retry))))  # type: ignore[arg-type]
        if status == 401:  # RFC 9110: a 401 names the schemes that would work
            resp.headers["www-authenticate"] = WWW_AUTHENTICATE
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "request"
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return error_response(400, "BAD_REQUEST", "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "INTERNAL_ERROR", f"internal error: {type(exc).__name__}")
