"""Every route of the app (`ROUTES`), with the handlers of those that are not completions
(completions.py), and the handlers that turn exceptions into responses (`EXCEPTION_HANDLERS`).

``GET /`` is the playground (static/playground.html, issue 23): a page that streams an answer
with each span colored by its origin (`Generation.piece`); it holds no secret, so it is served
without the key, and asks for the key itself to call the API.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .completions import chat_completions, completions
from .errors import ApiError, ClientGone, error_response
from .state import server_of
from .workers import public_name

PLAYGROUND = Path(__file__).parent / "static" / "playground.html"
PLAYGROUND_SCRIPT = PLAYGROUND.with_suffix(".js")
# the page may run only its own script file (no inline script: an injected one cannot run),
# load nothing from anywhere else, call only this server, and not be framed by another site
PLAYGROUND_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache"}


@functools.cache
def _static(path: Path) -> str:
    return path.read_text(encoding="utf-8")


async def playground(request: Request):
    return HTMLResponse(_static(PLAYGROUND), headers=PLAYGROUND_HEADERS)


async def playground_script(request: Request):
    return Response(_static(PLAYGROUND_SCRIPT), media_type="text/javascript; charset=utf-8",
                    headers=PLAYGROUND_HEADERS)


async def models(request: Request):
    state = server_of(request)
    config, decoder = state.config, state.decoder
    drafter = decoder.drafter
    return {"object": "list", "data": [{
        "id": config.model_id, "object": "model", "created": state.created,
        "owned_by": config.owned_by,
        "anydraft": {"target": public_name(decoder.target.name),
                     "drafter": public_name(drafter.name) if drafter else None,
                     "method": decoder.draft.method, "context_window": state.context_window,
                     "workers": len(state.decoders), "max_batch": config.max_batch},
    }]}


async def health(request: Request):
    state = server_of(request)
    scheduler, config = state.scheduler, state.config
    # degraded: a worker died or cannot make its rows (`Scheduler.faults`); the others serve
    faults = scheduler.faults
    body = {"status": "shutting down" if not scheduler.taking else "degraded" if faults else "ok"}
    if request.scope["state"].get("authorized"):  # no --api-key, or the key was sent
        body |= {
            "model": config.model_id, "waiting": scheduler.waiting, "active": scheduler.active,
            "workers": len(state.decoders), "max_batch": config.max_batch,
            "faults": faults,  # worker -> what is wrong with it, in the log with its traceback
            "target_path": state.decoder.target.path,  # how the target runs: "torch bfloat16", ...
            "exact": state.decoder.target.exact,  # greedy output identical to plain decoding (--exact)
            # why, where --exact auto chose (models/exact_cost.py); None where --exact on/off
            "exact_auto": choice.describe() if (choice := state.decoder.exact_choice) else None,
            # seconds to score M tokens in one call, as measured on this machine
            # (hardware/profile.py; {} where none was cached when the models loaded): what
            # bench-serve's bound reads
            "cost_curve": {str(m): s for m, s in sorted(state.decoder.estimates.costs.profile.items())}}
    if not scheduler.taking:  # a load balancer takes a draining server out of rotation
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
    if not scheduler.alive:  # and one that no worker is left to serve: it needs a restart
        return JSONResponse(body, status_code=503)
    return body


async def prometheus(request: Request):
    return Response(server_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


class Route(NamedTuple):
    path: str
    methods: tuple[str, ...]
    handler: Callable
    public: bool = False  # answered without the API key (nothing secret shows; /health only its status)


ROUTES = (
    Route("/v1/chat/completions", ("POST",), chat_completions),
    Route("/v1/completions", ("POST",), completions),
    Route("/v1/models", ("GET",), models),
    Route("/health", ("GET", "HEAD"), health, public=True),
    Route("/metrics", ("GET",), prometheus),
    Route("/", ("GET", "HEAD"), playground, public=True),
    Route("/playground.js", ("GET",), playground_script, public=True),
)


async def api_error(request: Request, exc: ApiError):
    return error_response(exc, server_of(request).metrics)


async def client_gone(request: Request, exc: ClientGone):
    return Response(status_code=499)  # nobody reads it; recorded in the metrics


async def http_error(request: Request, exc: StarletteHTTPException):
    """FastAPI's own 404 and 405, in the error shape of every other error."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(ApiError(exc.status_code, msg, code=code,
                                   headers=getattr(exc, "headers", None)), server_of(request).metrics)


EXCEPTION_HANDLERS = {ApiError: api_error, ClientGone: client_gone,
                      StarletteHTTPException: http_error}
