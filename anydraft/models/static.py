"""A static KV cache and a compiled forward pass: the torch backend's ``+compile`` path.

The approach of gpt-fast (PyTorch Labs, 2023): preallocate the KV cache at its full length so
every tensor keeps its shape and address, then let ``torch.compile`` turn the decoder into a
few fused kernels (inductor: C++/OpenMP on a CPU, Triton and CUDA graphs on a GPU), which
removes the Python and kernel-launch overhead of each layer. A shape is compiled once, so the
token counts of a call are padded up to a few fixed sizes (`BUCKETS`); longer reads (the prompt)
run the same model uncompiled on the same cache. The padding goes after the real tokens, where
the causal mask hides it from them, and is cut off the cache at once.

Rolling back is free: the cache keeps its tensors and only its length goes back (the next call
overwrites the stale positions, which the causal mask hides until then). Compiling costs minutes
on a CPU and its gain depends on the machine, so ``auto`` measures it like any path
(models/auto.py) and ``dtype="float32+compile"`` asks for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from ..errors import AnydraftError
from .session import context_window, fast_path_problem, model_name, rows_to_return
from .threads import on_model_threads

SUFFIX = "+compile"  # appended to a dtype name: the model runs compiled on a static cache
BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # token counts compiled; a call is padded up to the next one
# the static cache's length when the model's context window is longer: the cache is allocated
# whole, and a 32k-token window would cost gigabytes per session
MAX_LENGTH = 4096


class CompiledModel:
    """A transformers causal LM with its decoder body compiled and a pool of static caches (one
    per live session: a new cache per request would cost an allocation, and on a GPU new CUDA
    graphs)."""

    def __init__(self, model, max_length: int = MAX_LENGTH):
        problem = fast_path_problem(model)
        if problem:
            raise AnydraftError(f"{model_name(model)} {problem}: run it without {SUFFIX}")
        self.model = model
        self.config = model.config
        self.max_length = min(context_window(model), max_length)
        self.device = next(model.parameters()).device
        self.body = model.get_decoder()
        # a GPU replays each shape's kernels as one CUDA graph; a CPU folds the weights into
        # the compiled code as constants (inductor's freezing), which packs them for oneDNN
        how = {"mode": "reduce-overhead"} if self.device.type == "cuda" else {"options": {"freezing": True}}
        self.compiled = torch.compile(self.body, fullgraph=True, dynamic=False, **how)
        # every model of one architecture shares one forward function, which dynamo compiles
        # once per shape and model: leave room for a target and a drafter of one family
        limit = 4 * len(BUCKETS)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        self.head = model.get_output_embeddings()
        self.spare: list = []

    def new_session(self) -> StaticSession:
        return StaticSession(self)

    # what a LoadedModel asks of a transformers model
    def eval(self) -> CompiledModel:
        self.model.eval()
        return self

    def parameters(self):
        return self.model.parameters()

    def get_output_embeddings(self):
        return self.head

    def __getattr__(self, name):  # config, generation_config, eval, ...: the model's own
        return getattr(self.__dict__["model"], name)


class StaticSession:
    """A `Session` (models/session.py) over a `CompiledModel`'s static cache."""

    batch = None  # a sequence of its own
    exact = False  # models/exact.py

    def __init__(self, compiled: CompiledModel):
        from transformers import StaticCache

        self.compiled = compiled
        self.vocab_size = compiled.head.weight.shape[0]
        self.max_length = compiled.max_length
        if compiled.spare:
            self.cache = compiled.spare.pop()
            self.cache.crop(-int(self.cache.get_seq_length()))
        else:
            self.cache = StaticCache(config=compiled.config, max_cache_len=compiled.max_length)
            # allocated now, not at the first call: that call would compile a shape of its own
            config = compiled.config.get_text_config(decoder=True)
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            self.cache.early_initialization(1, config.num_key_value_heads, head_dim,
                                            compiled.head.weight.dtype, compiled.device)
        # back to the pool when closed or collected (a list's append is safe from any thread)
        self._free = weakref.finalize(self, compiled.spare.append, self.cache)
        self._length = 0

    def close(self) -> None:
        """Hand the cache to the next session now (`Generation.leave`); using the session
        afterwards is an error."""
        self._free()
        self.cache = None

    def __len__(self) -> int:
        return self._length

    @on_model_threads
    @torch.inference_mode()
    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        n, rows = len(ids), rows_to_return(self._length, self.max_length, ids, rows)
        size = next((b for b in BUCKETS if b >= n), None)
        if size is None or self._length + size > self.max_length:
            body, size = self.compiled.body, n  # a long read: uncompiled, unpadded
        else:
            body = self.compiled.compiled
        padded = list(ids) + [0] * (size - n)
        device = self.compiled.device
        input_ids = torch.tensor([padded], dtype=torch.long, device=device)
        positions = torch.arange(self._length, self._length + size, device=device).unsqueeze(0)
        hidden = body(input_ids=input_ids, position_ids=positions, cache=self.cache,
                      use_cache=True).last_hidden_state
        if size > n:
            self.cache.crop(-(size - n))  # the padding
        self._length += n
        return self.compiled.head(hidden[0, n - rows:n]).float().cpu()

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self._length, (n, self._length)
        if n < self._length:
            self.cache.crop(-(self._length - n))
            self._length = n
