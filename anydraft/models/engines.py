"""The llama.cpp family: llama.cpp and ik_llama.cpp run GGUF files through one session code
(models/llamacpp.py); this file is the only place that knows how their C APIs differ.

- ``llamacpp``: llama.cpp through llama-cpp-python (``pip install 'anydraft[llamacpp]'``, compiled
  on install for this CPU).
- ``ik``: ik_llama.cpp (MIT; the llama.cpp fork by the author of the k-quants) through the
  ik-llama-cpp-python wheel (``pip install 'anydraft[ik]'``, prebuilt for AVX2, nothing to
  compile). Its ``iqk`` matrix kernels read each block of weights once for up to 8 rows of
  activations, and with run-time repacking (``repack_tensors``, llama-bench's ``-rtr 1``) one
  token is as fast as on llama.cpp: scoring 2-9 tokens costs little more than one
  (docs/hardware.md "Cost curves of the two engines"), the curve speculation pays on.

ik-llama-cpp-python's own Python layer is thin and partly wrong for this API (its
``llama_tokenize`` passes a vocabulary where the C function takes a model), so anydraft declares
each C function it calls itself (`_ik_signatures`) and takes from the package only the shared
library and the layouts of three structures, which must match that library. The calls whose
names or arguments differ from llama-cpp-python's are presented under llama-cpp-python's names
(`IK_AS_LLAMACPP`, `_IkApi`), so llamacpp.py calls one API whichever engine runs.
Which ``libllama.so`` runs (`ik_library`): ``$IK_LLAMA_CPP_LIB_PATH`` where set (the package's
loader reads it), else the build for this CPU that ``bench --baseline ik-llama-server`` leaves in
the cache beside ik_llama.cpp's server where there is one (on an AMD Zen 4: 4% faster a token,
prompts read 15-25% faster; docs/hardware.md), else the wheel's own.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from dataclasses import dataclass

from ..errors import AnydraftError

# ik_llama.cpp evaluates a call in graphs of at most this many tokens. The 0.1.5 wheel's kernels
# scored SmolLM2-135M's Q4_1 weights wrong from 32 tokens in one graph (logits up to 34 apart
# from the same positions scored one at a time, argmax agreeing on 28-38% of them; AMD Zen 4,
# 2026-12-07); in graphs of 16 every position came out bit-identical to one-token calls. The
# price is in prompt reads: Qwen2.5-1.5B read 400 tokens in 3.6-4.0 s on the wheel's library
# either way, and on the build for this CPU in 3.2-3.3 s against 2.8-3.1 in graphs of 512
IK_UBATCH = 16

# architectures ik_llama.cpp scores unlike llama.cpp, measured on the catalog's files: it refuses
# them, and `auto` leaves it out for them (models/auto.py `gguf_engines`)
IK_MISSCORES = {
    # Gemma-3-270M Q4_K_M, 64 tokens: one token at a time up to 8.6 logits from llama.cpp's (the
    # logits' std 6.4), and a call of 9 tokens up to 10.2 from its own one-token calls, where
    # SmolLM2 and Qwen2.5 stayed within 2.2 and 0.5 (2026-12-07, the 0.1.5 wheel)
    "gemma3": "scores Gemma-3 up to 10 logits away from llama.cpp and from its own one-token "
              "calls (measured on gemma-3-270m)",
}


@dataclass(frozen=True)
class Engine:
    """One engine of the family: its backend name, how people call it, the Python module that
    brings it, and how to install it."""

    name: str  # the backend's name: --target-backend NAME
    label: str  # for people: "llama.cpp"
    module: str  # the importable module that carries it
    install: str  # the fix when it is missing
    log_error: int  # ggml's GGML_LOG_LEVEL_ERROR in this engine's ggml.h (the only level kept)

    def library(self) -> str:
        """For people: which build of the engine runs (`ik_library`)."""
        if self is not IK:
            return "llama-cpp-python's"
        return ik_library() or "the wheel's"

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def problem(self, gguf: str) -> str | None:
        """Why this engine does not run the GGUF file ``gguf`` (`IK_MISSCORES`), or None."""
        if self is not IK:
            return None
        return IK_MISSCORES.get(architecture(gguf))

    def api(self):
        """The engine's C API under llama-cpp-python's names, loaded and quiet (logs only
        errors); an error naming the install command where the package is missing."""
        if self.name not in _APIS:
            if not self.installed():
                raise AnydraftError(f"the {self.name} backend needs {self.install}, or use the torch backend")
            api = _llamacpp_api() if self.name == "llamacpp" else _IkApi()
            _quiet(api, self.log_error)
            api.llama_backend_init()
            _APIS[self.name] = api
        return _APIS[self.name]


LLAMACPP = Engine("llamacpp", "llama.cpp", "llama_cpp",
                  "llama-cpp-python: pip install 'anydraft[llamacpp]' (it compiles llama.cpp, a few minutes)",
                  log_error=3)
IK = Engine("ik", "ik_llama.cpp", "ik_llama_cpp",
            "ik-llama-cpp-python: pip install 'anydraft[ik]' (a prebuilt wheel)", log_error=4)
ENGINES = {engine.name: engine for engine in (LLAMACPP, IK)}
BACKENDS = ("torch", *ENGINES)  # every backend a model can run on (models/backends.py)

# where `bench --baseline ik-llama-server` builds ik_llama.cpp for this CPU (bench/llama_server.py),
# its shared libraries beside the server, one folder per ik-llama-cpp-python version
IK_BUILD = "ik-llama-server"

_APIS: dict[str, object] = {}
_LOGGERS: list = []  # the log callbacks handed to C, kept alive


def _llamacpp_api():
    import llama_cpp

    return llama_cpp


def _quiet(api, error_level: int) -> None:
    """Both engines log every tensor they load: keep only their errors."""
    def log(level, text, user_data):
        if level == error_level:
            sys.stderr.write(text.decode(errors="replace"))

    callback = _LOG_CALLBACK(log) if isinstance(api, _IkApi) else api.llama_log_callback(log)
    _LOGGERS.append(callback)
    api.llama_log_set(callback, ctypes.c_void_p(0))


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

# ik_llama.cpp's calls that differ from llama-cpp-python's: the name anydraft calls -> ik's own
# function, same arguments (ik's kv-cache calls take the context, which is what its
# `llama_get_memory` returns)
IK_AS_LLAMACPP = {
    "llama_model_free": "llama_free_model",
    "llama_model_n_ctx_train": "llama_n_ctx_train",
    "llama_tokenize": "llama_vocab_tokenize",  # ik's llama_tokenize takes the model
    "llama_token_to_piece": "llama_token_to_piece_vocab",
    "llama_memory_seq_rm": "llama_kv_cache_seq_rm",
    "llama_memory_seq_cp": "llama_kv_cache_seq_cp",
    "llama_memory_seq_pos_max": "llama_kv_cache_seq_pos_max",
}


def _ik_signatures(s) -> dict[str, tuple]:
    """``name: (restype, argtypes)`` of every ik_llama.cpp function anydraft calls, from its
    llama.h (ik-llama-cpp-python 0.1.5); ``s``: the package's structure layouts."""
    p, i32, u32, b = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_bool
    return {
        "llama_backend_init": (None, []),
        "llama_log_set": (None, [_LOG_CALLBACK, p]),
        "llama_print_system_info": (ctypes.c_char_p, []),
        "llama_model_default_params": (s.llama_model_params, []),
        "llama_context_default_params": (s.llama_context_params, []),
        "llama_model_load_from_file": (p, [ctypes.c_char_p, s.llama_model_params]),
        "llama_free_model": (None, [p]),
        "llama_model_is_recurrent": (b, [p]),
        "llama_model_get_vocab": (p, [p]),
        "llama_vocab_n_tokens": (i32, [p]),
        "llama_n_ctx_train": (i32, [p]),
        "llama_vocab_eos": (i32, [p]),
        "llama_token_eot": (i32, [p]),
        "llama_init_from_model": (p, [p, s.llama_context_params]),
        "llama_free": (None, [p]),
        "llama_n_batch": (u32, [p]),
        "llama_batch_init": (s.llama_batch, [i32, i32, i32]),
        "llama_batch_free": (None, [s.llama_batch]),
        "llama_decode": (i32, [p, s.llama_batch]),
        "llama_get_logits_ith": (ctypes.POINTER(ctypes.c_float), [p, i32]),
        "llama_set_n_threads": (None, [p, u32, u32]),
        "llama_kv_cache_seq_rm": (b, [p, i32, i32, i32]),
        "llama_kv_cache_seq_cp": (None, [p, i32, i32, i32, i32]),
        "llama_kv_cache_clear": (None, [p]),
        "llama_kv_cache_seq_pos_max": (i32, [p, i32]),
        "llama_vocab_tokenize": (i32, [p, ctypes.c_char_p, i32, ctypes.POINTER(i32), i32, b, b]),
        "llama_token_to_piece_vocab": (i32, [p, i32, ctypes.c_char_p, i32, i32, b]),
    }


