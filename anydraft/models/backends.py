"""One loaded model, whatever runs it: PyTorch (transformers), llama.cpp or ik_llama.cpp.

Everything above the models layer asks a `LoadedModel` for sessions (`new_session`), its logits
width, its context window and its end-of-generation ids, and never touches the backend itself.
The tokenizer is always the transformers tokenizer of the same files (for a GGUF model, read
from the GGUF): the bridge's byte tables come from it on either backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AnydraftError
from ..hardware import profile
from . import llamacpp, synthetic
from .engines import BACKENDS, ENGINES
from .loading import AUTO, load_model, load_tokenizer, parse_dtype, resolve, resolve_device
from .null import NullModel
from .session import (
    HFSession,
    Session,
    check_rollback,
    context_window,
    fast_path_problem,
    model_name,
)

# where `exact` runs (models/exact.py, docs/exact.md), for the error that refuses another path
EXACT_PATHS = ("exact scoring runs on the torch backend on a CPU (float32, bfloat16, +onednn) "
               "for models whose layers are all full attention, and on llama.cpp")
# "auto": llama.cpp or torch, whichever runs the model faster here, measured (hardware/profile.py)


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


@dataclass
class LoadedModel:
    name: str
    model: object  # a transformers causal LM, or a llamacpp.LlamaCppModel (either engine)
    tokenizer: object
    dtype: str = ""  # the torch dtype it runs in ("auto" resolved); "" for llama.cpp or an object
    # every call scores each position bit-identically whatever the call (models/exact.py);
    # set through `make_exact`, which refuses a path that cannot
    exact: bool = False

    @property
    def backend(self) -> str:
        if isinstance(self.model, NullModel):
            return "null"
        if isinstance(self.model, llamacpp.LlamaCppModel):
            return self.model.engine.name
        return "torch"

    @property
    def _runs_itself(self) -> bool:
        """A model object of ours that knows its width, window and EOS ids (not a torch module)."""
        return isinstance(self.model, (llamacpp.LlamaCppModel, NullModel))

    @property
    def path(self) -> str:
        """How it runs, for people: "llama.cpp (GGUF)", "ik_llama.cpp (GGUF)", "null (fixed
        logits)" or "torch <dtype>", with "synthetic" for random weights (models/synthetic/)."""
        if self.backend in ENGINES:
            return f"{ENGINES[self.backend].label} (GGUF)"
        if self.backend == "null":
            return "null (fixed logits, synthetic)"
        return f"torch {self.dtype or 'as given'}" + (", synthetic" if synthetic.is_spec(self.name) else "")

    def exact_problem(self) -> str | None:
        """Why this model cannot score exactly (`exact`), or None where it can."""
        if self.backend == "null":
            return None  # its logits are a function of the position and its prefix
        if self.backend == "llamacpp":
            return None  # every GGUF model: llamacpp.ExactSession
        if self.backend == "ik":
            return "runs on ik_llama.cpp, whose kernels exact scoring was not measured on"
        if self.device.type != "cpu":
            return f"runs on {self.device.type}, where exact scoring was not measured"
        if hasattr(self.model, "new_session"):
            return "runs compiled (+compile), whose kernels exact scoring does not control"
        from .rows import batchable

        if not batchable(self.model):
            return fast_path_problem(self.model) or "has an attention that takes no ready mask"
        return None

    def make_exact(self) -> LoadedModel:
        """Score exactly from now on (models/exact.py); an error naming the paths that can,
        where this one cannot."""
        problem = self.exact_problem()
        if problem:
            raise AnydraftError(f"exact scoring is not available for {self.name} ({self.path}): it "
                                f"{problem}. {EXACT_PATHS}; or run without exact")
        self.exact = True
        return self

    def new_session(self) -> Session:
        if self.exact and self.backend == "torch":
            from .batch import OwnRow
            from .rows import TorchBatch

            return OwnRow(TorchBatch(self.model, 1, exact=True))
        if self.exact and self.backend in ENGINES:
            return self.model.new_session(exact=True)
        if hasattr(self.model, "new_session"):  # llama.cpp, or compiled on a static cache
            return self.model.new_session()
        return HFSession(self.model)

    def new_batch(self, max_rows: int):
        """A `BatchSession` (models/batch.py) of up to ``max_rows`` sequences of this model:
        llama.cpp (`LlamaCppBatch`) and a transformers model our own cache can hold
        (`TorchBatch`, models/rows.py) score all rows in one call; any other model runs its
        rows one after another (`SerialBatch`)."""
        from .batch import SerialBatch
        from .rows import TorchBatch

        if not self.batches:
            return SerialBatch(self.new_session, max_rows, self.exact)
        if isinstance(self.model, NullModel):
            return self.model.new_batch(max_rows)
        if isinstance(self.model, llamacpp.LlamaCppModel):
            if self.exact:
                return llamacpp.exact_batch(self.model, max_rows)
            return llamacpp.LlamaCppBatch(self.model, max_rows)
        return TorchBatch(self.model, max_rows, exact=self.exact)

    @property
    def batches(self) -> bool:
        """Whether `new_batch` scores all its rows in one call (not one after another)."""
        from .rows import batchable

        return self._runs_itself or (
            not hasattr(self.model, "new_session") and batchable(self.model))

    @property
    def logits_width(self) -> int:
        if self._runs_itself:
            return self.model.vocab_size
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def context_window(self) -> int:
        if hasattr(self.model, "max_length"):  # llama.cpp's context, a static cache's length
            return self.model.max_length
        return context_window(self.model)

    @property
    def device(self):
        if self._runs_itself:
            import torch

            return torch.device("cpu")
        return next(self.model.parameters()).device

    @property
    def model_eos_ids(self) -> set[int]:
        """End-of-generation ids the model files declare beyond the tokenizer's EOS."""
        if self._runs_itself:
            return set(self.model.eos_ids)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            return set()
        return set(eos if isinstance(eos, list) else [eos])


