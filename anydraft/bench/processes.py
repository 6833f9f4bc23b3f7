"""The child processes a benchmark runs (an `anydraft serve`, a llama-server): a free port for
one, and stopping one."""

from __future__ import annotations


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc, grace: float) -> None:
    """SIGTERM ``proc`` if it still runs, then SIGKILL after ``grace`` seconds without an exit."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
