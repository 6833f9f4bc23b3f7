"""Decoders for the worker threads: one per worker, all sharing the loaded weights."""

from __future__ import annotations

import copy
import ctypes
import logging
import os
from pathlib import Path

from ..planning.settings import SETTINGS

log = logging.getLogger("anydraft.server")


def build_decoders(args) -> tuple[list, int]:
    """``args.max_concurrency`` decoders and the rows of each one's batch (`choose_max_batch`).
    The first loads the models; ``exact="auto"`` is decided for it on that batch, not on the
    most rows `auto` might have taken (`target_rows`); the rest reuse its model objects
    (inference only, each with its own KV cache) and get their own copy of each tokenizer,
    since a Hugging Face tokenizer is not safe to share between threads. Model names are
    shown without local paths (`public_name`)."""
    from ..decoder import Decoder
    from ..models.prefix import default_prefix_cache_mb
    from ..options import decoder_options, progress

    options = decoder_options(args)
    exact_auto = options.get("exact") == "auto"
    if exact_auto:
        options["exact"] = False  # decided below, once the batch is known
    # the prefix cache's memory, shared by the workers (each keeps its own requests' caches)
    total = getattr(args, "prefix_cache_mb", None)
    share = (default_prefix_cache_mb() if total is None else total) / args.max_concurrency
    first = Decoder(**options, rows=target_rows(args), prefix_cache_mb=share)
    max_batch = choose_max_batch(first, args)
    if exact_auto:
        first.choose_exact(args.target, max_batch, progress)
    # names appear in error messages sent to clients: no local paths in them
    first.target.name = public_name(first.target.name)
    if first.drafter is not None:
        first.drafter.name = public_name(first.drafter.name)
    decoders = [first]
    for _ in range(args.max_concurrency - 1):
        d = first.drafter
        dec = Decoder(target=first.target.model, tokenizer=copy.deepcopy(first.target.tokenizer),
                      drafter=d.model if d else None,
                      drafter_tokenizer=copy.deepcopy(d.tokenizer) if d else None, draft=first.draft,
                      exact=first.target.exact, prefix_cache_mb=share)
        # the same models as the first's, named alike (a stats file is keyed by them), and
        # the same measured cost curve to start from
        dec.target.name, dec.target.dtype = first.target.name, first.target.dtype
        dec.estimates.costs.profile = first.estimates.costs.profile
        if d is not None:
            dec.drafter.name, dec.drafter.dtype = d.name, d.dtype
        decoders.append(dec)
    seed_stats(decoders, args.stats)
    return decoders, max_batch


def build_workers(args) -> tuple[list, int]:
    """The workers' decoders and their rows each (`build_decoders`), built in this thread,
    which then hands the cores to the workers (`release_openmp_threads`)."""
    decoders, max_batch = build_decoders(args)
    if max_batch == 1:  # a batch's workers make their rows as they start
        make_caches(decoders)
    release_openmp_threads()
    return decoders, max_batch


def make_caches(decoders: list) -> None:
    """A cache for each worker's target and drafter, made and handed back at start-up, so the
    first request finds it (a llama.cpp context of 8192 cells: 1.3 s the first time for
    Qwen2.5-1.5B on the Zen 5, issue 45)."""
    sessions = [model.new_session() for decoder in decoders  # all at once: one each
                for model in (decoder.target, decoder.drafter) if model is not None]
    for session in sessions:
        getattr(session, "close", lambda: None)()  # a session without one keeps no cache


def release_openmp_threads() -> bool:
    """Let this thread's OpenMP threads go (GNU OpenMP's ``omp_pause_resource_all``); False
    where the process runs no GNU OpenMP (or one without the call). Torch and llama.cpp share
    one libgomp, and each thread that runs a model keeps threads of its own, spinning between
    calls. Once a process holds more of them than it has cores, libgomp stops spinning: every
    barrier inside a model call waits for the kernel to wake a thread. The thread that loaded
    and measured the models keeps its threads while the workers decode: on 2 cores (Xeon) a
    server's SmolLM2 pass took 40 ms against 14 and a PyTorch target's plain step 251 ms
    against 191, until that thread let them go (docs/server.md)."""
    no_load = getattr(os, "RTLD_NOLOAD", None)  # only the libgomp already loaded, if any
    if no_load is None:
        return False
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=no_load)
    except OSError:
        return False
    pause = getattr(gomp, "omp_pause_resource_all", None)
    return pause is not None and pause(1) == 0  # omp_pause_soft


def seed_stats(decoders: list, path: str | None) -> None:
    """``--stats``: every worker starts from the statistics in ``path`` (anydraft/learned.py)
    where it exists, so a restarted server or a new replica drafts well from its first
    request. A file for another pair, or a malformed one, stops the start."""
    from ..options import progress

    if path is None:
        return
    if not os.path.exists(path):
        progress(f"stats: {path} not found, starting cold")
        return
    for dec in decoders:
        seeded = dec.load_stats(path)
    progress(f"stats: {seeded}")


def save_stats(decoders: list, snapshots: list[dict], path: str) -> None:
    """``--stats`` at shutdown: of the statistics each worker last handed over between steps
    (`Scheduler.snapshots`: whole even while a worker is still in a step, its join timed
    out), those of the worker that learned the most (workers learn apart) replace ``path``
    atomically. Of several servers or replicas sharing one file, the last to stop wins. A
    failure is reported, never raised: the shutdown goes on."""
    from .. import learned
    from ..options import progress

    best = max(range(len(decoders)), key=lambda i: learned.observations(snapshots[i]))
    try:
        learned.save(decoders[best], path, snapshots[best])
    except OSError as exc:
        progress(f"stats: could not write {path}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a bug loses the statistics, not the shutdown
        log.error("stats: could not write %s", path, exc_info=exc)
        return
    progress(f"stats: wrote {path} ({learned.observations(snapshots[best])} observations)")


def target_rows(args) -> int:
    """The most rows the server's target may score in one call, for an `auto` backend or dtype
    to choose its path by (and `choose_max_batch` to choose within): ``--max-batch``, else
    the most ``auto`` takes, 1 with several workers (they would share the cores)."""
    if args.max_batch != "auto":
        return args.max_batch
    return 1 if args.max_concurrency > 1 else SETTINGS.max_auto_batch


def choose_max_batch(decoder, args) -> int:
    """``--max-batch``, with 'auto' resolved from the target's measured cost curve
    (hardware/profile.py, cached per machine) by `profile.max_batch`: the fewest rows B <= 16
    whose one-token-each call, taken to cost T(B), gives within 5% of the most throughput
    B / T(B). Where the curve is steep (scoring B tokens costs about B calls) that is 1:
    requests queue as without batching. Also 1 with several workers (they would share the
    cores) and for a backend that cannot batch. `anydraft doctor --batch` measures the batched
    calls themselves and says what this rule would choose from them."""
    rows, target = target_rows(args), decoder.target
    if args.max_batch != "auto" or rows == 1:
        return rows
    if not target.batches:
        return 1
    from ..hardware.profile import max_batch
    from ..models.auto import curve_of
    from ..options import progress

    return max_batch(curve_of(args.target, target, target.backend, progress=progress), rows)


def public_name(name: str | None) -> str | None:
    """A model name fit to show to clients: a local path becomes its last component."""
    if not name:
        return name
    if os.path.isabs(name) or name.startswith(("~", ".")) or os.path.exists(name):
        return Path(name).name or name
    return name
