"""Cost curves: how long a model takes to score M new tokens in one call on this machine,
measured, cached per machine, and what a curve says (`rate`; `max_batch`, the rows of a
server's call).

A cost curve is the time a warm session takes to score M new tokens in one call after a
context, for M = 1 (a plain decoding step) up to 33 (a long verification). Speculative
decoding pays where the curve is flat; plain decoding lives at M = 1. Measured once per
(machine, model, backend, dtype) and cached in ``$ANYDRAFT_CACHE/profiles/``, under the key
models/auto.py `model_key` gives a model's path.

Below the models: `measure` times the sessions of the models it is handed, whatever runs them;
which paths of a model are measured, and the one ``auto`` keeps, is models/auto.py's choice.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..atomic import cache_dir, write_text
from ..planning.estimates import Acceptance
from .machine import Machine, cpu_ticks, this_machine

# tokens scored in one call: each size up to 5, where short drafts and small batches score and a
# steep curve bends (llama.cpp: 3 tokens cost more than the line from 2 to 5 says), then sparser
SIZES = (1, 2, 3, 4, 5, 9, 17, 33)
CONTEXT = 200  # tokens already in the cache, as in a short chat
REPEATS = 3  # median of this many calls per size (these machines are noisy)
# other processes using more than this share of all cores make the machine busy
BUSY_SHARE = 0.25


def measure(models: dict, sizes=SIZES, repeats=REPEATS, context_length: int = CONTEXT
            ) -> dict[str, dict[int, float]]:
    """Seconds to score M tokens in one call after ``context_length`` tokens (fewer where the
    window is shorter), for each M in ``sizes``, for each of ``models`` (name -> a loaded model:
    its ``new_session()``, ``logits_width`` and ``tokenizer``, models/loaded.py `LoadedModel`).
    The models take turns call by call, so a change in the machine's load hits every one alike."""
    sessions, ids, context = {}, {}, {}
    for name, loaded in models.items():
        session = sessions[name] = loaded.new_session()
        n = context[name] = min(context_length, max(1, session.max_length - max(sizes) - 2))
        width = min(loaded.logits_width, len(loaded.tokenizer))
        ids[name] = [(7919 * i + 13) % width for i in range(n + max(sizes) + 1)]  # any ids cost the same
        session.feed(ids[name][:n], rows=1)
        session.feed(ids[name][n:n + 1], rows=1)  # warm-up: first calls pay one-off costs
        session.rollback(n)
    times = {name: {m: [] for m in sizes} for name in models}
    for m in sizes:
        for _ in range(repeats):
            for name, session in sessions.items():
                n = context[name]
                start = time.perf_counter()
                session.feed(ids[name][n:n + m], rows=m)
                times[name][m].append(time.perf_counter() - start)
                session.rollback(n)
    return {name: {m: statistics.median(t) for m, t in curve.items()} for name, curve in times.items()}


def busy(seconds: float = 0.5) -> bool:
    """Whether other processes keep the cores busy: measurements taken now say little about
    this machine, so they are used for this run but not cached. Reads the CPU time the whole
    machine and this process spent over ``seconds`` (a load average would count this
    process's own recent work)."""
    try:
        before = cpu_ticks()
        time.sleep(seconds)
        after = cpu_ticks()
    except OSError:  # no /proc: assume a quiet machine
        return False
    total, used, mine = (b - a for a, b in zip(before, after, strict=True))
    return total > 0 and (used - mine) / total > BUSY_SHARE


def _path(machine: Machine) -> Path:
    return cache_dir() / "profiles" / f"{machine.key}.json"


def entry(model_key: str, section: str = "curves", machine: Machine | None = None):
    """What this machine's cache holds for ``model_key`` in ``section`` ("curves": cost curves;
    "exact": exact scoring's cost, models/exact_cost.py), or None; measured with huge pages
    on or off (`store`)."""
    path = _path(machine or this_machine())
    if not path.is_file():
        return None
    found = json.loads(path.read_text()).get(section, {}).get(model_key)
    return None if found is None else found["measured"]


def store(model_key: str, value, section: str = "curves", machine: Machine | None = None) -> None:
    """Cache ``value`` as ``{"measured": value, "hugepages": on}``: the huge-page state is how
    the measuring process was started, not part of the machine's key (`Machine.key`), so it is
    kept beside what it may have sped up."""
    machine = machine or this_machine()
    path = _path(machine)
    data = json.loads(path.read_text()) if path.is_file() else {"machine": machine.lines()}
    data.setdefault(section, {})[model_key] = {"measured": value, "hugepages": machine.hugepages}
    write_text(path, json.dumps(data, indent=1))


