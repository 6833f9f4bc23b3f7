"""The model session protocol, and its Hugging Face transformers backend.

A session owns the KV cache of one sequence. Everything above the models layer talks to a
model only through these three operations, so another backend (llama.cpp, a compiled static
cache) fits without touching the layers above:

- ``feed(ids, rows)``: append ``ids`` and return float32 CPU logits for the last ``rows`` of them,
  i.e. the next-token distributions at positions ``len - rows + 1 .. len`` after the call.
- ``rollback(n)``: forget every position ``>= n``.
- ``len(session)``: number of positions in the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..errors import AnydraftError


class Session(Protocol):
    vocab_size: int  # width of a logits row (may exceed the tokenizer's vocabulary: padding)
    max_length: int  # context window in tokens

    def __len__(self) -> int: ...

    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor: ...

    def rollback(self, n: int) -> None: ...


class HFSession:
    """A `Session` over any transformers causal LM with a `DynamicCache`.

    The cache is built without the model config on purpose: a config-aware cache gives
    sliding-window layers (Gemma-3) that discard positions outside the window, which makes a
    rollback after the window has been passed impossible. Full layers keep every position; the
    model still applies its sliding-window attention mask.
    """

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = context_window(model)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    @torch.inference_mode()
    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        n, rows = len(ids), rows_to_return(self, ids, rows)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=rows)
        self._length += n
        return out.logits[0, -rows:].float().cpu()

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self._length, (n, self._length)
        if n < self._length:
            self.cache.crop(-(self._length - n))
            self._length = n


def rows_to_return(session, ids: Sequence[int], rows: int | None) -> int:
    """Check a ``feed`` call against the protocol and the context window; the rows it returns."""
    n = len(ids)
    assert n > 0, "feed needs at least one token"
    rows = n if rows is None else rows
    assert 0 < rows <= n
    if len(session) + n > session.max_length:
        raise AnydraftError(
            f"sequence would reach {len(session) + n} tokens, beyond the model's context window "
            f"of {session.max_length}: shorten the prompt or lower max_new_tokens")
    return rows


def context_window(model) -> int:
    config = model.config.get_text_config(decoder=True)
    return int(getattr(config, "max_position_embeddings", None) or 2048)
