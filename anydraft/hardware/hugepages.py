"""Transparent huge pages for the models' weights (Linux).

A decoding step streams every weight once: about 1 GB for Qwen2.5-1.5B Q4_K_M, whose
repacked llama.cpp weights live in memory the program allocated, in 4 KiB pages unless the
kernel is told otherwise. Where transparent huge pages are on only for memory that asks for
them (`/sys/kernel/mm/transparent_hugepage/enabled` = ``madvise``, the default of many
distributions), neither llama.cpp nor PyTorch asks, and the step pays a TLB miss every 4 KiB.
glibc asks for every large allocation when started with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
(glibc 2.35 or later): Qwen2.5-1.5B's one-token llama.cpp step then took 25.9-29.7 ms against
28.3-31.7 (median step of 4 answers, 4 processes each way, alternated; AMD Zen 5, 2 cores,
2026-12-05; docs/hardware.md "Huge pages").

The tunable is read when a process starts, so the `anydraft` command starts itself again with it
(`reexec`: same process id, arguments and environment, plus the tunable), once. A program that
imports anydraft sets it itself (`anydraft doctor` says whether it is on). Programs that anydraft
runs for comparison (llama-server in `bench`) get the environment as the user had it
(`as_users_run`). ``ANYDRAFT_HUGEPAGES=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"
ADDED = "ANYDRAFT_ADDED_GLIBC_TUNABLES"  # the GLIBC_TUNABLES value before anydraft added its own
OFF = "ANYDRAFT_HUGEPAGES"  # "0": leave memory as the system has it
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
GLIBC_WITH_TUNABLE = (2, 35)


def thp_mode(path: str = THP) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise", "never"), or None where it
    cannot be read (not Linux, or no THP)."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    chosen = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else None


def glibc_version() -> tuple[int, int] | None:
    try:
        name = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
        major, minor = name.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError, OSError, IndexError):
        return None


def tunable_set(env) -> bool:
    return any(part.split("=")[0] == TUNABLE for part in env.get("GLIBC_TUNABLES", "").split(":"))


def state(env=None, mode: str | None = None, glibc: tuple | None = None) -> tuple[bool, str]:
    """``(on, why)``: whether this process's large allocations get huge pages."""
    env = os.environ if env is None else env
    mode = thp_mode() if mode is None else mode
    glibc = glibc_version() if glibc is None else glibc
    if mode is None:
        return False, "no transparent huge pages here"
    if mode == "always":
        return True, "transparent huge pages: always"
    if mode == "never":
        return False, "transparent huge pages: never (the system turned them off)"
    if tunable_set(env):
        if glibc is None or glibc < GLIBC_WITH_TUNABLE:
            return False, f"{SETTING} is set, but glibc {glibc or '?'} predates it (2.35)"
        return True, f"transparent huge pages: madvise; {SETTING} asks for them"
    if env.get(OFF) == "0":
        return False, f"transparent huge pages: madvise; {OFF}=0 leaves them off"
    return False, (f"transparent huge pages: madvise, not asked for: start the program with "
                   f"GLIBC_TUNABLES={SETTING}")


def wanted(env, mode: str | None, glibc: tuple | None) -> bool:
    """Whether starting again with the tunable would give this process huge pages."""
    return (sys.platform.startswith("linux") and mode == "madvise" and env.get(OFF) != "0"
            and glibc is not None and glibc >= GLIBC_WITH_TUNABLE and not tunable_set(env))


def with_tunable(env) -> dict:
    """``env`` with the tunable added to GLIBC_TUNABLES, remembering what was there."""
    before = env.get("GLIBC_TUNABLES", "")
    return {**env, "GLIBC_TUNABLES": f"{before}:{SETTING}" if before else SETTING, ADDED: before}


def as_users_run(env=None) -> dict:
    """``env`` (default: this process's) without what `reexec` added: as the user started it."""
    env = dict(os.environ if env is None else env)
    if ADDED in env:
        before = env.pop(ADDED)
        if before:
            env["GLIBC_TUNABLES"] = before
        else:
            env.pop("GLIBC_TUNABLES", None)
    return env


def started_as_anydraft(argv: list[str]) -> bool:
    """Whether this process is the `anydraft` command (its script, or ``python -m anydraft``),
    not a program that runs anydraft's entry point inside itself: only the command is started
    again."""
    first = argv[0] if argv else ""
    return (os.path.basename(first) in ("anydraft", "anydraft.exe")
            or first.endswith(os.path.join("anydraft", "__main__.py")))


def reexec() -> None:
    """Start this command again with the tunable, where it would give huge pages (the `anydraft`
    command does this first). Nothing happens where it would not, or if starting fails."""
    if not wanted(os.environ, thp_mode(), glibc_version()):
        return
    argv = getattr(sys, "orig_argv", None)
    if not argv or not sys.executable or not started_as_anydraft(sys.argv):
        return
    try:
        os.execve(sys.executable, argv, with_tunable(os.environ))
    except OSError:
        pass  # run on without huge pages
