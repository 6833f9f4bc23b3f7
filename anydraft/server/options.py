"""The options of `anydraft serve` and their checks, below the command (cli.py) and the Ray
Serve deployment (deploy.py) that both read them. Only argparse here: FastAPI loads when the
command runs."""

from __future__ import annotations

import argparse
import ipaddress
import os

from ..options import add_draft_options, add_model_options
from ..planning.settings import SETTINGS
from .config import ServerConfig
from .connections import is_loopback


def add_serve_options(s) -> None:
    """The options of `anydraft serve`, on ``s`` (its parser)."""
    add_model_options(s)
    add_draft_options(s)  # the defaults of every request (requests set only the sampling)
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback; anything else is reachable by others)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-concurrency", type=int, default=1,
                   help="generations running at once (one worker thread each, sharing the weights)")
    s.add_argument("--max-batch", type=_batch, default="auto",
                   help="generations each worker runs together, their candidates scored in one "
                        "target call (continuous batching); 'auto' (default): from the target's "
                        "measured cost curve, the rows giving the most throughput per second of "
                        "step latency (all 16 where the curve is flat, 1 where scoring more tokens "
                        "costs proportionally more, and with --max-concurrency above 1); a number "
                        "bounds each request's slowdown (`anydraft doctor --batch`)")
    s.add_argument("--min-read", type=int, default=SETTINGS.min_prefill, metavar="N",
                   help="the fewest prompt tokens each batched step reads for a joining request "
                        f"(default {SETTINGS.min_prefill}): fewer keep the other requests' inter-token latency "
                        "steadier where scoring more tokens costs more (CPUs), more bring a "
                        "joining request's first token sooner")
    s.add_argument("--prefix-cache-mb", type=float, default=None, metavar="MB",
                   help="MiB of KV caches kept after requests, shared by the workers, so that a "
                        "prompt starting as an earlier one (the next turn of a conversation) reads "
                        "only its new tokens; 0 turns it off (default: 1/16 of this machine's "
                        "memory, at most 1024)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a worker; more get 429 with Retry-After")
    s.add_argument("--max-queued-per-client", type=int, default=None,
                   help="requests one client may have waiting (default: a quarter of --max-queue)")
    s.add_argument("--trusted-proxies", type=_csv, default=(),
                   help="comma-separated addresses or networks of reverse proxies whose "
                        "X-Forwarded-For names the client (default: trust none)")
    s.add_argument("--allowed-hosts", type=_csv, default=None,
                   help="comma-separated Host names to answer, '*' for any (default: loopback "
                        "names when bound to loopback, else any)")
    s.add_argument("--cors-origins", type=_csv, default=(),
                   help="comma-separated browser origins allowed by CORS (default: none)")
    s.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a request may take from arrival; an answer cut short ends "
                        "with finish_reason 'length', one still queued gets 503 (default: none)")
    s.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="longest prompt accepted, in tokens (default: the context window)")
    s.add_argument("--max-connections", type=int, default=256,
                   help="open connections served at once; requests on more get 503 (except "
                        "/health, which a few more connections keep answerable)")
    s.add_argument("--max-connections-per-client", type=int, default=None, metavar="N",
                   help="open connections one client address may hold; more are refused with "
                        "503 (default: a quarter of --max-connections; --trusted-proxies are "
                        "not capped)")
    s.add_argument("--head-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="seconds a connection has to send a complete request head (after it "
                        "opens, or after its last answer); slower ones get 408 and are closed")
    s.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds to receive a request body; slower uploads get 408")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint except /health "
                        "(default: the ANYDRAFT_API_KEY environment variable, if set)")
    s.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: --target; a local path: its last part)")
    s.add_argument("--max-body-bytes", type=int, default=2 * 2**20)
    s.add_argument("--stats", type=os.path.abspath, default=None, metavar="FILE",
                   help="learned drafting statistics (acceptance, costs): every worker starts "
                        "from FILE where it exists and the server writes FILE at shutdown, so "
                        "the next start (or a new replica) drafts well at once; with --ray, a "
                        "path every replica can reach (shared storage on a cluster)")
    s.add_argument("--allow-special-in-content", action="store_true",
                   help="read special tokens typed in chat messages (<|im_start|>, ...) as control "
                        "tokens, as the chat template's own are; by default they are text, so a "
                        "user cannot open turns of their own")
    s.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM or Ctrl-C, seconds the running requests have to finish while "
                        "new ones get 503; then each still open ends with an error event "
                        "(default 30; a second signal ends at once)")
    s.add_argument("--log-level", default="info")
    add_ray_options(s)


