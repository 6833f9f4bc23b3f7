"""Each model's measured cost curve per execution path, cached per machine, and the choice
``dtype="auto"`` makes from it.

A cost curve is the time a warm session takes to score M new tokens in one call after a
context, for M = 1 (a plain decoding step) up to 33 (a long verification). Speculative
decoding pays where the curve is flat; plain decoding lives at M = 1. Measured once per
(machine, model, backend, dtype) and cached in ``$ANYDRAFT_CACHE/profiles/``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..atomic import write_text
from ..models import catalog
from ..models.loading import resolve
from ..models.threads import cpu_ticks
from ..planning.estimates import Acceptance
from .machine import Machine, this_machine

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
    window is shorter), for each M in ``sizes``, for each of ``models`` (name -> LoadedModel).
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
    return catalog.cache_dir() / "profiles" / f"{machine.key}.json"


def entry(model_key: str, section: str = "curves", machine: Machine | None = None):
    """What this machine's cache holds for ``model_key`` in ``section`` ("curves": cost curves;
    "exact": exact scoring's cost, hardware/exact_cost.py), or None; measured with huge pages
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


def model_key(spec: str, backend: str, dtype: str, device: str) -> str:
    assert device in ("cpu", "cuda"), f"device {device!r} not resolved (resolve_device)"
    source = resolve(spec)
    return f"{source.cache_key or source.path}|{backend}|{dtype}|{device}"


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
    ``batches``: path -> whether it can (`batches`). Plain rates: what a drafter adds depends
    on the drafter, and favours flat curves (docs/server.md)."""
    import numpy as np

    rates = {path: server_rates(c, rows, batches(path)) for path, c in curves.items()}
    best = np.max(list(rates.values()), axis=0)
    return max(rates, key=lambda path: float(np.min(rates[path] / best)))


def batches(path: str) -> bool:
    """Whether a torch path scores rows in one call (a compiled static cache holds one)."""
    from ..models.static import SUFFIX

    return not path.endswith(SUFFIX)


def fastest(curves: dict[str, dict[int, float]], rows: int = 1) -> str:
    """The torch path ``auto`` takes for a target of up to ``rows`` rows a call: for one, the
    best `rate` (its plain and speculative steps); for a server, `server_path`."""
    if rows == 1:
        return max(curves, key=lambda path: rate(curves[path]))
    return server_path(curves, rows, batches)


def candidates(device: str) -> tuple[str, ...]:
    """The execution paths ``auto`` measures for a torch model: float32 on the default kernels
    and on oneDNN (models/kernels.py) where it runs; bfloat16 only where the CPU computes it
    natively (emulated, its cost grows with the tokens scored: a verification costs nearly a
    plain step per token); float16 on CUDA."""
    import torch

    from ..models.kernels import SUFFIX, available

    if str(device).startswith("cuda"):
        paths = ["bfloat16", "float16", "float32"]
    else:
        paths = ["float32"]
        if available(torch.float32, device):
            paths.append("float32" + SUFFIX)
        if this_machine().native_bf16:
            paths.append("bfloat16")
            if available(torch.bfloat16, device):
                paths.append("bfloat16" + SUFFIX)
    return tuple(paths)


def torch_paths(spec: str, device: str, compile: bool = False) -> tuple[str, ...]:
    """The `candidates` ``auto`` weighs for ``spec``, and each plain dtype compiled on a static
    cache (models/static.py) where ``compile`` asks for it, on CUDA, or once measured.

    Compiling takes minutes, and a CPU may run the compiled model slower (docs/hardware.md):
    on CUDA, where CUDA graphs take the launch overhead away, the compiled paths are measured
    with the others; on a CPU once `anydraft doctor --compile` has measured them."""
    from ..models.static import SUFFIX

    paths = candidates(device)
    wanted = compile or device == "cuda"
    return paths + tuple(p + SUFFIX for p in paths if "+" not in p and (
        wanted or cached(model_key(spec, "torch", p + SUFFIX, device)) is not None))


def curves(spec: str, backend: str, paths: tuple[str, ...], device: str = "cpu", progress=None,
           remeasure: bool = False, rows: int = 1, load=None) -> tuple[dict, object]:
    """``({path: curve}, the best path's LoadedModel or None)`` for ``spec`` on ``backend``:
    cached curves where there are any, the others measured one model at a time (a few models
    of a few GB each would not fit in memory together). The best model (`fastest` for
    ``rows``) stays loaded when this call loaded it, so it is not loaded twice. ``load``:
    models/backends.py `load`, for the paths not cached (it is above this module: its
    ``auto`` asks `choose_backend` and `choose_dtype`, which hand it on)."""
    found, keep = {}, None
    for path in paths:
        curve = None if remeasure else cached(model_key(spec, backend, path, device))
        if curve is not None:
            found[path] = curve
            continue
        # the backend is given, and the path is its own ("gguf" names llama.cpp's curve)
        assert load is not None, f"{spec} on {path} is not measured here: pass load"
        model = load(spec, backend, dtype=path, device=device, dtype_given=False)
        found.update(_measure_and_save(spec, backend, device, {path: model}, progress))
        if fastest(found, rows) == path:
            keep = model
        del model  # a slower model goes before the next one loads
    best = fastest(found, rows)
    return {p: found[p] for p in paths}, (keep if keep is not None and keep.dtype == best else None)


def curve_of(spec: str, loaded, backend: str, progress=None) -> dict[int, float]:
    """The cost curve of a model already loaded from ``spec`` (cached, or measured now), on
    the device it is on (llama.cpp: the CPU)."""
    dtype, device = loaded.dtype or "gguf", loaded.device.type
    curve = cached_curve(spec, loaded, backend)
    return curve or _measure_and_save(spec, backend, device, {dtype: loaded}, progress)[dtype]


def cached_curve(spec: str, loaded, backend: str | None = None) -> dict[int, float] | None:
    """`curve_of` where this machine measured it before, else None (nothing is measured)."""
    return cached(model_key(spec, backend or loaded.backend, loaded.dtype or "gguf", loaded.device.type))


def _measure_and_save(spec: str, backend: str, device: str, models: dict, progress) -> dict:
    quiet = not busy()
    if progress:
        progress(f"measuring {spec} ({backend}: {', '.join(models)}; once per machine)"
                 + ("" if quiet else ": the machine is busy, so this is not cached"))
    found = measure(models)
    if quiet:
        for dtype, curve in found.items():
            save(model_key(spec, backend, dtype, device), curve)
    return found


def choose_dtype(spec: str, device: str = "cpu", progress=None, rows: int = 1, load=None):
    """``(path, model or None, {path: curve})`` for ``dtype="auto"``: the dtype and kernels whose
    measured curve `fastest` ranks first (expected tokens per second, or for a server of up to
    ``rows`` rows a call, `server_path`). The model is returned
    when the choice loaded it (so it is not loaded twice). ``load``: as `curves` takes it."""
    found, model = curves(spec, "torch", torch_paths(spec, device), device, progress, rows=rows, load=load)
    best = fastest(found, rows)
    if progress:
        progress(f"dtype auto: {spec} in {best}{_for(rows)} ({explain(found)})")
    return best, (model.model if model is not None else None), found


def gguf_engines(spec: str) -> tuple[str, ...]:
    """The llama.cpp-family backends (models/engines.py) that can run ``spec`` here: a GGUF
    model, and each engine whose package is installed and that scores its architecture right.
    They run on the CPU, also beside torch models on CUDA: measured, one may still be the
    faster drafter there."""
    from ..models.engines import ENGINES

    source = resolve(spec)
    if source.gguf_file is None:
        return ()
    gguf = str(Path(source.path) / source.gguf_file)
    return tuple(name for name, engine in ENGINES.items()
                 if engine.installed() and not engine.problem(gguf))


def best_for(role: str, curves: dict[str, dict[int, float]], rows: int = 1) -> str:
    """The path of ``curves`` (torch dtypes and llama.cpp-family backends by name) that runs a
    model best in ``role``: a target as `fastest` ranks paths (one sequence: `rate`; up to
    ``rows`` rows a call: `server_path`), a drafter by its one-token step (it drafts one per
    pass)."""
    if role != "target":
        return min(curves, key=lambda path: curves[path][1])
    return fastest(curves, rows)


def choose_backend(spec: str, role: str, dtype="auto", device: str = "cpu", progress=None,
                   rows: int = 1, load=None):
    """``(backend, dtype, model or None)`` for ``backend="auto"``: a llama.cpp-family engine (the
    GGUF as it is, quantized; each installed one, `gguf_engines`) or PyTorch in ``dtype``
    (``"auto"``: its best path), whichever the measured curves favour (`best_for`; a target for
    up to ``rows`` rows a call). The torch model is returned when the choice loaded it.
    ``load``: as `curves` takes it."""
    from ..models.engines import ENGINES

    engines = gguf_engines(spec)
    if not engines:
        return "torch", dtype, None
    rows = rows if role == "target" else 1
    if dtype == "auto":
        dtype, model, torch_curves = choose_dtype(spec, device, progress, rows, load)
        torch_curve = torch_curves[dtype]
    else:
        found, loaded = curves(spec, "torch", (dtype,), device, progress, load=load)
        torch_curve, model = found[dtype], (loaded.model if loaded is not None else None)
    candidates = {dtype: torch_curve}
    for engine in engines:
        candidates[engine] = curves(spec, engine, ("gguf",), "cpu", progress, load=load)[0]["gguf"]
    best = best_for(role, candidates, rows)
    if progress:
        names = {path: ENGINES[path].label if path in ENGINES else f"torch {path}" for path in candidates}
        progress(f"backend auto: {spec} as {role}{_for(rows)} on {names[best]} "
                 f"({explain({names[path]: curve for path, curve in candidates.items()})})")
    return (best, "", None) if best in ENGINES else ("torch", dtype, model)


def _for(rows: int) -> str:
    return "" if rows == 1 else f" of a server of up to {rows} rows a call (closest to the best at every load)"


def explain(curves: dict[str, dict[int, float]]) -> str:
    """One line per choice: each candidate's plain step and the cost of scoring 9 tokens."""
    return "; ".join(f"{d}: 1 token {c[1] * 1e3:.0f} ms, 9 tokens {c.get(9, float('nan')) / c[1]:.2f}x that"
                     for d, c in curves.items())
