"""The llama.cpp-family backends: GGUF models as they are, quantized, on llama.cpp
(``pip install 'anydraft[llamacpp]'``) or ik_llama.cpp (``pip install 'anydraft[ik]'``). One code
for both: the engine (models/engines.py, where their C APIs differ) is a model's ``engine``.

A `LlamaCppModel` holds the weights (one ``llama_model``, loaded with mmap in well under a
second); each live `LlamaCppSession` has its own llama.cpp context, i.e. its own KV cache, so
sessions never disturb each other and a server's workers can share one model; a finished
session's context is cleared and reused by the next session. A session implements the
`Session` protocol of session.py: ``feed`` decodes the tokens in batches of ``BATCH`` and asks
llama.cpp for logits only at the rows wanted; ``rollback(n)`` removes the KV cache entries at
positions ``>= n``. A `LlamaCppBatch` holds many sequences in one context and scores them in
one call (models/batch.py).

Token ids are the GGUF vocabulary's, which the transformers tokenizer read from the same file
reproduces (tests/models/test_llamacpp.py proves it over a fuzzed corpus).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from ..atomic import cache_dir, replacing
from ..errors import AnydraftError
from .batch import OwnedRows, full
from .engines import LLAMACPP, Engine, context_params, end_ids, max_sequences, model_params
from .exact import reads
from .session import ROLLBACK_HELP, rows_to_return
from .threads import llamacpp_threads

# A context this long is allocated per session (KV cache, f16). The models' training windows
# (8k-32k) would cost up to ~1 GB each; override with $ANYDRAFT_LLAMACPP_CONTEXT.
DEFAULT_CONTEXT = 8192
BATCH = 512


# llama.cpp's AMX kernels (built in when it is compiled on a CPU with AMX) crash with a segfault
# on virtual machines (ggml-org/llama.cpp#20824; seen here on a Sapphire Rapids VM): a clear
# error instead, unless the user says their machine runs them
AMX_FIX = ("CMAKE_ARGS='-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8' "
           "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python")


def check_amx(system_info: str, cpu_flags: frozenset[str]) -> None:
    """Refuse a llama.cpp build with AMX kernels inside a virtual machine (they crash there)."""
    if ("AMX_INT8 = 1" in system_info and "hypervisor" in cpu_flags
            and os.environ.get("ANYDRAFT_LLAMACPP_AMX") != "1"):
        raise AnydraftError(
            "this llama.cpp build uses AMX kernels, which crash on virtual machines "
            f"(llama.cpp issue 20824): rebuild it without them ({AMX_FIX}; `make install` does), "
            "use the torch backend, or set ANYDRAFT_LLAMACPP_AMX=1 if AMX works on this machine")


def requested_context() -> int:
    """The context window a session asks for: $ANYDRAFT_LLAMACPP_CONTEXT, else `DEFAULT_CONTEXT`
    (a model trained on fewer tokens gets its training window)."""
    return int(os.environ.get("ANYDRAFT_LLAMACPP_CONTEXT", 0)) or DEFAULT_CONTEXT


def _threads() -> int:
    return int(os.environ.get("ANYDRAFT_LLAMACPP_THREADS", 0)) or (os.cpu_count() or 1)


class LlamaCppModel:
    """A GGUF model loaded by llama.cpp (weights only; sessions bring their own context)."""

    def __init__(self, name: str, path: str, context: int | None = None, engine: Engine = LLAMACPP):
        from ..hardware.machine import cpu_flags

        lib = engine.api()
        check_amx(lib.llama_print_system_info().decode(errors="replace"), cpu_flags())
        problem = engine.problem(path)
        if problem:
            raise AnydraftError(f"{engine.label} {problem}: run {name} on another backend "
                                "(llamacpp or torch)")
        self.name, self.path, self.engine = name, path, engine
        self._model = lib.llama_model_load_from_file(path.encode(), model_params(engine, lib))
        if not self._model:
            raise AnydraftError(f"{engine.label} could not load {path!r}: is it a complete GGUF file?")
        if lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model):
            lib.llama_model_free(self._model)
            self._model = None
            raise AnydraftError(f"{name} is a recurrent or hybrid model: {ROLLBACK_HELP}")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(self._vocab))
        train = int(lib.llama_model_n_ctx_train(self._model))
        wanted = context or requested_context()
        self.max_length = min(train, wanted) if train > 0 else wanted
        self.eos_ids = frozenset(i for i in end_ids(lib, self._model, self._vocab) if i >= 0)
        self._lib = lib
        # (rows, cells) -> emptied contexts of finished sessions and batches, for the next ones;
        # the server's workers take and give back at once (`_pool` guards it and `_batches`)
        self._spare: dict[tuple[int, int], list[_Context]] = {}
        self._batches = 0  # batch contexts (of several rows) in use
        self._pool = threading.Lock()

    @classmethod
    def load(cls, source, progress=None, engine: Engine = LLAMACPP) -> LlamaCppModel:
        start = time.perf_counter()
        model = cls(source.name, os.path.join(source.path, source.gguf_file), engine=engine)
        if progress:
            progress(f"loaded {source.name} ({engine.label}, {source.gguf_file}; library: {engine.library()}) in "
                     f"{time.perf_counter() - start:.1f} s")
        return model

    def new_session(self, exact: bool = False) -> LlamaCppSession:
        return (ExactSession if exact else LlamaCppSession)(self, self._context())

    def _context(self, rows: int = 1, cells: int | None = None) -> _Context:
        """A context for ``rows`` sequences in ``cells`` tokens: a spare one of that shape
        where a finished session or batch left one (`_release`), else a new one (made outside
        the lock: it takes seconds)."""
        with self._pool:
            self._batches += rows > 1
            spare = self._spare.get((rows, cells or self.max_length))
            if spare:
                return spare.pop()
        try:
            return _Context(self, rows, cells)
        except BaseException:
            with self._pool:
                self._batches -= rows > 1
            raise

    def _release(self, context: _Context) -> None:
        """A finished session's or batch's context, emptied, waits for the next one of its
        shape (creating one allocates the whole KV cache: 0.6-6 s for a batch of SmolLM2 on
        the Zen 3). A batch's is large (rows x cells): it waits only where no other batch is
        in use and then alone, so a batch made again after a failed step while the failed one
        was still held (a server's worker, issue 61) does not keep twice the memory for good."""
        self._lib.llama_memory_clear(context.memory, True)
        freed = []
        with self._pool:
            if context.rows > 1:
                self._batches -= 1
                freed = [old for shape in list(self._spare) if shape[0] > 1 for old in self._spare.pop(shape)]
                if self._batches:
                    freed.append(context)
            if context not in freed:
                self._spare.setdefault((context.rows, context.cells), []).append(context)
        for old in freed:
            old.free()

    def tokenize(self, text: bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama.cpp's own tokenizer (used to prove the transformers tokenizer agrees)."""
        lib = self._lib
        size = len(text) + 16
        buf = (lib.llama_token * size)()
        n = lib.llama_tokenize(self._vocab, text, len(text), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (lib.llama_token * size)()
            n = lib.llama_tokenize(self._vocab, text, len(text), buf, size, add_special, parse_special)
        return list(buf[:n])

    def token_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes llama.cpp renders for one token (its own vocabulary)."""
        buf = ctypes.create_string_buffer(256)
        n = self._lib.llama_token_to_piece(self._vocab, token, buf, 256, 0, special)
        return buf.raw[:max(n, 0)]

    def __del__(self):
        for contexts in getattr(self, "_spare", {}).values():
            for context in contexts:
                context.free()
        self._spare = {}
        model = getattr(self, "_model", None)
        if model:
            self._lib.llama_model_free(model)
            self._model = None


class _Context:
    """A llama.cpp context (one KV cache of ``cells`` tokens for ``rows`` sequences) with its
    token batch."""

    def __init__(self, model: LlamaCppModel, rows: int = 1, cells: int | None = None):
        lib = self._lib = model._lib
        self.cells, self.rows, self.threads = cells or model.max_length, rows, llamacpp_threads()
        params = context_params(model.engine, lib, self.cells, rows, BATCH, self.threads)
        self.ctx = lib.llama_init_from_model(model._model, params)
        if not self.ctx:
            fewer = " or batch fewer rows" if rows > 1 else ""
            raise AnydraftError(f"{model.engine.label} could not create a context of {self.cells} tokens "
                                f"for {model.name}: set ANYDRAFT_LLAMACPP_CONTEXT lower{fewer}")
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(BATCH, 0, 1)

    def use_free_cores(self) -> None:
        """Run the next call on `llamacpp_threads` threads (models/threads.py: a thread on a
        core another process keeps busy makes each of the graph's operations wait for it)."""
        self.use_threads(llamacpp_threads())

    def use_threads(self, threads: int) -> None:
        """Run the next call on ``threads`` threads."""
        if threads != self.threads:
            self._lib.llama_set_n_threads(self.ctx, threads, threads)
            self.threads = threads

    def free(self) -> None:
        if self.ctx:
            self._lib.llama_batch_free(self.batch)
            self._lib.llama_free(self.ctx)
            self.ctx = None


class LlamaCppSession:
    """One sequence's KV cache in its own llama.cpp context (see the module docstring)."""

    batch = None  # a sequence of its own
    exact = False  # models/exact.py

    def __init__(self, model: LlamaCppModel, context: _Context):
        self._lib, self._owner, self._context = model._lib, model, context
        self._ctx, self._memory, self._batch = context.ctx, context.memory, context.batch
        self.vocab_size = model.vocab_size
        self.max_length = model.max_length
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def _chunk(self, tokens: int, rows: int) -> int:
        """The most tokens of one llama_decode in a call of ``tokens`` returning ``rows`` logits."""
        return BATCH

    def _set_threads(self, tokens: int, at: int) -> None:
        """The threads of the next call of ``tokens`` tokens from position ``at``: the free cores."""
        self._context.use_free_cores()

    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        self._check_open()
        n, rows = len(ids), rows_to_return(self._length, self.max_length, ids, rows)
        lib, batch = self._lib, self._batch
        out = np.empty((rows, self.vocab_size), dtype=np.float32)
        first_row = n - rows
        size = self._chunk(n, rows)
        for start in range(0, n, size):
            chunk = ids[start:start + size]
            wanted = []
            for j, token in enumerate(chunk):
                i = start + j
                batch.token[j] = token
                batch.pos[j] = self._length + i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = i >= first_row
                if i >= first_row:
                    wanted.append(j)
            batch.n_tokens = len(chunk)
            self._set_threads(len(chunk), self._length + start)
            status = lib.llama_decode(self._ctx, batch)
            if status != 0:
                self.rollback(self._length)  # drop whatever the failed call left behind
                raise AnydraftError(f"{self._owner.engine.label} decode failed (status {status})")
            for j in wanted:
                row = lib.llama_get_logits_ith(self._ctx, j)
                out[start + j - first_row] = np.ctypeslib.as_array(row, shape=(self.vocab_size,))
        self._length += n
        return torch.from_numpy(out)

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self._length, (n, self._length)
        self._check_open()
        # false where the memory cannot be cut at n (recurrent state: refused at load)
        if not self._lib.llama_memory_seq_rm(self._memory, 0, n, -1):
            raise AnydraftError(f"{self._owner.engine.label} could not roll the cache of {self._owner.name} back "
                                f"to {n} tokens: {ROLLBACK_HELP}")
        self._length = n

    def close(self) -> None:
        """Hand the context to the next session now (`Generation.leave`), not when this object
        is collected: a server's finished generation can wait for the garbage collector in a
        reference cycle, and every request until then made a new context (a first one for
        Qwen2.5-1.5B's 8192 cells: 1.3 s, on the Zen 5). Using the session afterwards is an
        error."""
        context, self._context = getattr(self, "_context", None), None
        if context is not None:
            self._ctx = self._memory = self._batch = None
            self._owner._release(context)

    def _check_open(self) -> None:
        if self._context is None:
            raise AnydraftError(f"this {self._owner.engine.label} session of {self._owner.name} was closed")

    __del__ = close


# the most tokens of one llama_decode of an exact session (`ExactSession`). llama.cpp picks its
# matrix products' kernels by the tokens of a call: from 4 rows on, the repacked GEMM of the
# K-quants and Q4_0 (tiles of 4 rows, the rest by dot products), below 4 a dot product per row
# and weight row, the same whatever the row count. Measured on Qwen2.5-0.5B's and -1.5B's
# GGUFs: calls of 1, 2 or 3 tokens give a position bit-identical logits, calls of 4 or more do
# not (docs/exact.md). Calls padded to a fixed 8 tokens were identical too, but cost a plain
# step 3-4 times its time, where reading a verification 3 tokens a call costs a plain step nothing
EXACT_TOKENS = 3

# context (cells of the KV cache before a call) from which llama.cpp's CPU flash attention
# splits a one-token call's keys over the threads, and so sums them in another order than a
# call of 2 or 3 tokens (up to 0.34 logits apart on Qwen2.5-0.5B Q4, 2 threads; identical below
# 256 and on one thread: docs/exact.md). An exact session runs such calls on one thread
SPLIT_KEYS = 256


def exact_batch(model: LlamaCppModel, max_rows: int):
    """The rows of an exact batch: exact sessions fed one after another. One context for all
    rows would score a row's tokens in calls of other sizes than its session alone, and place
    its positions in other cells of the shared KV cache, over which attention sums in their
    order (docs/exact.md)."""
    from .batch import SerialBatch

    return SerialBatch(lambda: model.new_session(exact=True), max_rows, exact=True)


class ExactSession(LlamaCppSession):
    """A `LlamaCppSession` that decodes at most `EXACT_TOKENS` tokens a call, a prompt read
    (`exact.reads`) as a plain session does, on a fixed number of threads (one for a single
    token after `SPLIT_KEYS`): a position's logits are then bit-identical whatever call scores
    it (docs/exact.md)."""

    exact = True

    def _chunk(self, tokens: int, rows: int) -> int:
        return BATCH if reads(tokens, rows) else EXACT_TOKENS  # a prompt: as a plain read

    def _set_threads(self, tokens: int, at: int) -> None:
        # the same count whatever the load; one thread where llama.cpp would split the keys
        alone = tokens == 1 and at >= SPLIT_KEYS
        self._context.use_threads(1 if alone else _threads())


class LlamaCppBatch(OwnedRows):
    """Up to ``max_rows`` sequences of one model in one llama.cpp context, one sequence id per
    row: a `BatchSession` (models/batch.py) whose ``feed_rows`` is ONE ``llama_decode`` (one
    per ``BATCH`` tokens when the rows bring more), so the weights are read once for all rows.
    Rollback and leaving cut the row's sequence id out of the cache.

    The KV cache is unified: one pool of ``cells`` tokens that every row draws from. llama.cpp's
    split cache would give each row ``cells / max_rows`` cells, and cut a batch into micro-batches
    holding the same number of tokens from each row (rows of 6, 1 and 3 tokens: several graph
    evaluations, no gain: llama.cpp's ``split_equal``, read in its source for issue 21). The pool defaults to ``max_rows`` full
    windows, the memory ``max_rows`` sessions would take (SmolLM2: 23 KB a token, 8 rows of 8192
    tokens 1.5 GB; Qwen2.5-1.5B 28 KB, 1.9 GB); a smaller pool serves rows that rarely fill
    their window, and a call that finds it full fails with a clear error, its rows unchanged.

    A row's logits depend on nothing the other rows hold, but they can differ from the row fed
    alone by rounding: llama.cpp's CPU kernels (flash attention's f16 sums, the tiles of a
    matrix product) round with the shape of the call and the row's place in it, as a session's
    logits already do with the sizes it is fed in (tests/models/test_llamacpp_batch.py)."""

    exact = False  # an exact batch is `exact_batch`

    def __init__(self, model: LlamaCppModel, max_rows: int, cells: int | None = None):
        lib = model._lib
        limit = max_sequences(lib)
        if not 1 <= max_rows <= limit:
            raise AnydraftError(f"a {model.engine.label} batch holds 1 to {limit} rows (got max_rows={max_rows})")
        self._lib, self._owner, self.max_rows = lib, model, max_rows
        self.vocab_size, self.max_length = model.vocab_size, model.max_length
        self.cells = cells or max_rows * model.max_length
        self._context = model._context(max_rows, self.cells)
        # llama.cpp lowers its batch to a pool smaller than BATCH, and aborts on a longer one
        self._chunk = int(lib.llama_n_batch(self._context.ctx))
        self._rows: dict[int, int] = {}  # row -> its length

    def add_row(self) -> int:
        self.reclaim()
        if len(self._rows) >= self.max_rows:
            raise full(self.max_rows)
        row = min(set(range(self.max_rows)) - set(self._rows))
        self._rows[row] = 0
        return row

    def remove_row(self, row: int) -> None:
        if self._rows.pop(row, None) is not None:
            self._lib.llama_memory_seq_rm(self._context.memory, row, -1, -1)  # all of it: never fails

    def length(self, row: int) -> int:
        return self._rows[row]

    def rows_taken(self) -> int:
        return len(self._rows)

    def copy_prefix(self, source: int, row: int, n: int) -> None:
        """Give the empty ``row`` the first ``n`` positions of ``source`` (a kept row,
        models/prefix.py): the unified cache tags the same cells with ``row`` too, no copy of
        their keys and values; either row's later rollback leaves the other's alone."""
        assert self._rows[row] == 0 and n <= self._rows[source], (row, source, n)
        self._lib.llama_memory_seq_cp(self._context.memory, source, row, 0, n)
        self._rows[row] = n

    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        self.reclaim()
        lib, ctx, batch = self._lib, self._context.ctx, self._context.batch
        out, tokens = {}, []  # tokens: (row, id, position, logits index or -1), in decode order
        for row, ids in feeds.items():
            length = self._rows[row]
            wanted = rows_to_return(length, self.max_length, ids, rows[row])
            out[row] = np.empty((wanted, self.vocab_size), dtype=np.float32)
            first = len(ids) - wanted
            tokens += [(row, token, length + i, i - first) for i, token in enumerate(ids)]
        # chunks keep each row's tokens in order, so every row's positions stay consecutive
        for start in range(0, len(tokens), self._chunk):
            chunk = tokens[start:start + self._chunk]
            for j, (row, token, pos, k) in enumerate(chunk):
                batch.token[j] = token
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = row
                batch.logits[j] = k >= 0
            batch.n_tokens = len(chunk)
            self._context.use_free_cores()
            status = lib.llama_decode(ctx, batch)
            if status != 0:
                for row in feeds:  # drop whatever this call left behind, earlier chunks included
                    lib.llama_memory_seq_rm(self._context.memory, row, self._rows[row], -1)
                room = (f": the KV cache of {self.cells} tokens the rows share is full (give the batch "
                        "more cells, or fewer rows)") if status == 1 else ""
                raise AnydraftError(f"{self._owner.engine.label} decode failed (status {status}){room}")
            for j, (row, _, _, k) in enumerate(chunk):
                if k >= 0:
                    logits = lib.llama_get_logits_ith(ctx, j)
                    out[row][k] = np.ctypeslib.as_array(logits, shape=(self.vocab_size,))
        for row, ids in feeds.items():
            self._rows[row] += len(ids)
        return {row: torch.from_numpy(logits) for row, logits in out.items()}

    def rollback(self, row: int, n: int) -> None:
        assert 0 <= n <= self._rows[row], (n, self._rows[row])
        if not self._lib.llama_memory_seq_rm(self._context.memory, row, n, -1):
            raise AnydraftError(f"{self._owner.engine.label} could not roll the cache of {self._owner.name} back "
                                f"to {n} tokens: {ROLLBACK_HELP}")
        self._rows[row] = n

    def __del__(self):
        context = getattr(self, "_context", None)
        if context is not None:
            self._owner._release(context)
            self._context = None


# weight types a GGUF model can be rewritten in (`quantize`): llama.cpp has batched kernels for
# both on x86 (repacked Q4_0 GEMM, tinyBLAS Q8_0), where K-quants such as the catalog's Q4_K_M
# take a dot product per row, so their cost curves can be flatter (docs/hardware.md)
QUANTS = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def quantize(spec: str, kind: str, progress=None) -> str:
    """The path of a copy of the GGUF model ``spec`` with its weights in ``kind`` (`QUANTS`),
    written once into ``$ANYDRAFT_CACHE/quantized/`` by llama.cpp (about 20 s for 1.5B).

    The copy is a different model: greedy output equals plain decoding of the copy, not of the
    original. A copy of an already quantized file is quantized twice (llama.cpp's
    ``allow_requantize``), which costs a little quality; from a float16 GGUF it does not."""
    from .loading import resolve

    if kind not in QUANTS:
        raise AnydraftError(f"unknown quantization {kind!r}: use one of {', '.join(QUANTS)}")
    source = resolve(spec)
    if source.gguf_file is None:
        raise AnydraftError(f"{spec!r} is not a GGUF model: llama.cpp quantizes GGUF files only")
    out = cache_dir() / "quantized" / f"{source.cache_key}.{kind.upper()}.gguf"
    if out.is_file():
        return str(out)
    lib = LLAMACPP.api()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, QUANTS[kind])
    params.allow_requantize = True
    params.nthread = _threads()
    if progress:
        progress(f"writing a {kind.upper()} copy of {spec} (once)...")
    start = time.perf_counter()
    with replacing(out) as partial:
        failed = lib.llama_model_quantize(os.path.join(source.path, source.gguf_file).encode(),
                                          str(partial).encode(), ctypes.byref(params))
        if failed:
            raise AnydraftError(f"llama.cpp could not write a {kind.upper()} copy of {spec} (status {failed})")
    if progress:
        progress(f"wrote {out} in {time.perf_counter() - start:.0f} s")
    return str(out)