def _batch(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number >= 1, got {text!r}")
    return value


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def check_serve_args(args: argparse.Namespace) -> None:
    """The option checks that need no model (AnydraftError naming the option)."""
    from ..errors import AnydraftError

    if args.max_concurrency < 1:
        raise AnydraftError("--max-concurrency must be at least 1")
    if args.max_queue < 0:
        raise AnydraftError("--max-queue must be >= 0")
    if not 0 < args.port < 65536:
        raise AnydraftError(f"--port must be in 1..65535, got {args.port}")
    if args.max_body_bytes < 1024:
        raise AnydraftError("--max-body-bytes must be at least 1024")
    for name in ("max_queued_per_client", "max_prompt_tokens", "max_connections",
                 "max_connections_per_client", "min_read"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise AnydraftError(f"--{name.replace('_', '-')} must be at least 1")
    if not args.shutdown_timeout >= 0:
        raise AnydraftError("--shutdown-timeout must be a number of seconds >= 0")
    for name in ("request_timeout", "body_timeout", "head_timeout"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise AnydraftError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if args.stats is not None and not os.path.isdir(os.path.dirname(args.stats)):
        raise AnydraftError(f"--stats: folder {os.path.dirname(args.stats)} does not exist: "
                            "create it, or name a file in a folder that does")
    _proxies(args)


def _proxies(args) -> tuple:
    from ..errors import AnydraftError

    try:
        return tuple(ipaddress.ip_network(p, strict=False) for p in args.trusted_proxies)
    except ValueError as exc:
        raise AnydraftError(f"--trusted-proxies: {exc}") from None


def server_config(args: argparse.Namespace, max_batch: int, api_key: str | None, **extra):
    """The `ServerConfig` of the options (``extra``: more of its fields)."""
    from .workers import public_name

    allowed_hosts = args.allowed_hosts
    if allowed_hosts is None and not is_loopback(args.host):
        allowed_hosts = ("*",)  # reachable by name from elsewhere: any Host may be right
    return ServerConfig(
        model_id=args.served_model_name or public_name(args.target), api_key=api_key,
        max_queue=args.max_queue, max_queued_per_client=args.max_queued_per_client, max_batch=max_batch,
        min_read=args.min_read,
        max_body_bytes=args.max_body_bytes, body_timeout=args.body_timeout,
        request_timeout=args.request_timeout, max_prompt_tokens=args.max_prompt_tokens,
        trusted_proxies=_proxies(args),
        allowed_hosts=tuple(h.lower().strip("[]") for h in allowed_hosts) if allowed_hosts else None,
        cors_origins=tuple(args.cors_origins), stats=args.stats,
        shutdown_timeout=args.shutdown_timeout, max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        head_timeout=args.head_timeout, allow_special_in_content=args.allow_special_in_content,
        **extra)


# -- Ray Serve (anydraft/server/deploy.py) ----------------------------------------------------
def add_ray_options(s) -> None:
    g = s.add_argument_group("Ray Serve (pip install 'anydraft[ray]')")
    g.add_argument("--ray", action="store_true",
                   help="serve as a Ray Serve application: Ray's proxy on --host:--port, "
                        "replicas behind it, each a whole server with its own models")
    scale = g.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=None,
                       help="replicas to run (default 1)")
    scale.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                       help="let Ray run between MIN and MAX replicas, by requests in flight")
    g.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                   help="the Ray cluster to deploy on ('auto': the one started on this machine "
                        "by `ray start`); default: start a local Ray instance for this command")
    g.add_argument("--replica-cpus", type=float, default=None,
                   help="CPUs each replica reserves (and its torch threads); default: "
                        "--max-concurrency on the CPU, 1 with a GPU")
    g.add_argument("--replica-metrics-port", type=int, default=None, metavar="PORT",
                   help="each replica also serves its own /metrics on PORT + its rank on its "
                        "node, for Prometheus to scrape replica by replica")


def autoscale_range(text: str) -> tuple[int, int]:
    from ..errors import AnydraftError

    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not sep or lo < 0 or hi < 1 or lo > hi:
        raise AnydraftError(f"--autoscale takes MIN:MAX, two whole numbers with 0 <= MIN <= MAX "
                            f"and MAX >= 1, e.g. 1:4; got {text!r}")
    return lo, hi


def check_ray_options(args: argparse.Namespace) -> None:
    from ..errors import AnydraftError

    given = [flag for flag, value in (("--replicas", args.replicas), ("--autoscale", args.autoscale),
                                      ("--ray-address", args.ray_address),
                                      ("--replica-cpus", args.replica_cpus),
                                      ("--replica-metrics-port", args.replica_metrics_port))
             if value is not None]
    if given and not args.ray:
        raise AnydraftError(f"{given[0]} needs --ray")
    if args.replicas is not None and args.replicas < 1:
        raise AnydraftError(f"--replicas must be at least 1, got {args.replicas}")
    if args.autoscale is not None:
        autoscale_range(args.autoscale)
    if args.replica_cpus is not None and not args.replica_cpus > 0:
        raise AnydraftError("--replica-cpus must be a positive number")
    if args.replica_metrics_port is not None and not 0 < args.replica_metrics_port < 65536:
        raise AnydraftError("--replica-metrics-port must be in 1..65535")
