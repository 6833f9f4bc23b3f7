"""`anydraft serve` as a Ray Serve application: Ray's proxy in front, replicas behind it.

Each replica is a whole anydraft server: the app of `create_app` (the same routes,
validation, API key, streaming and metrics) over decoders it loads in its own constructor,
so KV caches and the learned acceptance and costs are its own (each starts from
``--stats FILE`` where given, and writes it when it stops: on a cluster, a path on shared
storage). Ray runs the app's lifespan in the replica (`serve.ingress` drives it with
uvicorn's lifespan code), which starts the worker threads; a replica that stops closes them
(and writes ``--stats``).

Three ways in, one set of options (those of `anydraft serve`, as keywords):

- ``anydraft serve --ray [--replicas N | --autoscale MIN:MAX] [--ray-address ADDR]``
- Python: ``serve.run(deploy.app(target="qwen2.5-coder-1.5b", replicas=2))``
- ``serve run anydraft.server.deploy:app_builder target=DIR replicas=2`` or a Serve config
  file whose ``import_path`` is ``anydraft.server.deploy:app_builder`` (docs/ray-serve.yaml).

Ray routes a request to a replica with room (``max_ongoing_requests``: its workers' rows plus
its queue), so each replica queues, batches and answers 429 exactly as a lone server would.
"""

from __future__ import annotations

import argparse
import os
import sys

from ray import serve

from ..errors import AnydraftError
from ..planning.settings import SETTINGS
from .options import add_serve_options, autoscale_range, check_serve_args, server_config

APP_NAME = "anydraft"  # the Serve application's name, and the deployment's
REPLICA_HEADER = "x-anydraft-replica"  # each response names the replica that answered it
RAY_KEYS = ("replicas", "autoscale", "replica_cpus", "replica_gpus", "metrics_port")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # not sys.exit: the caller may be a Serve controller
        raise AnydraftError(f"anydraft serve options: {message}")


def serve_args(options: dict) -> argparse.Namespace:
    """`anydraft serve`'s parsed options from keywords: ``target="DIR", fixed_k=True,
    max_concurrency=2`` (a flag's name with '_' for '-'; True for a switch; a list for a
    comma-separated option). Parsed by the command's own parser: same defaults, same checks."""
    parser = _Parser(prog="anydraft serve")
    add_serve_options(parser)
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)]
    args = parser.parse_args(argv)
    check_serve_args(args)
    return args


def _replica_id() -> tuple[str, int]:
    """This replica's id and its rank among the deployment's replicas on this node."""
    context = serve.get_replica_context()
    rank = getattr(context, "rank", None)
    return context.replica_id.unique_id, int(getattr(rank, "local_rank", 0) or 0)


def llamacpp_threads_as_reserved() -> None:
    """llama.cpp in a replica runs on as many threads as the CPUs the replica reserved, as
    torch does (Ray sets OMP_NUM_THREADS to them), not on every core of the node: the rest is
    left to other replicas and to Ray's proxy, which forwards every streamed chunk (on 2 cores,
    docs/server.md: the Ray path costs 4% where the proxy has a core to itself, 11-24% where
    decoding takes both). ANYDRAFT_LLAMACPP_THREADS, where set, still decides."""
    if os.environ.get("OMP_NUM_THREADS"):
        os.environ.setdefault("ANYDRAFT_LLAMACPP_THREADS", os.environ["OMP_NUM_THREADS"])


@serve.deployment(name=APP_NAME)
@serve.ingress()  # the app is built per replica, after __init__: __serve_build_asgi_app__
class AnydraftReplica:
    def __init__(self, options: dict, metrics_port: int | None = None):
        from .workers import build_workers

        args = argparse.Namespace(**options)
        self.replica, local_rank = _replica_id()
        llamacpp_threads_as_reserved()
        self.decoders, max_batch = build_workers(args)
        self.config = server_config(args, max_batch, args.api_key, replica=self.replica)
        self.metrics_port = metrics_port + local_rank if metrics_port else None

    def __serve_build_asgi_app__(self):
        from .app import create_app

        app = create_app(self.decoders, self.config)
        if self.metrics_port:  # this replica's own /metrics, for Prometheus to scrape directly
            from prometheus_client import start_http_server

            start_http_server(self.metrics_port, registry=app.state.server.metrics.registry)
        return _NameReplica(app, self.replica)


class _NameReplica:
    """ASGI wrapper: adds `REPLICA_HEADER` to every response (which replica answered)."""

    def __init__(self, app, replica: str):
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())
        self.state = app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, named)


