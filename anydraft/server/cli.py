"""The `anydraft serve` subcommand. Only argparse here: FastAPI loads when the command runs."""

from __future__ import annotations

import argparse
import os
import sys

from .connections import is_loopback
from .options import add_serve_options, check_ray_options, check_serve_args, server_config


def register(sub) -> None:
    """Add `serve` to the `anydraft` subparsers."""
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, "
                                   "/health and /metrics with speculative decoding.")
    add_serve_options(s)
    s.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..errors import AnydraftError

    check_serve_args(args)
    check_ray_options(args)
    api_key = args.api_key or os.environ.get("ANYDRAFT_API_KEY") or None
    if not is_loopback(args.host):
        print(f"anydraft: WARNING: binding to {args.host}, which is not a loopback address: "
              "anyone who can reach this machine can use the server"
              + ("" if api_key else " (and no --api-key is set)"), file=sys.stderr, flush=True)
    if args.ray:
        return serve_on_ray(args, api_key)

    try:
        import uvicorn  # noqa: F401 - the check that the server extra is there

        from .app import create_app
    except ImportError as exc:
        raise AnydraftError(
            f"anydraft serve needs the server extra ({exc.name} is missing): "
            "pip install 'anydraft[server]'") from exc
    from . import shutdown
    from .workers import build_workers

    decoders, max_batch = build_workers(args)
    config = server_config(args, max_batch, api_key)
    app = create_app(decoders, config)
    print(f"anydraft: serving {config.model_id!r} (method {decoders[0].draft.method}, "
          f"{len(decoders)} worker{'s' if len(decoders) > 1 else ''} of up to {max_batch} "
          f"row{'s' if max_batch > 1 else ''}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    # proxy headers are read by the app, and only from --trusted-proxies: uvicorn's own
    # default would believe any X-Forwarded-For sent from 127.0.0.1
    # connections are bounded by the app's own protocol (connections.py), which keeps /health
    # answerable at the cap; uvicorn's limit_concurrency would refuse it too
    shutdown.run(app, app.state.server.drain, host=args.host, port=args.port, log_level=args.log_level,
                 proxy_headers=False, http=app.state.server.connections.protocol())
    return 0


# -- Ray Serve (anydraft/server/deploy.py) ----------------------------------------------------
def serve_on_ray(args: argparse.Namespace, api_key: str | None) -> int:
    from ..errors import AnydraftError

    try:
        from . import deploy
    except ImportError as exc:
        raise AnydraftError(f"anydraft serve --ray needs Ray Serve ({exc.name} is missing): "
                            "pip install 'anydraft[ray]'") from exc
    return deploy.run_in_foreground(args, api_key)
