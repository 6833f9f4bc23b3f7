"""FastAPI app: the OpenAI routes over a `Scheduler` of decoders, with OpenAI-style errors.

`create_app` builds the state every handler shares (state.py `ServerState`) and registers:
- the routes (routes.py `ROUTES`): the completions (completions.py, their generations in
  generation.py), /v1/models, /health, /metrics and the playground;
- the error handlers (routes.py `EXCEPTION_HANDLERS`; errors.py: what a client sees);
- the `Gate` (gate.py: Host names, the API key, the connections' cap, request metrics) and,
  where asked for, CORS.

Request bodies are parsed by body.py, not by FastAPI, so every bad body gets the same error
shape. ``app.state.server`` is the `ServerState`: cli.py runs uvicorn with its connections'
protocol and its ``drain`` on SIGTERM.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from .config import ServerConfig
from .gate import Gate
from .routes import EXCEPTION_HANDLERS, ROUTES
from .state import ServerState


def create_app(decoders: list, config: ServerConfig) -> FastAPI:
    """The app serving ``decoders`` (one worker thread each; they should share one model)."""
    state = ServerState.build(decoders, config)
    app = FastAPI(title="anydraft", lifespan=state.lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = state
    for route in ROUTES:
        app.add_api_route(route.path, route.handler, methods=list(route.methods))
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    app.add_middleware(Gate, config=config, metrics=state.metrics, connections=state.connections,
                       endpoints=frozenset(route.path for route in ROUTES),
                       public=frozenset(route.path for route in ROUTES if route.public))
    if config.cors_origins:  # outside the Gate: a browser's preflight carries no API key
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "HEAD"],
                           allow_headers=["Authorization", "Content-Type"])
    return app