def _node_cpus() -> int:
    """The CPUs of a node replicas run on: Ray's count for the smallest live node where Ray
    runs already, else this machine's."""
    import ray

    if ray.is_initialized():
        cpus = [node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")]
        if cpus:
            return max(1, int(min(cpus)))
    return os.cpu_count() or 1


def _actor_options(args: argparse.Namespace, cpus: float | None, gpus: float | None,
                   replicas: int) -> dict:
    """A replica's reservation, from where its models run: one GPU for a torch model on
    cuda (or on 'auto' where the cluster has one), else CPUs: an equal share of a node's
    among the (at most) ``replicas`` replicas, and at least one per worker thread. Ray sets
    OMP_NUM_THREADS to the CPUs reserved, and the replica runs torch and llama.cpp on that
    many threads (`llamacpp_threads_as_reserved`)."""
    if gpus is None:
        gpus = 0.0
        torch_model = args.target_backend != "llamacpp" or (args.drafter_backend or "") == "torch"
        if torch_model and args.device == "cuda":
            gpus = 1.0
        elif torch_model and args.device == "auto":
            import ray

            gpus = 1.0 if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) else 0.0
    if cpus is None:
        cpus = 1.0 if gpus else float(max(args.max_concurrency, _node_cpus() // max(replicas, 1)))
    return {"num_cpus": cpus, "num_gpus": gpus}


def app(**options):
    """The bound Ray Serve application (`serve.run` it). ``options``: `anydraft serve`'s, as
    keywords (`serve_args`), plus ``replicas`` (default 1), ``autoscale`` ("MIN:MAX" or
    (MIN, MAX)), ``replica_cpus`` / ``replica_gpus`` (default: from the models' device) and
    ``metrics_port`` (each replica also serves its /metrics on this port + its rank on its
    node). The API key is ``api_key`` or, where this runs, ANYDRAFT_API_KEY."""
    ray_options = {key: options.pop(key) for key in RAY_KEYS if key in options}
    args = serve_args(options)
    return bind(args, args.api_key or os.environ.get("ANYDRAFT_API_KEY") or None, **ray_options)


def bind(args: argparse.Namespace, api_key: str | None, replicas=None, autoscale=None,
         replica_cpus=None, replica_gpus=None, metrics_port=None):
    """The deployment of parsed `anydraft serve` options, bound (see `app`)."""

    if replicas is not None and autoscale is not None:
        raise AnydraftError("give replicas or autoscale, not both")
    if replicas is not None and int(replicas) < 1:
        raise AnydraftError(f"replicas must be at least 1, got {replicas}")
    # requests a replica takes at once: its rows at work and its own fair queue
    rows = args.max_concurrency * (args.max_batch if args.max_batch != "auto" else SETTINGS.max_auto_batch)
    deployment = {"max_ongoing_requests": rows + args.max_queue}
    if autoscale is not None:
        low, high = (autoscale_range(autoscale) if isinstance(autoscale, str)
                     else tuple(int(v) for v in autoscale))
        deployment["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                            "initial_replicas": max(low, 1),
                                            "target_ongoing_requests": rows}
    else:
        high = deployment["num_replicas"] = int(replicas or 1)
    deployment["ray_actor_options"] = _actor_options(args, replica_cpus, replica_gpus, high)
    fields = {k: v for k, v in vars(args).items() if k != "func"}
    fields["api_key"] = api_key  # resolved here: a replica's environment may lack it
    return AnydraftReplica.options(**deployment).bind(fields, metrics_port)


def app_builder(args: dict):
    """`app` for Ray Serve config files and ``serve run``: its options as one dict."""
    return app(**dict(args))


def run_in_foreground(args: argparse.Namespace, api_key: str | None) -> int:
    """``anydraft serve --ray``: deploy, serve on --host:--port until SIGINT or SIGTERM, then
    remove the application (and stop the Ray instance this command started)."""
    import signal
    import threading

    import ray

    local = args.ray_address is None
    bound = bind(args, api_key, replicas=args.replicas, autoscale=args.autoscale,
                 replica_cpus=args.replica_cpus, metrics_port=args.replica_metrics_port)
    ray.init(address="local" if local else args.ray_address, include_dashboard=False,
             logging_level="WARNING")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(bound, name=APP_NAME, route_prefix="/")
        print(f"anydraft: serving on Ray Serve ({'local Ray' if local else args.ray_address}) "
              f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("anydraft: stopping the Ray Serve application", file=sys.stderr, flush=True)
        if local:
            serve.shutdown()
            _stop_local_ray()
        else:
            serve.delete(APP_NAME)
            ray.shutdown()
    return 0


def _stop_local_ray(grace: float = 10.0) -> None:
    """Stop the Ray instance this process started, and every process of it: its agents can
    outlive a driver that exits right after `ray.shutdown` (seen with Ray 2.60)."""
    import psutil
    import ray

    started = psutil.Process().children(recursive=True)
    ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
