"""``backend="auto"`` and ``dtype="auto"``: the paths a model can run on here (torch dtypes and
kernels, compiled or not; each llama.cpp-family engine for a GGUF), their cost curves (cached,
or measured now: hardware/profile.py), and the one kept: the fastest for the model's role.

models/backends.py `load` asks `choose_backend` and `choose_dtype`; this module loads the
paths it measures itself (models/loaded.py `load_path`), one at a time.
"""

from __future__ import annotations

from pathlib import Path

from ..hardware import profile
from ..hardware.machine import this_machine
from .loaded import load_path
from .loading import resolve


def model_key(spec: str, backend: str, dtype: str, device: str) -> str:
    """The key ``spec``'s measurements on a path are cached under (hardware/profile.py): its
    files (a GGUF's name and size, a directory), not the name it was given, with the backend,
    dtype and device."""
    assert device in ("cpu", "cuda"), f"device {device!r} not resolved (resolve_device)"
    source = resolve(spec)
    return f"{source.cache_key or source.path}|{backend}|{dtype}|{device}"


def batches(path: str) -> bool:
    """Whether a torch path scores rows in one call (a compiled static cache holds one)."""
    from .static import SUFFIX

    return not path.endswith(SUFFIX)


def fastest(curves: dict[str, dict[int, float]], rows: int = 1) -> str:
    """The torch path ``auto`` takes for a target of up to ``rows`` rows a call: for one, the
    best `rate` (hardware/profile.py; its plain and speculative steps); for a server,
    `server_path`."""
    if rows == 1:
        return max(curves, key=lambda path: profile.rate(curves[path]))
    return profile.server_path(curves, rows, batches)


def candidates(device: str) -> tuple[str, ...]:
    """The execution paths ``auto`` measures for a torch model: float32 on the default kernels
    and on oneDNN (models/kernels.py) where it runs; bfloat16 only where the CPU computes it
    natively (emulated, its cost grows with the tokens scored: a verification costs nearly a
    plain step per token); float16 on CUDA."""
    import torch

    from .kernels import SUFFIX, available

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
    from .static import SUFFIX

    paths = candidates(device)
    wanted = compile or device == "cuda"
    return paths + tuple(p + SUFFIX for p in paths if "+" not in p and (
        wanted or profile.cached(model_key(spec, "torch", p + SUFFIX, device)) is not None))


def curves(spec: str, backend: str, paths: tuple[str, ...], device: str = "cpu", progress=None,
           remeasure: bool = False, rows: int = 1) -> tuple[dict, object]:
    """``({path: curve}, the best path's LoadedModel or None)`` for ``spec`` on ``backend``:
    cached curves where there are any, the others measured one model at a time (a few models
    of a few GB each would not fit in memory together). The best model (`fastest` for
    ``rows``) stays loaded when this call loaded it, so it is not loaded twice."""
    found, keep = {}, None
    for path in paths:
        curve = None if remeasure else profile.cached(model_key(spec, backend, path, device))
        if curve is not None:
            found[path] = curve
            continue
        # the backend is given, and the path is its own ("gguf" names llama.cpp's curve)
        model = load_path(spec, backend, path, device)
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
    return profile.cached(model_key(spec, backend or loaded.backend, loaded.dtype or "gguf", loaded.device.type))


def _measure_and_save(spec: str, backend: str, device: str, models: dict, progress) -> dict:
    quiet = not profile.busy()
    if progress:
        progress(f"measuring {spec} ({backend}: {', '.join(models)}; once per machine)"
                 + ("" if quiet else ": the machine is busy, so this is not cached"))
    found = profile.measure(models)
    if quiet:
        for dtype, curve in found.items():
            profile.save(model_key(spec, backend, dtype, device), curve)
    return found


def choose_dtype(spec: str, device: str = "cpu", progress=None, rows: int = 1):
    """``(path, model or None, {path: curve})`` for ``dtype="auto"``: the dtype and kernels whose
    measured curve `fastest` ranks first (expected tokens per second, or for a server of up to
    ``rows`` rows a call, `server_path`). The model is returned
    when the choice loaded it (so it is not loaded twice)."""
    found, model = curves(spec, "torch", torch_paths(spec, device), device, progress, rows=rows)
    best = fastest(found, rows)
    if progress:
        progress(f"dtype auto: {spec} in {best}{_for(rows)} ({explain(found)})")
    return best, (model.model if model is not None else None), found


def gguf_engines(spec: str) -> tuple[str, ...]:
    """The llama.cpp-family backends (models/engines.py) that can run ``spec`` here: a GGUF
    model, and each engine whose package is installed and that scores its architecture right.
    They run on the CPU, also beside torch models on CUDA: measured, one may still be the
    faster drafter there."""
    from .engines import ENGINES

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
                   rows: int = 1):
    """``(backend, dtype, model or None)`` for ``backend="auto"``: a llama.cpp-family engine (the
    GGUF as it is, quantized; each installed one, `gguf_engines`) or PyTorch in ``dtype``
    (``"auto"``: its best path), whichever the measured curves favour (`best_for`; a target for
    up to ``rows`` rows a call). The torch model is returned when the choice loaded it."""
    from .engines import ENGINES

    engines = gguf_engines(spec)
    if not engines:
        return "torch", dtype, None
    rows = rows if role == "target" else 1
    if dtype == "auto":
        dtype, model, torch_curves = choose_dtype(spec, device, progress, rows)
        torch_curve = torch_curves[dtype]
    else:
        found, loaded = curves(spec, "torch", (dtype,), device, progress)
        torch_curve, model = found[dtype], (loaded.model if loaded is not None else None)
    candidates = {dtype: torch_curve}
    for engine in engines:
        candidates[engine] = curves(spec, engine, ("gguf",), "cpu", progress)[0]["gguf"]
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
