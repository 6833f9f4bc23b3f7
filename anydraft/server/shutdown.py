"""A clean shutdown: uvicorn's server with a drain in front of its own shutdown (issue 42).

The first SIGTERM (or SIGINT) drains: the app stops taking requests (503 with Retry-After),
lets the accepted ones finish for up to ``--shutdown-timeout`` seconds, then ends each one
still open with an error event and ``[DONE]`` (`ServerState.drain`); only then
does uvicorn's shutdown close the connections, which by then have nothing left to send. A
second signal ends the process at once. Either way it exits 0: uvicorn re-raises a signal it
caught once it has shut down, which made a clean drain exit as killed by SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable

import uvicorn

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# seconds uvicorn waits for connections after the drain: the drained streams only have their
# last events to write, and anything else (a body still uploading) is cut
AFTER_DRAIN = 1.0


def run(app, drain: Callable[[], Awaitable[None]], **options) -> None:
    """``uvicorn.run(app, **options)``, draining with ``drain`` on the first signal."""
    DrainingServer(uvicorn.Config(app, **options), drain).run()


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]):
        config.timeout_graceful_shutdown = AFTER_DRAIN
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self._draining or self._loop is None:  # a second signal (or one before start-up)
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        # a signal handler runs between two bytecodes of the loop's thread: hand it over
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._task = self._loop.create_task(self._drain_then_exit())  # held: tasks are weak

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        finally:
            self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's own, less raising the caught signal again afterwards (see above)."""
        if threading.current_thread() is not threading.main_thread():  # only it gets signals
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