def ik_library() -> str | None:
    """The ``libllama.so`` the ik engine loads instead of the wheel's: ``$IK_LLAMA_CPP_LIB_PATH``,
    else the build for this CPU in the cache where one is whole (its server, copied last, is
    there); None: the wheel's."""
    import os
    from importlib.metadata import PackageNotFoundError, version

    from ..atomic import cache_dir

    given = os.environ.get("IK_LLAMA_CPP_LIB_PATH")
    if given:
        return given
    try:
        folder = cache_dir() / IK_BUILD / version("ik-llama-cpp-python")
    except PackageNotFoundError:
        return None
    built = (folder / "llama-server").is_file() and (folder / "libllama.so").is_file()
    return str(folder / "libllama.so") if built else None


class _IkApi:
    """ik_llama.cpp's shared library with the functions of `_ik_signatures` declared, under
    llama-cpp-python's names (`IK_AS_LLAMACPP`, and the methods below for the calls whose
    arguments differ)."""

    llama_token = ctypes.c_int32

    def __init__(self):
        import os

        library = ik_library()
        if library:  # the package's loader reads it at import
            os.environ["IK_LLAMA_CPP_LIB_PATH"] = library
        from ik_llama_cpp import _ctypes_api as structs

        lib = structs._lib
        for name, (restype, argtypes) in _ik_signatures(structs).items():
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name, function)
        for ours, theirs in IK_AS_LLAMACPP.items():
            setattr(self, ours, getattr(lib, theirs))
        self._lib = lib

    @staticmethod
    def llama_get_memory(ctx):
        return ctx  # ik's kv-cache calls take the context itself

    def llama_memory_clear(self, ctx, data: bool) -> None:
        self.llama_kv_cache_clear(ctx)

    def llama_model_is_hybrid(self, model) -> bool:
        return False  # ik_llama.cpp has no query; its recurrent models are refused as such

    def end_ids(self, model, vocab) -> set[int]:
        return {int(self.llama_vocab_eos(vocab)), int(self.llama_token_eot(model))}


