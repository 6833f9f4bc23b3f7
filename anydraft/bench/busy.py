"""`anydraft bench --busy-cores N`: the measured runs beside N processes that keep a core busy.

A machine that also serves something else (issue 39: 2 cores, a server under load on one) is
where thread settings decide speed: a 96-token run took 90 s there instead of 7 s. The bench
starts N busy-spinning processes after its warm-up and stops them after the last measured run,
so every row, plain decoding's included, meets the same load (results.json: ``busy_cores``).

The spinners run at the ordinary policy and priority whatever the bench runs at: a load, as
a server is, that the scheduler shares the cores with. Under `chrt -f` the bench's own threads
then always take the cores first, and the spinners load nothing: time a busy machine without it.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

from .processes import stop_process

# what each busy process runs: pure Python arithmetic, no memory traffic to speak of
SPIN = "while True: pass"
STOP_GRACE = 2.0  # seconds a spinner gets to end after SIGTERM before SIGKILL


@contextmanager
def busy_cores(n: int):
    """``n`` busy-spinning processes while inside (none for 0); their pids are yielded."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          preexec_fn=_ordinary))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            stop_process(p, STOP_GRACE)


def _ordinary() -> None:
    """In a spinner before it starts: the ordinary scheduling policy, not the bench's (a
    realtime spinner would hold its core against every other process of the machine)."""
    import os

    if hasattr(os, "sched_setscheduler"):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def note(n: int) -> str:
    return (f"{n} busy-spinning process{'es' if n != 1 else ''} ran beside every measured run "
            f"(--busy-cores {n}; the warm-up ran without)")
