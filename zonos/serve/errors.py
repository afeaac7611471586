"""The speech server's error answers: every error, whichever layer raises it, goes out in OpenAI's JSON shape
``{"error": {"message", "type", "param", "code"}}`` with a message that says what to do."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from zonos.errors import EngineClosedError, EngineFullError, ZonosInputError
from zonos.serve.metrics import Metrics
from zonos.serve.settings import ServerSettings

__all__ = ["ApiError", "install_error_handlers"]

# What the server offers, for the message of a request to a route it does not have.
ROUTES = "POST /v1/audio/speech, POST /v1/zonos/speech, GET/POST /v1/audio/voices, GET /health and GET /metrics"


class ApiError(HTTPException):
    """An error answered as JSON: ``status``, a message that says what to do, OpenAI's ``type`` and ``code``. (An
    HTTPException, so FastAPI passes it through when it is raised while the body is parsed.) ``error_type``
    overrides the type the status implies."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None, headers: dict | None = None,
                 error_type: str | None = None):  # fmt: skip
        super().__init__(status, message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}
        self.error_type = error_type

    @property
    def type(self) -> str:
        """OpenAI's error type: the one given, else the status's."""
        if self.error_type is not None:
            return self.error_type
        return {401: "authentication_error", 429: "rate_limit_error", 503: "server_busy"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def response(self) -> JSONResponse:
        """The JSON answer."""
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def install_error_handlers(app: FastAPI, settings: ServerSettings, metrics: Metrics) -> None:
    """Answer every exception that reaches ``app``'s handlers as an :class:`ApiError`, counted in ``metrics``."""

    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        metrics.count(request.url.path, err.status)
        return err.response()

    async def input_error(request: Request, err: ZonosInputError) -> JSONResponse:
        return await api_error(request, ApiError(400, str(err), "invalid_input"))

    async def engine_full(request: Request, err: EngineFullError) -> JSONResponse:
        message = f"the server is at capacity ({err}); retry after {settings.retry_after_s} s"
        return await api_error(
            request, ApiError(503, message, "engine_full", headers={"Retry-After": str(settings.retry_after_s)})
        )

    async def engine_closed(request: Request, err: EngineClosedError) -> JSONResponse:
        headers = {"Retry-After": str(settings.retry_after_s)}
        return await api_error(request, ApiError(503, "the server is shutting down", "shutting_down", headers=headers))

    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}"
        return await api_error(request, ApiError(400, message, "invalid_value", ".".join(loc) or None))

    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own errors: no such route, a method the route lacks, a form it cannot parse."""
        method, path = request.method, request.url.path
        if err.status_code == 404:
            # Counted under one label: a scanner's random paths would each add a metrics series.
            metrics.count("(no route)", 404)
            message = f"there is no {method} {path}: this server has {ROUTES}"
            return ApiError(404, message, "not_found").response()
        if err.status_code == 405:
            allowed = (err.headers or {}).get("Allow", "")
            message = f"{method} is not allowed on {path}: use {allowed}"
            return await api_error(request, ApiError(405, message, "method_not_allowed", headers=err.headers))
        return await api_error(request, ApiError(err.status_code, str(err.detail), f"http_{err.status_code}",
                                                 headers=err.headers))  # fmt: skip

    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        # Starlette re-raises the exception after this answer, so the server's log keeps the traceback.
        message = f"the server failed on this request ({type(err).__name__}); its log has the details"
        return await api_error(request, ApiError(500, message, "internal_error"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ZonosInputError, input_error)
    app.add_exception_handler(EngineFullError, engine_full)
    app.add_exception_handler(EngineClosedError, engine_closed)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
