"""One loaded model, whatever runs it: PyTorch (transformers), llama.cpp or ik_llama.cpp
(`LoadedModel`), and `load_path`, which loads a model on one path given, choosing nothing.

Everything above the models layer asks a `LoadedModel` for sessions (`new_session`), its logits
width, its context window and its end-of-generation ids, and never touches the backend itself.
The tokenizer is always the transformers tokenizer of the same files (for a GGUF model, read
from the GGUF): the bridge's byte tables come from it on either backend. Loading with a choice
(``backend="auto"``, ``dtype="auto"``) is models/backends.py `load`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AnydraftError
from . import llamacpp, synthetic
from .engines import ENGINES, kv_bytes_per_token
from .loading import load_model, load_tokenizer, resolve
from .null import NullModel
from .session import HFSession, Session, check_rollback, context_window, fast_path_problem

# where `exact` runs (models/exact.py, docs/exact.md), for the error that refuses another path
EXACT_PATHS = ("exact scoring runs on the torch backend on a CPU (float32, bfloat16, +onednn) "
               "for models whose layers are all full attention, and on llama.cpp")


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
    def kv_bytes_per_token(self) -> int:
        """Bytes one token takes in this model's KV cache (what the prefix cache counts)."""
        if self.backend in ENGINES:
            return kv_bytes_per_token(self.model.path)
        if self.backend == "null":
            return 1  # it keeps lengths only
        config = self.model.config.get_text_config(decoder=True)
        heads = config.num_attention_heads
        head = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        size = next(self.model.parameters()).element_size()
        return 2 * config.num_hidden_layers * kv_heads * head * size

    def kept_cost(self, tokens: int) -> int:
        """Tokens a session of its own holding ``tokens`` counts against the prefix cache's
        budget: a llama.cpp session allocated its whole context at its creation."""
        return self.context_window if self.backend in ENGINES else tokens

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


def load_path(spec: str, backend: str, dtype: str, device: str, progress=None,
              tokenizer=None) -> LoadedModel:
    """``spec`` (a catalog name, hub id, directory, .gguf or synthetic model) on one path, nothing
    chosen or measured: a llama.cpp-family ``backend`` runs the GGUF file as it is, on the CPU;
    "torch" loads the model in ``dtype`` (not "auto") on ``device`` (resolved, `resolve_device`).
    A null model (models/null.py) is the same on every path."""
    if synthetic.is_spec(spec) and synthetic.parse(spec)[0] == "null":
        tokenizer = tokenizer or load_tokenizer(spec)
        # float32: the dtype of its logits, and a dtype whatever reads `dtype` back accepts
        return LoadedModel(spec, NullModel(spec, tokenizer), tokenizer, "float32")
    if backend in ENGINES:
        if synthetic.is_spec(spec):
            raise AnydraftError(f"{spec!r} has no GGUF file for {backend}: use the torch backend")
        engine, source = ENGINES[backend], resolve(spec)
        if source.gguf_file is None:
            raise AnydraftError(
                f"the {backend} backend reads GGUF files, and {spec!r} is not one: pass a catalog "
                "name or a .gguf file, or use the torch backend for this model")
        if device != "cpu" and progress:
            progress(f"{spec} runs on the CPU ({engine.label}), beside {device} for torch models")
        model = llamacpp.LlamaCppModel.load(source, progress=progress, engine=engine)
        return LoadedModel(spec, model, tokenizer or load_tokenizer(spec))
    model = load_model(spec, dtype=dtype, device=device, progress=progress)
    check_rollback(model)  # at load, not at the first request
    return LoadedModel(spec, model, tokenizer or load_tokenizer(spec), dtype)