def cached(model_key: str, machine: Machine | None = None) -> dict[int, float] | None:
    curve = entry(model_key, machine=machine)
    return None if curve is None else {int(m): s for m, s in curve.items()}


def save(model_key: str, curve: dict[int, float], machine: Machine | None = None) -> None:
    store(model_key, curve, machine=machine)


def rate(curve: dict[int, float]) -> float:
    """Expected tokens per second of the curve's best step, plain or speculative, with the
    policy's prior acceptance (nothing measured about any drafter yet): rewards a flat curve
    and a fast plain step alike."""
    prior = Acceptance()
    return max(prior.expected_tokens(m - 1) / seconds for m, seconds in curve.items())


# `--max-batch auto` leaves out the rows that add less than this share of the most throughput
# the curve allows: each row would slow every row's step for little (a tie goes to fewer rows)
BATCH_TOLERANCE = 0.05
# ... and batches nothing where B rows yield less than this much more than one row: a steep
# curve (2 tokens nearly 2 calls) would slow each step ~2x for a few percent more throughput
MIN_BATCH_GAIN = 1.25


def max_batch(costs: dict[int, float], limit: int) -> int:
    """The rule of ``--max-batch auto`` (server/workers.py `choose_max_batch`): the fewest rows
    B <= ``limit`` whose call of B rows x 1 token, costing T(B), yields within `BATCH_TOLERANCE`
    of the most throughput B / T(B) the curve allows; 1 where that is not `MIN_BATCH_GAIN`
    times one row's. Throughput, not each row's step time, is what a server under load
    should maximise: when clients outnumber the rows they queue, and by Little's law a
    request's wait is the work ahead of it divided by the throughput, so rows that raise it
    serve every client sooner, even where each step slows (llama-server fills all its
    ``--parallel`` slots alike). Under light load the batch holds only the requests there
    are. All rows where the curve is flat, one where B rows cost about B calls. ``costs`` maps
    B (or, for the one-sequence curve, tokens scored, taken as B rows x 1 token) to seconds
    and holds B = 1; read linearly between the sizes given, flat past the last."""
    import numpy as np  # not at import: the command line starts without it

    rows = np.arange(1, limit + 1)
    throughput = rows / _cost(costs, rows)
    if throughput.max() < MIN_BATCH_GAIN * throughput[0]:
        return 1
    return int(np.argmax(throughput >= (1 - BATCH_TOLERANCE) * throughput.max())) + 1


def _cost(costs: dict[int, float], rows):
    """T at ``rows`` (a number or an array): linear between the sizes measured, flat past the last."""
    import numpy as np

    sizes = sorted(costs)
    return np.interp(rows, sizes, [costs[b] for b in sizes])


def served(curve: dict[int, float], rows: int, batches: bool = True) -> tuple[int, float]:
    """``(B, tokens/s)``: the rows of up to ``rows`` that `--max-batch auto` takes (1 where the
    path cannot batch), and what a call of B one-token rows yields, B / T(B)."""
    b = max_batch(curve, rows if batches else 1)
    return b, b / float(_cost(curve, b))


def server_rates(curve: dict[int, float], rows: int, batches: bool = True):
    """Plain decoding's tokens/s at each load of 1..``rows`` requests decoding at once: B =
    min(load, `max_batch`) one-token rows a call (1 where the path cannot batch,
    ``batches`` False), B / T(B). A server's batch holds the requests that are there."""
    import numpy as np

    b = np.minimum(np.arange(1, rows + 1), max_batch(curve, rows if batches else 1))
    return b / _cost(curve, b)


def server_path(curves: dict[str, dict[int, float]], rows: int, batches) -> str:
    """The path of ``curves`` a server of up to ``rows`` rows a call runs its target on: the
    one that keeps closest to the best path at whatever load comes, from one request to
    ``rows`` at once (the most, over paths, of its least `server_rates` share of the best
    path's at each load: minimax regret). A path that runs one request fastest but cannot
    batch, or one that batches well but runs one request slowly, loses at one end.
    ``batches``: path -> whether it can (models/auto.py `batches`). Plain rates: what a drafter adds depends
    on the drafter, and favours flat curves (docs/server.md)."""
    import numpy as np

    rates = {path: server_rates(c, rows, batches(path)) for path, c in curves.items()}
    best = np.max(list(rates.values()), axis=0)
    return max(rates, key=lambda path: float(np.min(rates[path] / best)))
