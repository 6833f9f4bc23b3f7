"""`ServerState`: what the route handlers share, built once per app (`create_app`) and found by
each handler as ``request.app.state.server`` (`server_of`)."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Request

from .. import learned
from .config import ServerConfig
from .connections import Connections
from .logprobs import spellings_of
from .metrics import Metrics
from .scheduler import Scheduler, fair_share
from .tools import ToolFormat
from .workers import save_stats

log = logging.getLogger("anydraft.server")

DRAIN_POLL = 0.05  # seconds between checks, while draining, that every request has ended


@dataclass(eq=False)
class ServerState:
    """The decoders (one worker thread each; they should share one model) and the scheduler
    feeding them, the settings, the metrics and the open connections."""

    decoders: list
    config: ServerConfig
    scheduler: Scheduler
    metrics: Metrics
    connections: Connections  # its `protocol()` is what uvicorn runs (cli.py)
    # the target's tokens as logprobs spell them: the event loop's own, no worker's tokenizer
    spellings: tuple[bytes, ...]
    # how the target's chat template takes tools (None: it has none), read at start-up likewise
    tool_format: ToolFormat | None = None
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' "created"

    @classmethod
    def build(cls, decoders: list, config: ServerConfig) -> ServerState:
        # --stats: each worker hands over a copy of what it learned between steps, the one
        # consistent view of statistics its steps change (`save_stats` writes the best)
        snapshot = (lambda decoder: learned.snapshot(decoder.estimates)) if config.stats else None
        scheduler = Scheduler(decoders, config.max_queue, config.max_queued_per_client,
                              config.max_batch, config.min_read, snapshot)
        per_client = config.max_connections_per_client
        connections = Connections(
            config.max_connections,
            fair_share(config.max_connections) if per_client is None else per_client,
            config.head_timeout, config.trusted_proxies)
        metrics = Metrics(scheduler, model=config.model_id, replica=config.replica)
        return cls(decoders, config, scheduler, metrics, connections, spellings_of(decoders[0]),
                   ToolFormat.of(decoders[0].target.tokenizer))

    @property
    def decoder(self):
        """The first worker's decoder: the model, its tokenizer and limits, as every worker has."""
        return self.decoders[0]

    @property
    def context_window(self) -> int:
        return self.decoder.target.context_window

    @asynccontextmanager
    async def lifespan(self, app):
        """The app's life: the workers run, then stop; the learned statistics are saved."""
        self.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.scheduler.close)
            if self.config.stats:
                await asyncio.to_thread(save_stats, self.decoders, self.scheduler.snapshots,
                                        self.config.stats)

    async def drain(self) -> None:
        """Stop taking requests (503 with Retry-After), let the accepted ones finish for up to
        ``config.shutdown_timeout`` s, then end the rest (each open stream with an error event
        and [DONE], one log line each: `Scheduler.close`). shutdown.py calls it on SIGTERM."""
        scheduler, timeout = self.scheduler, self.config.shutdown_timeout
        scheduler.stop_taking()
        log.warning("shutting down: %d requests running, %d waiting; they have %g s to finish",
                    scheduler.active, scheduler.waiting, timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (scheduler.active or scheduler.waiting) and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL)
        await asyncio.to_thread(scheduler.close)


def server_of(request: Request) -> ServerState:
    """The state of the app serving ``request``."""
    return request.app.state.server
