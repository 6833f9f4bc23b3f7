"""Threads: the models' calls run on the cores other processes leave free; everything else on one.

Measured on 2 cores while another process kept one busy (issue 39): a one-hot over 49,152
entries took 16 ms on torch's 2 threads against 0.05 ms on one, and a llama.cpp call 0.51 s
against 0.04 s. A parallel operation waits at its end for its slowest thread, and a thread
on a busy core runs only when the scheduler gives it a turn (milliseconds); a model call
meets such a wait at every operation of every layer. So:

- anydraft's own work on vocabulary-wide vectors (sampling, verification, drafting
  bookkeeping) is single-threaded (`host_threads`): it is memory-bound, microseconds on one
  core, and gains nothing worth a wait from a second;
- a model call runs on as many threads as cores are free (`model_threads`, `free_cores`),
  never more than the process had before anydraft (torch) or `$ANYDRAFT_LLAMACPP_THREADS`
  (llama.cpp), so that a load slows drafting no more than it slows plain decoding.

Free cores are read from /proc/stat (the CPUs this process may run on, less the time this
process itself used), at most every `READ_EVERY` seconds and only over a recent span
(`STALE_AFTER`); elsewhere every core counts free.
Niced processes' time does not count against a process that is not niced itself, where nice
orders every process (Qwen2.5-1.5B's one-token llama.cpp call on 2 cores: 29 ms quiet, 33 ms
beside a `nice -n 19` spinner, 42 ms on one thread; beside the same spinner un-niced 53 ms), so
a background job does not halve the threads. Where the kernel groups processes by session
(autogroup, on in most desktop distributions), nice orders only a session's own processes and
a niced job from another terminal takes its share like any other: then it counts.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from contextlib import contextmanager

from ..hardware.machine import cpu_ticks

# seconds between two readings of the load (a reading costs ~50 us; loads come and go in seconds)
READ_EVERY = 0.5
# a reading this long after the last one says how busy the cores were while this process made no
# model call (it waited for its client, or for another program), not how busy they are now: it
# starts a new reading and the cores keep the count of before. Seen: a 30-token prompt read on
# Qwen2.5-1.5B (llama.cpp, AMD Zen 5, 2 cores) right after llama-server answered a request
# (idle again) took 424-438 ms on the one thread that reading left against 214-253 ms on two
# (a one-off script, 2026-12-05): every run the bench timed after llama-server's paid it
STALE_AFTER = 2 * READ_EVERY
# a core counts as taken once other processes used this share of one over the last reading.
# Qwen2.5-1.5B's one-token llama.cpp call on 2 cores of an AMD Zen 5 (ms, 2 threads / 1 thread)
# beside an un-niced process busy 100% of the time: 53-61 / 41; 50%: 42 / 41; 20%: 33 / 41;
# 10%: 32 / 41 (a one-off script, 2026-12-04). Past half a core, the second thread waits for
# its turn more than it helps; below, it still saves a quarter of the step
TAKEN_SHARE = 0.5


def niced_compete(autogroup: str = "/proc/sys/kernel/sched_autogroup_enabled") -> bool:
    """Whether other processes' niced time takes cores from this process: where it is niced
    itself (its own time is then counted as nice, and niced work is its equal), or where the
    scheduler shares the CPUs between sessions first (autogroup: seen on with niced test runs
    of another session taking 1.4 of 2 cores beside a benchmark at nice 0)."""
    if not hasattr(os, "getpriority") or os.getpriority(os.PRIO_PROCESS, 0) > 0:
        return True
    try:
        with open(autogroup) as f:
            return f.read().strip() == "1"
    except OSError:  # no such setting: nice orders every process
        return False


class Load:
    """The cores other processes leave free, as /proc/stat said over the last reading."""

    def __init__(self, stat: str = "/proc/stat"):
        self.stat = stat
        try:
            self.cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:  # no affinity on this platform
            self.cpus = list(range(os.cpu_count() or 1))
        self.free = len(self.cpus)
        self.niced = niced_compete()
        self._last = self._read()
        self._lock = threading.Lock()

    def _read(self) -> tuple[float, float, float] | None:
        """(wall seconds, busy core-seconds of our CPUs, this process's CPU seconds), or None
        where /proc/stat cannot be read."""
        try:
            _, busy, own = cpu_ticks(self.cpus, self.stat, self.niced)
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        return time.monotonic(), busy / ticks, own / ticks

    def free_cores(self) -> int:
        """Cores of ours that other processes left free over the last reading (at least 1)."""
        if self._last is None or time.monotonic() - self._last[0] < READ_EVERY:
            return self.free
        with self._lock:
            now = self._read()
            if now is None or now[0] - self._last[0] <= 0:
                return self.free
            wall, busy, own = (a - b for a, b in zip(now, self._last, strict=True))
            self._last = now
            if wall > STALE_AFTER:  # the span says little about now: keep the count, read anew
                return self.free
            others = max(0.0, busy - own) / wall  # cores' worth of other processes' work
            self.free = max(1, len(self.cpus) - max(0, math.ceil(others - TAKEN_SHARE)))
            return self.free


_load: Load | None = None
_state = threading.local()  # per thread: torch's thread count before `host_threads` (OpenMP's is per thread)


def free_cores() -> int:
    global _load
    if _load is None:
        _load = Load()
    return _load.free_cores()


@contextmanager
def host_threads():
    """Run torch single-threaded inside (anydraft's own work), the thread count of before
    restored after; `model_threads` inside gives a model call its threads back."""
    import torch

    if getattr(_state, "before", None) is not None:  # nested: the outer one restores
        yield
        return
    _state.before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(_state.before)
        _state.before = None


def torch_threads() -> int:
    """The threads a torch model call gets: the free cores, at most what the process had."""
    return min(process_threads(), free_cores())


def process_threads() -> int:
    """The threads torch had before anydraft's own work lowered them (`host_threads`)."""
    import torch

    before = getattr(_state, "before", None)
    return before if before is not None else torch.get_num_threads()


@contextmanager
def model_threads(fixed: bool = False):
    """A torch model's call: on `torch_threads` threads inside, the count of before after.
    ``fixed``: on `process_threads` whatever the load, for an exact call (models/exact.py: a
    float32 call rounds differently on 1 and on 2 threads)."""
    import torch

    now = torch.get_num_threads()
    wanted = process_threads() if fixed else torch_threads()
    if wanted == now:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(now)


def on_model_threads(feed):
    """A torch model's feed, run inside `model_threads`."""
    @functools.wraps(feed)
    def wrapped(*args, **kwargs):
        with model_threads():
            return feed(*args, **kwargs)

    return wrapped


def llamacpp_threads() -> int:
    """The threads of a llama.cpp call: `$ANYDRAFT_LLAMACPP_THREADS` where set, else the free
    cores (at most every core this process may run on)."""
    return int(os.environ.get("ANYDRAFT_LLAMACPP_THREADS", 0)) or free_cores()
