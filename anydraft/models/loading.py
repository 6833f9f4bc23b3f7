"""Resolve a model spec (catalog short name, hub id, directory or .gguf) and load it.

GGUF weights are dequantized by transformers on every load (13-45 s here). The first load
therefore saves the converted model (safetensors, config, tokenizer) under
``$ANYDRAFT_CACHE/converted/<file stem>-<size>/`` and every later load reads that directory.
The tokenizer is cached on its own, so bridge work never pays for the weights.
"""

from __future__ import annotations

import functools
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..atomic import cache_dir, replacing
from ..errors import AnydraftError
from . import catalog, synthetic

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
# "auto": the dtype this machine runs the model fastest in, measured (models/auto.py)
AUTO = "auto"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: ``path`` is a directory, or a hub id when ``hub`` is true."""

    name: str  # what the user typed
    path: str
    gguf_file: str | None = None  # file name inside ``path`` for GGUF models
    hub: bool = False

    @property
    def cache_key(self) -> str | None:
        if self.gguf_file is None:
            return None
        size = (Path(self.path) / self.gguf_file).stat().st_size
        return f"{Path(self.gguf_file).stem}-{size}"

    @property
    def converted_dir(self) -> Path | None:
        key = self.cache_key
        return None if key is None else cache_dir() / "converted" / key


def resolve(spec: str) -> ModelSource:
    """Turn a user's model spec into a `ModelSource`; clear error for anything unusable."""
    if not isinstance(spec, str) or not spec.strip():
        raise AnydraftError("model spec is empty: pass a catalog name, a hub id, a directory or a .gguf file")
    if synthetic.is_spec(spec):  # built, not read: no files
        synthetic.parse(spec)
        return ModelSource(spec, spec)
    if spec in catalog.CATALOG:
        entry = catalog.CATALOG[spec]
        if not entry.installed:
            raise AnydraftError(
                f"catalog model {spec!r} is not installed: run `anydraft models install {spec}`"
            )
        path = entry.gguf_path
        return ModelSource(spec, str(path.parent), path.name)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise AnydraftError(f"GGUF file {spec!r} does not exist")
        return ModelSource(spec, str(path.parent.resolve()), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise AnydraftError(f"directory {spec!r} has no config.json: not a transformers model")
        return ModelSource(spec, str(path.resolve()))
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return ModelSource(spec, spec, hub=True)
    raise AnydraftError(
        f"unknown model {spec!r}: not a catalog name ({', '.join(catalog.CATALOG)}), "
        "an existing directory, a .gguf file, a hub id of the form owner/name, or a synthetic "
        "model (synthetic:NAME or null:NAME, NAME one of " + ", ".join(synthetic.names()) + ")"
    )


def _save_atomically(obj, directory: Path) -> None:
    """``save_pretrained`` into a scratch directory, then rename: no half-written cache."""
    with replacing(directory, directory=True) as scratch:
        obj.save_pretrained(scratch)


def _load_error(source: ModelSource, exc: Exception) -> AnydraftError:
    """Why ``source``'s files did not load, blaming where they are: the hub only for a hub id.
    A GGUF's converted copy that does not load is damaged (a copy is put in place whole,
    atomic.py), so the fix is to convert it again."""
    why = f"{type(exc).__name__}: {exc}"
    if source.gguf_file is not None:
        return AnydraftError(
            f"could not load {source.name!r} from its converted copy in {source.converted_dir} "
            f"({why}): remove that folder and load again, which converts {source.gguf_file} anew")
    if not source.hub:
        return AnydraftError(f"could not load {source.name!r} from the directory {source.path} "
                             f"({why}): it must hold a whole transformers model (what "
                             "save_pretrained writes: config, weights, tokenizer)")
    return AnydraftError(
        f"could not load {source.name!r} from the model hub ({why}). "
        "If this machine is offline, use a catalog model (`anydraft models list`), "
        "a local directory or a .gguf file."
    )


@functools.lru_cache(maxsize=16)
def load_tokenizer(spec: str):
    """The transformers tokenizer of ``spec`` (cached per process and, for GGUF, on disk)."""
    from transformers import AutoTokenizer

    source = resolve(spec)
    if synthetic.is_spec(spec):
        return family_tokenizer(synthetic.parse(spec)[3]["tokenizer"])
    path = source.path
    if source.gguf_file is not None:
        path = source.converted_dir / "tokenizer"
        if not (path / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
            _save_atomically(tok, path)
        # read back what was saved (or what another process saved first): the first and every
        # later load behave identically (the converted object and its saved form differ, e.g.
        # in Qwen's NFC normalizer)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise _load_error(source, exc) from exc


# a dtype name may end in the execution path it runs on: "+onednn" (oneDNN linear layers,
# models/kernels.py) or "+compile" (torch.compile on a static cache, models/static.py)
PATHS = ("onednn", "compile")


def split_kernels(dtype) -> tuple[object, str]:
    """``(dtype without the path suffix, the path: "" or one of PATHS)``: ``"float32+onednn"``
    is float32 weights on oneDNN kernels (models/kernels.py)."""
    if isinstance(dtype, str):
        name, _, path = dtype.partition("+")
        if path in PATHS:
            return name, path
    return dtype, ""


def parse_dtype(dtype, allow_auto: bool = False, device: str = "cpu"):
    """The torch dtype of a name, with or without a path suffix (or ``"auto"`` itself, where
    allowed); clear error otherwise."""
    import torch

    from . import kernels

    if allow_auto and dtype == AUTO:
        return AUTO
    name, path = split_kernels(dtype)
    if isinstance(name, torch.dtype):
        if name not in (torch.float32, torch.bfloat16, torch.float16):
            raise AnydraftError(f"dtype {name} not supported: use auto, float32, bfloat16 or float16")
        return name
    if name not in DTYPES:
        raise AnydraftError(f"unknown dtype {dtype!r}: use auto, float32, bfloat16 or float16, "
                            f"optionally with +onednn or +compile (e.g. float32{kernels.SUFFIX})")
    torch_dtype = getattr(torch, DTYPES[name])
    if path == "onednn" and not kernels.available(torch_dtype, device):
        raise AnydraftError(f"oneDNN linear layers do not run {name} on this machine ({device}): "
                            f"use float32{kernels.SUFFIX}, or {name} without {kernels.SUFFIX}")
    return torch_dtype


DEVICES = (AUTO, "cpu", "cuda")


def resolve_device(device) -> str:
    """``"cpu"`` or ``"cuda"`` for a device name; ``"auto"`` is CUDA when torch sees a GPU, else
    the CPU. Resolved before anything is loaded or keyed by it (the cost curves of
    hardware/profile.py); clear error for a name it does not know or a GPU that is not there."""
    import torch

    name = str(device)
    if name not in DEVICES:
        raise AnydraftError(f"unknown device {device!r}: use auto, cpu or cuda "
                            "(CUDA_VISIBLE_DEVICES picks the GPU)")
    if name == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise AnydraftError("CUDA is not available on this machine: use device='cpu' or 'auto'")
    return name


def _from_files(spec: str, source: ModelSource, torch_dtype, progress=None):
    """The transformers model in ``source``'s files (a GGUF converted once), on the CPU."""
    from transformers import AutoModelForCausalLM

    if source.gguf_file is not None:
        target = source.converted_dir / "model"
        if not (target / "config.json").is_file():
            if progress:
                progress(f"converting {source.gguf_file} (first load dequantizes every tensor)...")
            import torch

            model = AutoModelForCausalLM.from_pretrained(
                source.path, gguf_file=source.gguf_file, dtype=torch.float32
            )
            # The weights are plain float32 tensors now; drop the GGUF quantizer marker, which
            # would make transformers refuse to save them.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            _save_atomically(model, target)
            del model
            load_tokenizer(spec)  # cache the tokenizer next to the weights
        path = str(target)
    else:
        path = source.path
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as exc:
        raise _load_error(source, exc) from exc


def load_model(spec: str, dtype="float32", device: str = "cpu", progress=None):
    """Load ``spec`` as an eval-mode ``AutoModelForCausalLM`` in ``dtype`` on ``device``
    (`resolve_device`).

    A GGUF file is converted once (dequantized to float32 safetensors in the cache); later
    loads read the cache and cast to ``dtype``. A synthetic model (models/synthetic/) is
    built on ``device`` with random weights.
    """
    device = resolve_device(device)
    torch_dtype = parse_dtype(dtype, device=device)
    kernel = split_kernels(dtype)[1]
    source = resolve(spec)
    start = time.perf_counter()
    if synthetic.is_spec(spec):
        if synthetic.parse(spec)[0] != "synthetic":
            raise AnydraftError(f"{spec!r} has no torch model (null models are loaded by "
                                "models.backends.load): use synthetic:NAME for random weights")
        model = synthetic.build(spec, load_tokenizer(spec), torch_dtype, device)
    else:
        model = _from_files(spec, source, torch_dtype, progress).to(device).eval()
    if kernel == "onednn":
        from .kernels import pack

        pack(model)
    elif kernel == "compile":
        from .static import CompiledModel

        model = CompiledModel(model)  # compiles at its first calls
    if progress:
        progress(f"loaded {spec} ({dtype}) in {time.perf_counter() - start:.1f} s")
    return model


def family_tokenizer(family: str):
    """The family's tokenizer: from the cache, else extracted from its catalog GGUF into it."""
    from transformers import AutoTokenizer

    where = synthetic.tokenizer_dir(family)
    if not (where / "tokenizer_config.json").is_file():
        model = synthetic.FAMILIES[family]
        if not catalog.CATALOG[model].installed:
            raise AnydraftError(
                f"the {family} tokenizer of the synthetic models is not here: run `anydraft models "
                f"install {model}` (its GGUF carries it), or unpack an archive of "
                "`anydraft models export-tokenizers` into $ANYDRAFT_CACHE")
        load_tokenizer(model).save_pretrained(where)
    return AutoTokenizer.from_pretrained(where)


def export_tokenizers(archive: Path, progress=print) -> Path:
    """Every family's tokenizer (extracted first where needed) packed into ``archive``
    (.tar.xz: Gemma-3's 262,144 tokens are 33 MB as JSON, a few MB packed), to unpack into
    ``$ANYDRAFT_CACHE`` on a machine without the catalog (scripts/gpu_check.sh does)."""
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    for family in synthetic.FAMILIES:
        family_tokenizer(family)
        progress(f"{family}: {synthetic.tokenizer_dir(family)}")
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz") as tar:
        for family in synthetic.FAMILIES:
            tar.add(synthetic.tokenizer_dir(family), arcname=f"synthetic-tokenizers/{family}")
    shutil.move(partial, archive)
    return archive
