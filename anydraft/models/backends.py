"""`load`: a model spec (or a model object) as a `LoadedModel` (models/loaded.py), on the backend
and dtype asked for, or on the ones measured fastest here (``"auto"``: models/auto.py); and the
checks of what a caller asks for (`check_backend`, `backend_for`, `check_target_device`).
"""

from __future__ import annotations

from ..errors import AnydraftError
from . import auto, llamacpp, synthetic
from .engines import BACKENDS, ENGINES
from .loaded import LoadedModel, load_path
from .loading import AUTO, load_tokenizer, parse_dtype, resolve_device
from .null import NullModel
from .session import check_rollback, model_name


def check_target_device(backend: str, device) -> None:
    """Refuse a target asked for on llama.cpp and on CUDA alike: llama.cpp runs on the CPU here,
    so one of the two requests could not be honoured. (A llama.cpp drafter, or a llama.cpp
    target that ``auto`` chose, simply runs on the CPU beside a torch model on the GPU.)"""
    if backend in ENGINES and str(device) == "cuda":
        raise AnydraftError(f"the {backend} backend runs on the CPU here: for a target on CUDA use "
                            f"the torch backend, or keep {backend} with device 'auto' or 'cpu'")


def check_backend(name: str) -> str:
    if name != AUTO and name not in BACKENDS:
        raise AnydraftError(f"unknown backend {name!r}: choose one of {', '.join((AUTO, *BACKENDS))}")
    return name


# how people name a model's dtype and backend: in Python, and on the command line
_OPTIONS = {"target": ("dtype", "backend", "--dtype", "--target-backend"),
            "drafter": ("drafter_dtype", "drafter_backend", "--drafter-dtype", "--drafter-backend")}


def backend_for(backend: str, dtype, role: str = "target") -> str:
    """The backend of a model whose ``dtype`` was asked for. Every dtype but "auto" (float32,
    bfloat16, float16, with +onednn or +compile) is a torch path: under ``backend="auto"`` it
    means torch (were llama.cpp measured faster, it would run the GGUF as it is and the dtype
    asked for would silently not happen), and beside a llama.cpp-family backend it is a conflict."""
    if dtype == AUTO or backend == "torch":
        return backend
    if backend == AUTO:
        return "torch"
    dtype_option, backend_option, dtype_flag, backend_flag = _OPTIONS[role]
    raise AnydraftError(
        f"the {role}'s {dtype_option} {str(dtype)!r} ({dtype_flag}) runs on the torch backend, "
        f"but its {backend_option} is {backend!r} ({backend_flag}), which runs the GGUF as it is, "
        f"in no dtype: for {dtype} use {backend_option} 'torch' or 'auto'; for {backend} leave "
        f"{dtype_option} 'auto'")


def load(spec, backend: str = "torch", tokenizer=None, dtype="auto", device: str = "auto",
         progress=None, role: str = "target", rows: int = 1, dtype_given: bool = True) -> LoadedModel:
    """Load a model spec (catalog name, hub id, directory, .gguf) or wrap a loaded model object.

    ``backend="llamacpp"`` or ``"ik"`` reads a GGUF file as it is (quantized, no conversion) and
    runs it on the CPU whatever ``device`` says; ``dtype`` and ``device`` (`resolve_device`) apply
    to the torch backend: ``dtype="auto"`` measures the candidates on this machine (once, cached)
    and keeps the fastest (models/auto.py). ``backend="auto"`` likewise measures the
    installed llama.cpp engines against torch for the ``role`` ("target" or "drafter") the model plays. A target that will
    score up to ``rows`` sequences in one call (a server's batch) gets the path that serves
    that many best (`auto.fastest`).

    A ``dtype`` other than "auto" makes ``backend="auto"`` torch, and conflicts with
    "llamacpp" or "ik" (`backend_for`), unless ``dtype_given`` is False: a dtype handed down (a
    drafter's, from the target's) or meant for the torch runs among several, which applies
    only where the model runs on torch.
    """
    check_backend(backend)
    if dtype_given and isinstance(spec, str):
        backend = backend_for(backend, dtype, role)
    device = resolve_device(device)
    if not isinstance(spec, str):
        if tokenizer is None:
            raise AnydraftError("a model object needs its tokenizer: pass tokenizer=... as well")
        if isinstance(spec, llamacpp.LlamaCppModel):
            return LoadedModel(spec.name, spec, tokenizer)
        if isinstance(spec, NullModel):
            return LoadedModel(spec.name, spec, tokenizer, "float32")
        check_rollback(spec)
        return LoadedModel(model_name(spec), spec.eval(), tokenizer)
    if synthetic.is_spec(spec):  # random weights or none: nothing to measure or choose
        if dtype == AUTO:
            dtype = synthetic.default_dtype(device)
        return load_path(spec, backend if backend in ENGINES else "torch", dtype, device, progress,
                         tokenizer)
    model = None  # a torch model the choice loaded to measure it
    if backend == AUTO:
        backend, dtype, model = auto.choose_backend(spec, role, dtype, device, progress, rows)
    if model is None and backend not in ENGINES and parse_dtype(dtype, allow_auto=True) == AUTO:
        dtype, model = auto.choose_dtype(spec, device, progress, rows)[:2]
    if model is None:
        return load_path(spec, backend, dtype, device, progress, tokenizer)
    return LoadedModel(spec, model, tokenizer or load_tokenizer(spec), dtype)
