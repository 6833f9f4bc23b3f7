"""`TorchBatch`: many sequences of one transformers model scored in one forward pass.

transformers' caches keep one length for the whole batch (``DynamicCache.crop`` cuts every
row alike), while speculative decoding rolls each sequence back on its own. So the cache here
is our own: per layer and row, keys and values of shape ``[1, heads, capacity, dim]``, each
row's grown on its own (a long prompt in one row costs the other rows nothing, issue 61) and
dropped when its row leaves, and one length per row.

A call is packed (ragged): every row's new tokens one after another in ONE sequence, each at
its row's own positions (``position_ids``), with no padding, so the linear layers, which are
nearly all of a step's work, compute exactly the tokens fed (rows offering 1 and 9 tokens
cost 10, not 18). Each layer writes a row's keys and values after that row's length, and
attention runs row by row (`_rows_attention`, through transformers' own attention function
for the model): token t of row r attends to positions ``<= length_r + t`` of its own row
only, so other rows, and whatever an earlier rollback left behind, are never seen. A rollback
is a number: the row's length. The model code is transformers' own; only the cache, the
attention dispatch and the mask are ours.

An exact batch (``exact=True``, models/exact.py) scores every position bit-identically whatever
the call: its linear layers multiply in fixed tiles (or in one product where that is the same,
`exact.uniform`), each query of a step attends alone to its own prefix (a prompt read,
`exact.reads`, attends as a row's tokens do without exact), and its calls run on a fixed number
of threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
from transformers.models.llama.modeling_llama import eager_attention_forward

from ..errors import AnydraftError
from . import exact as exact_scoring
from .batch import RowLengths
from .session import context_window, fast_path_problem, rows_to_return
from .threads import model_threads

MASKS = ("sdpa", "eager")  # attention implementations that take a ready 4D mask
# the attention implementation of a model that a `TorchBatch` has run, per implementation it
# had before: a packed call's attention when a layout comes with the call, else the model's own
PACKED = {base: f"anydraft_rows_{base}" for base in MASKS}
LAYOUT = "anydraft_rows_layout"  # the keyword that carries a call's layout to the attention
_installing = threading.Lock()


def base_attention(model) -> str | None:
    """The attention implementation ``model`` was loaded with (what it runs outside a packed
    call), whether or not a `TorchBatch` has installed its own (`install_packed`)."""
    attention = getattr(model.config, "_attn_implementation", None)
    return next((base for base, packed in PACKED.items() if packed == attention), attention)


def batchable(model) -> bool:
    """Whether `TorchBatch` runs ``model``: every layer full attention, a plain output layer,
    an attention that takes a 4D mask."""
    return fast_path_problem(model) is None and base_attention(model) in MASKS


def install_packed(model) -> str:
    """Set ``model``'s attention implementation, once and for good, to the packed one of the
    implementation it has (`PACKED`), and return that base one. A model is shared by the
    server's worker threads: switching the implementation for each call and back after it
    would switch it under another thread's call (its remaining layers would run the other
    attention, with the wrong mask). Outside a packed call the packed implementation is the
    base one, its masks made by the base's mask function: the switch changes nothing else."""
    with _installing:
        base = base_attention(model)
        if model.config._attn_implementation != PACKED[base]:
            model.config._attn_implementation_internal = PACKED[base]
        return base


# positions a row's cache holds at first: a prompt of up to this many tokens and its
# generation grow it rarely (it doubles), and 16 rows of Qwen2.5-1.5B hold it in 29 MB
MIN_CAPACITY = 64


class _Layer(CacheLayerMixin):
    """One layer's keys and values, per row; written at each row's own length."""

    is_compileable = False
    is_sliding = False

    def __init__(self, batch: TorchBatch):
        super().__init__()
        self.batch = batch
        self.keys: dict[int, torch.Tensor] = {}  # row -> [1, heads, capacity, dim]
        self.values: dict[int, torch.Tensor] = {}

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write each row's new keys and values (one packed sequence) after its length; return
        every row's whole cache, which `_rows_attention` reads row by row."""
        batch = self.batch
        for r, start, n in batch.call:
            at = batch.lengths[r]
            if r not in self.keys or self.keys[r].shape[2] < at + n:
                self._grow(r, key_states, value_states, at + n)
            self.keys[r][0, :, at:at + n] = key_states[0, :, start:start + n]
            self.values[r][0, :, at:at + n] = value_states[0, :, start:start + n]
        return self.keys, self.values

    def _grow(self, row: int, key_states, value_states, need: int) -> None:
        """Room for ``need`` positions in ``row`` (doubling: a long generation grows it rarely;
        never past the context window)."""
        old = self.keys[row].shape[2] if row in self.keys else 0
        capacity = min(max(need, 2 * old, MIN_CAPACITY), max(need, self.batch.max_length))
        for store, states in ((self.keys, key_states), (self.values, value_states)):
            grown = states.new_zeros((1, states.shape[1], capacity, states.shape[3]))
            if old:
                grown[:, :, :old] = store[row]
            store[row] = grown

    def drop(self, row: int) -> None:
        self.keys.pop(row, None)
        self.values.pop(row, None)

    def get_seq_length(self) -> int:
        return 0  # positions and the mask are given with every call

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0  # never asked: every call brings its own (unused) 4D mask

    def get_max_length(self) -> int:
        return -1


