"""The model session protocol, and its Hugging Face transformers backend.

A session owns the KV cache of one sequence. Everything above the models layer talks to a
model only through these three operations, so another backend (llama.cpp, a compiled static
cache) fits without touching the layers above:

- ``feed(ids, rows)``: append ``ids`` and return float32 CPU logits for the last ``rows`` of them,
  i.e. the next-token distributions at positions ``len - rows + 1 .. len`` after the call.
- ``rollback(n)``: forget every position ``>= n``.
- ``len(session)``: number of positions in the cache.

A session also says whether it is a row of a batch: ``batch`` is the `BatchSession` it is a row
of (models/batch.py `RowView`, with ``row`` its row there), or None for a sequence of its own.
A decoding step scores the rows of one batch in one call (planning/call.py `calls`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from ..errors import AnydraftError
from ..planning.settings import PREFILL_CHUNK
from .threads import on_model_threads


class Session(Protocol):
    vocab_size: int  # width of a logits row (may exceed the tokenizer's vocabulary: padding)
    max_length: int  # context window in tokens
    batch: object  # the BatchSession this session is a row of, or None
    exact: bool  # scores a position bit-identically whatever the call (models/exact.py)

    def __len__(self) -> int: ...

    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor: ...

    def rollback(self, n: int) -> None: ...


def close_session(session) -> None:
    """Free ``session``'s cache or row now, where it has one to free (``close()``; None, or a
    session without it, keeps nothing to free: its cache goes with the object)."""
    free = getattr(session, "close", None)
    if free is not None:
        free()


def read_in_chunks(session: Session, ids: Sequence[int], cancel: Callable[[], str | None],
                   chunk: int = PREFILL_CHUNK) -> str | None:
    """Feed ``ids`` (their logits unused) ``chunk`` tokens at a time, asking ``cancel`` before
    each chunk: its first answer that is not None, the rest left unread; None once all are read.
    The session then holds the same positions as after one call: only the number of calls differs."""
    for start in range(0, len(ids), chunk):
        if reason := cancel():
            return reason
        session.feed(ids[start:start + chunk], rows=1)
    return None


class HFSession:
    """A `Session` over any transformers causal LM with a `DynamicCache`.

    The cache is built without the model config on purpose: a config-aware cache gives
    sliding-window layers (Gemma-3) that discard positions outside the window, which makes a
    rollback after the window has been passed impossible. Full layers keep every position; the
    model still applies its sliding-window attention mask.
    """

    batch = None  # a sequence of its own
    exact = False  # models/exact.py

    def __init__(self, model):
        from transformers import DynamicCache

        check_rollback(model)
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = context_window(model)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    @on_model_threads
    @torch.inference_mode()
    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        n, rows = len(ids), rows_to_return(self._length, self.max_length, ids, rows)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=rows)
        self._length += n
        return out.logits[0, -rows:].float().cpu()

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self._length, (n, self._length)
        if n < self._length:
            self.cache.crop(-(self._length - n))
            if self.cache.get_seq_length() != n:  # a layer kept state it could not cut
                raise AnydraftError(
                    f"the cache of {model_name(self.model)} could not be rolled back to {n} tokens "
                    f"(it holds {self.cache.get_seq_length()}): {ROLLBACK_HELP}")
            self._length = n


# Cache layers that keep one entry per position, so any suffix can be cut off (transformers'
# names, as `get_layer_types_and_kwargs` reads them from a config). Recurrent layers (Mamba,
# linear attention, LFM2's convolutions) fold every token into one state: no position can be
# forgotten, so a rejected draft could never be taken back.
ROLLBACK_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "dummy"})
RECURRENT_MODELS = frozenset({"rwkv", "xlstm"})  # recurrent, with no layer types in the config
ROLLBACK_HELP = ("speculative decoding takes rejected draft tokens back out of the cache, which "
                 "recurrent and hybrid models (Mamba, Granite-4-H, LFM2, Qwen3-Next, ...) cannot "
                 "do: use a transformer (attention-only) model as target and drafter")


def model_name(model) -> str:
    """A transformers model's name: where it was loaded from, else its class."""
    return getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__


def check_rollback(model) -> None:
    """Refuse a transformers model whose cache cannot be rolled back to any position."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config.get_text_config(decoder=True)
    if getattr(config, "model_type", None) in RECURRENT_MODELS:
        kinds = {"recurrent"}
    else:
        try:
            kinds = set(get_layer_types_and_kwargs(config)[0]) - ROLLBACK_LAYERS
        except (AttributeError, KeyError, TypeError, ValueError):
            kinds = set()  # a config transformers cannot read layer types from: `rollback` checks
    if kinds:
        raise AnydraftError(f"{model_name(model)} has {', '.join(sorted(kinds))} layers: {ROLLBACK_HELP}")


def fast_path_problem(model) -> str | None:
    """Why a cache and output layer of our own (a static cache, rows of a batch) cannot run
    ``model``, or None: they keep every position of full-attention layers only (a sliding
    window would need its own bookkeeping) and apply the plain output layer (a model that
    rescales its logits in its own forward pass would be scored wrong)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config.get_text_config(decoder=True)
    kinds = set(get_layer_types_and_kwargs(config)[0]) - {"full_attention"}
    if kinds:
        return f"has {', '.join(sorted(kinds))} layers"
    scaled = [name for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
              if getattr(config, name, None) not in (None, 1, 1.0)]
    if scaled:
        return f"rescales its logits ({', '.join(scaled)})"
    return None


def rows_to_return(length: int, max_length: int, ids: Sequence[int], rows: int | None) -> int:
    """Check a ``feed`` of ``ids`` to a sequence of ``length`` tokens (a session, or a row of a
    batch) against the protocol and the context window; the rows it returns."""
    n = len(ids)
    assert n > 0, "feed needs at least one token"
    rows = n if rows is None else rows
    assert 0 < rows <= n
    if length + n > max_length:
        raise AnydraftError(
            f"sequence would reach {length + n} tokens, beyond the model's context window "
            f"of {max_length}: shorten the prompt or lower max_new_tokens")
    return rows


def context_window(model) -> int:
    config = model.config.get_text_config(decoder=True)
    return int(getattr(config, "max_position_embeddings", None) or 2048)
