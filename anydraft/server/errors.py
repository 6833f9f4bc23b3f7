"""The errors a client sees: every failure a client can cause is an `ApiError`, answered as
``{"error": {message, type, param, code}}`` with a 4xx status. Our own failures are 500s whose
message carries an error id that the one log line of the failure carries too."""

from __future__ import annotations

import logging
import uuid

from fastapi.responses import JSONResponse

from ..errors import AnydraftError
from .metrics import Metrics
from .scheduler import DecodingFailed, NoWorkers, SchedulerClosed

log = logging.getLogger("anydraft.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


def error_response(err: ApiError, metrics: Metrics) -> JSONResponse:
    """``err`` as the response that carries it, counted in ``metrics``."""
    metrics.errors.labels(err.type, err.code or "").inc()
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def internal_error(exc: BaseException, what: str = "generation failed") -> ApiError:
    """A 500 whose error id also starts the one log line (with traceback) of the failure."""
    error_id = "err-" + uuid.uuid4().hex[:16]
    cause = exc.__cause__ if isinstance(exc, DecodingFailed) and exc.__cause__ else exc
    log.error("%s: %s [%s]", error_id, what, type(cause).__name__, exc_info=cause)
    return ApiError(500, f"internal error {error_id} ({type(cause).__name__}): the server log "
                         "has the details under this id", type="server_error", code="internal_error")


def user_error(exc: BaseException, prompt_param: str | None = None) -> ApiError:
    """An exception from a generation job, as the error the client sees: 4xx for what the
    request caused (found before decoding starts), 500 with an error id for the rest."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DecodingFailed):
        return internal_error(exc)
    if isinstance(exc, AnydraftError):
        msg = str(exc)
        code = "context_length_exceeded" if "context window" in msg else "invalid_value"
        param = prompt_param if msg.startswith("prompt") else None
        return ApiError(400, msg, param=param, code=code)
    if type(exc).__module__.startswith("jinja2"):  # the chat template refused the messages
        return ApiError(400, f"the chat template rejected the messages: {exc}", param="messages",
                        code="invalid_messages")
    if isinstance(exc, NoWorkers):  # not worth a retry: a restart is what it needs
        return ApiError(503, str(exc), type="server_error", code="no_workers")
    if isinstance(exc, SchedulerClosed):
        return ApiError(503, str(exc), type="server_error", code="shutting_down",
                        headers={"Retry-After": "5"})
    return internal_error(exc)