class _Cache(Cache):
    def __init__(self, batch: TorchBatch, layers: int):
        super().__init__(layers=[_Layer(batch) for _ in range(layers)])

    def drop(self, row: int) -> None:
        """Free ``row``'s keys and values in every layer (its row has left)."""
        for layer in self.layers:
            layer.drop(row)


class TorchBatch(RowLengths):
    """A `BatchSession` (models/batch.py) over a transformers causal LM (`batchable`)."""

    def __init__(self, model, max_rows: int, exact: bool = False):
        if max_rows < 1:
            raise AnydraftError(f"a batch needs at least one row (got max_rows={max_rows})")
        self.model, self.max_rows, self.exact = model, max_rows, exact
        if exact:
            exact_scoring.install(model)
        self.body, self.head = model.get_decoder(), model.get_output_embeddings()
        self.vocab_size = self.head.weight.shape[0]
        self.max_length = context_window(model)
        self.device = next(model.parameters()).device
        config = model.config.get_text_config(decoder=True)
        self.cache = _Cache(self, config.num_hidden_layers)
        self.attention = install_packed(model)  # what each row's attention runs
        self.lengths: dict[int, int] = {}
        self.call: list[tuple[int, int, int]] = []  # (row, start in the packed call, tokens)

    def remove_row(self, row: int) -> None:
        super().remove_row(row)
        self.cache.drop(row)

    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        self.reclaim()
        with model_threads(fixed=self.exact), torch.inference_mode():
            if not self.exact:
                return self._feed_rows(feeds, rows)
            with exact_scoring.tiled():
                return self._feed_rows(feeds, rows)

    def _feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        order = sorted(feeds)
        wanted = {r: rows_to_return(self.lengths[r], self.max_length, feeds[r], rows[r]) for r in order}
        ids, positions, self.call = [], [], []
        for r in order:
            self.call.append((r, len(ids), len(feeds[r])))
            ids += feeds[r]
            positions += range(self.lengths[r], self.lengths[r] + len(feeds[r]))
        layout = []
        for r, start, n in self.call:
            if self.exact and not exact_scoring.reads(n, wanted[r]):
                # each query alone over its own prefix: the attention of a plain step
                layout += [(r, start + t, 1, self.lengths[r] + t + 1, None) for t in range(n)]
            else:  # the row's tokens together (an exact prompt read: as it is read alone)
                layout.append((r, start, n, self.lengths[r] + n, self._mask(r, n)))
        hidden = self.body(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            # a ready 4D mask, which transformers passes on as it is; the rows' own masks
            # travel in the layout
            attention_mask=torch.ones((1, 1, len(ids), 1), dtype=torch.bool, device=self.device),
            cache=self.cache, use_cache=True,
            **{LAYOUT: (layout, self.exact)},
        ).last_hidden_state[0]
        # one output-layer product for every row's wanted positions: the layer is the largest
        # matrix of a small model, and a product per row would read it once per row
        spans = []
        for r, start, n in self.call:
            self.lengths[r] += n
            spans.append(hidden[start + n - wanted[r]:start + n])
        logits = self.head(torch.cat(spans)).float().cpu().split([wanted[r] for r in order])
        return dict(zip(order, logits, strict=True))

    def _mask(self, row: int, n: int) -> torch.Tensor | None:
        """Row ``row``'s mask for ``n`` new tokens: token t sees positions ``<= length + t``
        (None for one token: it sees the whole row); additive for eager attention."""
        if n == 1:
            return None
        length = self.lengths[row]
        keys = torch.arange(length + n, device=self.device)
        mask = (keys[None, :] <= length + torch.arange(n, device=self.device)[:, None])[None, None]
        if self.attention == "eager":
            dtype = self.head.weight.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask


def _packed(base: str):
    """The attention implementation `PACKED` names for ``base``: `_rows_attention` when a
    packed call's layout comes with the call, else ``base``'s own function (every other call
    of the model: a session's, another thread's)."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        own = ALL_ATTENTION_FUNCTIONS.get_interface(base, eager_attention_forward)
        if LAYOUT not in kwargs:
            return own(module, query, key, value, attention_mask, **kwargs)
        return _rows_attention(own, module, query, key, value, *kwargs.pop(LAYOUT), **kwargs)

    return attention


def _rows_attention(together, module, query, key, value, layout, exact, **kwargs):
    """Attention of a packed call (`TorchBatch.feed_rows`): each row's queries against its own
    cache only, through the model's own attention function ``together``. ``query``: ``[1,
    heads, tokens, dim]``, every row's tokens one after another; ``key``, ``value``: row ->
    that row's cache (`_Layer.update`)."""
    outs = [(_one_query if exact and n == 1 else together)(
                module, query[:, :, start:start + n], key[r][:, :, :width],
                value[r][:, :, :width], mask, **kwargs)[0]
            for r, start, n, width, mask in layout]
    return torch.cat(outs, dim=1), None  # [1, tokens, heads, dim], as every attention returns


def _one_query(module, query, key, value, mask, **kwargs):
    """One query of an exact call against its own prefix (``mask`` None: it sees all of
    ``key``), the same computation whatever call it came in (models/exact.py). torch's own
    attention, its grouped heads read in place (transformers' sdpa would copy the whole prefix
    once per head group and query)."""
    assert query.shape[2] == 1 and mask is None
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, scale=module.scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2), None


for _base, _name in PACKED.items():
    AttentionInterface.register(_name, _packed(_base))
    AttentionMaskInterface.register(_name, ALL_MASK_ATTENTION_FUNCTIONS[_base])
