"""The scheduler a benchmark runs under. Time it at normal priority, on an idle machine.

Under a real-time policy (`chrt -f`) two things go wrong on Linux (a 2-core Zen 5, 2026-12-05):

- Real-time threads may use only `kernel.sched_rt_runtime_us` of every `sched_rt_period_us`
  (0.95 s of 1 s by default). Decoding keeps the cores busy for seconds, so once a second a
  step waits out the rest of the period: Qwen2.5-1.5B's one-token llama.cpp step took 75-80 ms
  every ~31 steps against 27-30 otherwise (mean 28.7-29.8 ms against 28.3-28.5 at normal
  priority, alternated; docs/llama-server.md).
- A server's llama.cpp threads spin between operations, keeping its event loop and the clients
  off the cores until a request ends: every stream arrives in one burst (docs/server.md).
  `bench-serve` therefore refuses it; `bench` (one process) says so in its notes.
"""

from __future__ import annotations

import os

from ..errors import AnydraftError


def realtime() -> bool:
    """Whether this process runs under a real-time policy (SCHED_FIFO or SCHED_RR)."""
    policies = {getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name)}
    return hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) in policies


def refuse_realtime() -> None:
    """`bench-serve`'s check: a real-time policy, inherited by the servers, holds every stream
    back until its request ends (ITL and TPOT 0, TTFT the whole request)."""
    if realtime():
        raise AnydraftError("bench-serve runs under a real-time scheduler (chrt): its servers' "
                            "spinning threads would hold the streams back until each request "
                            "ends; run it at normal priority (without chrt) on an idle machine")


def throttle_note(proc: str = "/proc/sys/kernel") -> str | None:
    """`bench`'s note where it runs under a real-time policy that the kernel throttles (None
    elsewhere, or where the limits cannot be read)."""
    if not realtime():
        return None
    try:
        with open(f"{proc}/sched_rt_runtime_us") as f:
            runtime = int(f.read())
        with open(f"{proc}/sched_rt_period_us") as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    if runtime < 0 or runtime >= period:
        return None  # no throttling
    return (f"real-time scheduler (chrt): Linux lets it run {runtime // 1000} ms of every "
            f"{period // 1000} ms (kernel.sched_rt_runtime_us), so a step that meets the limit "
            "waits out the period; times are noisier and slower than at normal priority")
