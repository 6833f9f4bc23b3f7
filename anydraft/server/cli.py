"""The `anydraft serve` subcommand. Only argparse here: FastAPI loads when the command runs."""

from __future__ import annotations

import argparse
import ipaddress
import sys

from ..options import add_draft_options, add_model_options


def register(sub) -> None:
    """Add `serve` to the `anydraft` subparsers."""
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (FastAPI + uvicorn)",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, "
                                   "/health and /metrics with speculative decoding.")
    add_model_options(s)
    add_draft_options(s)  # the defaults of every request (requests set only the sampling)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback; anything else is reachable by others)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-concurrency", type=int, default=1,
                   help="generations running at once (one worker thread each, sharing the weights)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a worker; more get 429 with Retry-After")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint except /health "
                        "(default: the ANYDRAFT_API_KEY environment variable, if set)")
    s.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: --target)")
    s.add_argument("--max-body-bytes", type=int, default=2 * 2**20)
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=cmd_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from ..errors import AnydraftError

    if args.max_concurrency < 1:
        raise AnydraftError("--max-concurrency must be at least 1")
    if args.max_queue < 0:
        raise AnydraftError("--max-queue must be >= 0")
    if not 0 < args.port < 65536:
        raise AnydraftError(f"--port must be in 1..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        raise AnydraftError("--max-body-bytes must be at least 1024")
    api_key = args.api_key or os.environ.get("ANYDRAFT_API_KEY") or None
    if not is_loopback(args.host):
        print(f"anydraft: WARNING: binding to {args.host}, which is not a loopback address: "
              "anyone who can reach this machine can use the server"
              + ("" if api_key else " (and no --api-key is set)"), file=sys.stderr, flush=True)

    try:
        import uvicorn

        from .app import ServerConfig, create_app
    except ImportError as exc:
        raise AnydraftError(
            f"anydraft serve needs the server extra ({exc.name} is missing): "
            "pip install 'anydraft[server]'") from exc
    from .workers import build_decoders

    decoders = build_decoders(args)
    config = ServerConfig(model_id=args.served_model_name or args.target, api_key=api_key,
                          max_queue=args.max_queue, max_body_bytes=args.max_body_bytes)
    app = create_app(decoders, config)
    print(f"anydraft: serving {config.model_id!r} (method {decoders[0].draft.method}, "
          f"{len(decoders)} worker{'s' if len(decoders) > 1 else ''}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)
    return 0