def load(spec, backend: str = "torch", tokenizer=None, dtype="auto", device: str = "auto",
         progress=None, role: str = "target", rows: int = 1, dtype_given: bool = True) -> LoadedModel:
    """Load a model spec (catalog name, hub id, directory, .gguf) or wrap a loaded model object.

    ``backend="llamacpp"`` or ``"ik"`` reads a GGUF file as it is (quantized, no conversion) and
    runs it on the CPU whatever ``device`` says; ``dtype`` and ``device`` (`resolve_device`) apply
    to the torch backend: ``dtype="auto"`` measures the candidates on this machine (once, cached)
    and keeps the fastest (hardware/profile.py). ``backend="auto"`` likewise measures the
    installed llama.cpp engines against torch for the ``role`` ("target" or "drafter") the model plays. A target that will
    score up to ``rows`` sequences in one call (a server's batch) gets the path that serves
    that many best (`profile.fastest`).

    A ``dtype`` other than "auto" makes ``backend="auto"`` torch, and conflicts with
    "llamacpp" or "ik" (`backend_for`), unless ``dtype_given`` is False: a dtype handed down (a
    drafter's, from the target's) or meant for the torch runs among several, which applies
    only where the model runs on torch.
    """
    check_backend(backend)
    if dtype_given and isinstance(spec, str):
        backend = backend_for(backend, dtype, role)
    device = resolve_device(device)
    model = None
    if synthetic.is_spec(spec):  # random weights or none: nothing to measure or choose
        if synthetic.parse(spec)[0] == "null":
            tokenizer = tokenizer or load_tokenizer(spec)
            # float32: the dtype of its logits, and a dtype whatever reads `dtype` back accepts
            return LoadedModel(spec, NullModel(spec, tokenizer), tokenizer, "float32")
        if backend in ENGINES:
            raise AnydraftError(f"{spec!r} has no GGUF file for {backend}: use the torch backend")
        backend = "torch"
        if dtype == AUTO:
            dtype = synthetic.default_dtype(device)
    if backend == AUTO and isinstance(spec, str):
        backend, dtype, model = profile.choose_backend(spec, role, dtype, device, progress, rows, load=load)
    if not isinstance(spec, str):
        if tokenizer is None:
            raise AnydraftError("a model object needs its tokenizer: pass tokenizer=... as well")
        if isinstance(spec, llamacpp.LlamaCppModel):
            return LoadedModel(spec.name, spec, tokenizer)
        if isinstance(spec, NullModel):
            return LoadedModel(spec.name, spec, tokenizer, "float32")
        check_rollback(spec)
        return LoadedModel(model_name(spec), spec.eval(), tokenizer)
    if backend in ENGINES:
        engine, source = ENGINES[backend], resolve(spec)
        if source.gguf_file is None:
            raise AnydraftError(
                f"the {backend} backend reads GGUF files, and {spec!r} is not one: pass a catalog "
                "name or a .gguf file, or use the torch backend for this model")
        if device != "cpu" and progress:
            progress(f"{spec} runs on the CPU ({engine.label}), beside {device} for torch models")
        model = llamacpp.LlamaCppModel.load(source, progress=progress, engine=engine)
    else:
        if model is None and parse_dtype(dtype, allow_auto=True) == AUTO:
            dtype, model = profile.choose_dtype(spec, device, progress, rows, load=load)[:2]
        if model is None:
            model = load_model(spec, dtype=dtype, device=device, progress=progress)
        check_rollback(model)  # at load, not at the first request
    return LoadedModel(spec, model, tokenizer or load_tokenizer(spec), "" if backend in ENGINES else dtype)
