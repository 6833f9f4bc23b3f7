"""`TorchBatch`: many sequences of one transformers model scored in one forward pass.

transformers' caches keep one length for the whole batch (``DynamicCache.crop`` cuts every
row alike), while speculative decoding rolls each sequence back on its own. So the cache here
is our own: per layer, keys and values of shape ``[max_rows, heads, capacity, dim]`` and one
length per row. A call feeds each row's new tokens right-padded to the longest, at that row's
own positions (``position_ids``), writes them after the row's length, and attends through a
4D mask that lets token t of row r see exactly positions ``<= length_r + t`` of its own row:
the padding (after the real tokens) and whatever an earlier rollback left behind are never
seen. Afterwards each row's length counts only its real tokens, so the padding is gone as a
rollback is: by a number. The model code is transformers' own; only the cache and the mask
are ours.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..errors import AnydraftError
from .batch import full
from .session import context_window, fast_path_problem, rows_to_return

MASKS = ("sdpa", "eager")  # attention implementations that take a ready 4D mask


def batchable(model) -> bool:
    """Whether `TorchBatch` runs ``model``: every layer full attention, a plain output layer,
    an attention that takes a 4D mask."""
    attention = getattr(model.config, "_attn_implementation", None)
    return fast_path_problem(model) is None and attention in MASKS


class _Layer(CacheLayerMixin):
    """One layer's keys and values for every row; written at each row's own length."""

    is_compileable = False
    is_sliding = False

    def __init__(self, batch: TorchBatch):
        super().__init__()
        self.batch = batch
        self.keys = self.values = None

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        batch, tokens = self.batch, key_states.shape[2]
        need = max(batch.lengths[r] for r in batch.call_rows) + tokens
        if self.keys is None or self.keys.shape[2] < need:
            self._grow(key_states, value_states, need)
        for i, r in enumerate(batch.call_rows):
            start = batch.lengths[r]
            self.keys[r, :, start:start + tokens] = key_states[i]
            self.values[r, :, start:start + tokens] = value_states[i]
        rows, width = batch.call_rows, batch.call_width
        if rows == list(range(rows[0], rows[0] + len(rows))):  # consecutive rows: a view
            return self.keys[rows[0]:rows[-1] + 1, :, :width], self.values[rows[0]:rows[-1] + 1, :, :width]
        index = torch.tensor(rows, device=self.keys.device)
        return self.keys[index, :, :width], self.values[index, :, :width]

    def _grow(self, key_states, value_states, need: int) -> None:
        """Room for ``need`` positions per row (doubling: a long generation grows it rarely)."""
        old = 0 if self.keys is None else self.keys.shape[2]
        capacity = max(need, 2 * old, 64)
        heads, dim = key_states.shape[1], key_states.shape[3]
        keys = key_states.new_zeros((self.batch.max_rows, heads, capacity, dim))
        values = value_states.new_zeros((self.batch.max_rows, heads, capacity, value_states.shape[3]))
        if old:
            keys[:, :, :old], values[:, :, :old] = self.keys, self.values
        self.keys, self.values = keys, values

    def get_seq_length(self) -> int:
        return 0  # positions and the mask are given with every call

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.batch.call_width, 0

    def get_max_length(self) -> int:
        return -1


class _Cache(Cache):
    def __init__(self, batch: TorchBatch, layers: int):
        super().__init__(layers=[_Layer(batch) for _ in range(layers)])


class TorchBatch:
    """A `BatchSession` (models/batch.py) over a transformers causal LM (`batchable`)."""

    def __init__(self, model, max_rows: int):
        if max_rows < 1:
            raise AnydraftError(f"a batch needs at least one row (got max_rows={max_rows})")
        self.model, self.max_rows = model, max_rows
        self.body, self.head = model.get_decoder(), model.get_output_embeddings()
        self.vocab_size = self.head.weight.shape[0]
        self.max_length = context_window(model)
        self.device = next(model.parameters()).device
        self.eager = model.config._attn_implementation == "eager"
        config = model.config.get_text_config(decoder=True)
        self.cache = _Cache(self, config.num_hidden_layers)
        self.lengths: dict[int, int] = {}
        self.call_rows: list[int] = []
        self.call_width = 0

    def add_row(self) -> int:
        if len(self.lengths) >= self.max_rows:
            raise full(self.max_rows)
        row = min(set(range(self.max_rows)) - set(self.lengths))
        self.lengths[row] = 0
        return row

    def remove_row(self, row: int) -> None:
        self.lengths.pop(row, None)

    def length(self, row: int) -> int:
        return self.lengths[row]

    def rollback(self, row: int, n: int) -> None:
        assert 0 <= n <= self.lengths[row], (n, self.lengths[row])
        self.lengths[row] = n

    @torch.inference_mode()
    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        order = sorted(feeds)
        wanted = {r: rows_to_return(self.lengths[r], self.max_length, feeds[r], rows[r]) for r in order}
        tokens = max(len(feeds[r]) for r in order)
        width = max(self.lengths[r] for r in order) + tokens
        ids = torch.zeros((len(order), tokens), dtype=torch.long)
        positions = torch.empty((len(order), tokens), dtype=torch.long)
        mask = torch.empty((len(order), 1, tokens, width), dtype=torch.bool)
        keys = torch.arange(width)
        for i, r in enumerate(order):
            ids[i, :len(feeds[r])] = torch.as_tensor(list(feeds[r]))
            positions[i] = self.lengths[r] + torch.arange(tokens)
            mask[i, 0] = keys[None, :] <= positions[i][:, None]
        if self.eager:  # eager attention adds its mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.head.weight.dtype).masked_fill(
                ~mask, torch.finfo(self.head.weight.dtype).min)
        self.call_rows, self.call_width = order, width
        hidden = self.body(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                           attention_mask=mask.to(self.device), cache=self.cache,
                           use_cache=True).last_hidden_state
        # one output-layer product for every row's wanted positions: the layer is the largest
        # matrix of a small model, and a product per row would read it once per row
        spans = []
        for i, r in enumerate(order):
            n = len(feeds[r])
            self.lengths[r] += n
            spans.append(hidden[i, n - wanted[r]:n])
        logits = self.head(torch.cat(spans)).float().cpu().split([wanted[r] for r in order])
        return dict(zip(order, logits, strict=True))