# bytes of each fixed-size GGUF value type (the format's numbering; 8: string, 9: array)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def architecture(gguf: str) -> str:
    """A GGUF file's ``general.architecture`` ("llama", "qwen2", "gemma3")."""
    arch = gguf_values(gguf, {"general.architecture"}).get("general.architecture")
    if not isinstance(arch, str):
        raise AnydraftError(f"{gguf} names no general.architecture")
    return arch


def gguf_values(gguf: str, wanted) -> dict:
    """The header values of a GGUF file whose keys ``wanted`` names (a set: read until all are
    found; or a predicate of the key: the whole header, 0.2 s for Qwen2.5's, whose vocabulary
    is in it), numbers and strings (an array as a list), read from its key-value pairs alone
    (the gguf package's reader maps every tensor first, seconds for a 1 GB file)."""
    names = wanted if isinstance(wanted, (set, frozenset)) else None
    import struct

    formats = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    out = {}
    with open(gguf, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def value(kind, keep: bool):
            if kind == 8:
                data = f.read(read("Q"))
                return data.decode(errors="replace") if keep else None
            if kind == 9:
                inner, count = read("I"), read("Q")
                return [value(inner, keep) for _ in range(count)]
            if keep:
                return read(formats[kind])
            f.seek(_GGUF_SIZES[kind], 1)
            return None

        if f.read(4) != b"GGUF":
            raise AnydraftError(f"{gguf} is not a GGUF file")
        read("I")  # version
        read("Q")  # tensors
        for _ in range(read("Q")):
            key, kind = f.read(read("Q")).decode(), read("I")
            keep = key in names if names is not None else wanted(key)
            found = value(kind, keep)
            if keep:
                out[key] = found
                if names is not None and len(out) == len(names):
                    break
    return out


@functools.cache  # one read of the header per file: each server worker's decoder asks
def kv_bytes_per_token(gguf: str) -> int:
    """Bytes one token takes in the KV cache of a GGUF model, both engines' default f16 cache:
    every layer's keys and values over its KV heads (a per-layer head count summed)."""
    values = gguf_values(gguf, lambda key: key == "general.architecture" or key.split(".", 1)[-1] in (
        "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "attention.value_length"))
    arch = values.get("general.architecture")

    def get(name, default=None):
        return values.get(f"{arch}.{name}", default)

    layers, heads = int(get("block_count", 0)), get("attention.head_count", 1)
    heads = max(heads) if isinstance(heads, list) else heads
    kv = get("attention.head_count_kv", heads)
    kv_heads = sum(kv) if isinstance(kv, list) else kv * layers
    head = get("embedding_length", 0) // max(1, heads)
    return int(kv_heads * (get("attention.key_length", head) + get("attention.value_length", head)) * 2)


def end_ids(api, model, vocab) -> set[int]:
    """The end-of-generation ids the GGUF declares (eos and end-of-turn)."""
    if isinstance(api, _IkApi):
        return api.end_ids(model, vocab)
    return {int(api.llama_vocab_eos(vocab)), int(api.llama_vocab_eot(vocab))}


def model_params(engine: Engine, api):
    """The model parameters anydraft loads with: ik_llama.cpp repacks the weights at load into
    the row-interleaved layouts its kernels read fastest (`repack_tensors`, llama-bench's
    ``-rtr 1``), without which one token costs more than on llama.cpp."""
    params = api.llama_model_default_params()
    if engine is IK:
        params.repack_tensors = True
    return params


def context_params(engine: Engine, api, cells: int, rows: int, batch: int, threads: int):
    """The parameters of a context of ``cells`` KV cells for ``rows`` sequences."""
    params = api.llama_context_default_params()
    params.n_ctx = cells
    params.n_batch = params.n_ubatch = batch
    params.n_seq_max = rows
    params.n_threads = params.n_threads_batch = threads
    if engine is LLAMACPP:
        params.swa_full = True  # sliding-window layers (Gemma-3) keep every position: rollback
        if rows > 1 and hasattr(params, "kv_unified"):  # builds without the field have no other
            params.kv_unified = True  # one pool for all rows: see LlamaCppBatch
    else:  # ik_llama.cpp keeps one pool for all sequences as it is
        params.n_ubatch = min(batch, IK_UBATCH)
        # its flash attention aborts on a call of several sequences (iqk_fa_templates.h:
        # GGML_ASSERT(S > 0), the 0.1.5 wheel, a query row that no key of a block may see)
        params.flash_attn = rows == 1
    return params


def max_sequences(api) -> int:
    """The most sequences one context holds (llama.cpp's LLAMA_MAX_SEQ; 256 where the build has
    no query, as ik_llama.cpp)."""
    if hasattr(api, "llama_max_parallel_sequences"):
        return int(api.llama_max_parallel_sequences())
    return 256
