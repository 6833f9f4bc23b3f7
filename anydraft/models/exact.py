"""Exact scoring (issue 41, docs/exact.md): every position's logits bit-identical whatever call
scores it (one token or a draft of k + 1, alone or beside other rows of a batch), so greedy
output equals plain one-request decoding on the same path, for every method and batch.

What makes a position's logits depend on its call, measured on the torch CPU paths (float32,
bfloat16, each with and without +onednn; docs/exact.md):

- matrix products choose their kernel by the number of rows M (a call of 1 row and one of 2..64
  differ, and float32's default kernel differs between M = 2, 3 and 4 and for row positions
  at M = 5 and 9); at a fixed M that is a multiple of 4 a row's result depends on its own input
  row only (not on its place in the call or on the other rows), on 1 thread and on 2;
- attention over n queries with a causal mask rounds differently from one query alone;
- float32 calls round differently on 1 and on 2 threads (bfloat16 did not, here).

So an exact call runs every linear layer on tiles of exactly `TILE` rows (the last one padded
with zeros), each query's attention as one query alone over its own prefix, and the model on a
fixed thread count (models/threads.py `model_threads`). Elementwise work (norms, rotary
embeddings, activations) is per row and already the same in any call. A prompt is read as
without exact (`reads`), in the same pieces on every path.

Where one product of any multiple of `TILE` rows gives each row what tiles of `TILE` give
(measured here for every multiple of 4 up to 512 rows, on both dtypes: `uniform` checks it on
the running machine, once per kind of layer), a call's rows are multiplied in one product,
padded to a multiple of `TILE`: the same numbers, without reading the weights once per tile
(a prompt read of 256 tokens took 32 tile products per layer).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading

import torch

# rows of every matrix product in an exact call: a multiple of 4 (measured row-invariant at 4,
# 8, 16 and 32, where 5 and 9 were not), and the smallest that holds a typical verification
# (a draft of up to 7 tokens and its bonus) in one tile: a plain step pays for TILE rows to
# score 1, a longer draft for one more tile per TILE tokens (docs/exact.md has the costs)
TILE = 8


def reads(tokens: int, rows: int) -> bool:
    """Whether an exact call of ``tokens`` tokens that returns the logits of its last ``rows``
    is a prompt read: more than one token, the last one's logits only. Nothing else calls so (a
    step asks for every candidate's logits, plain decoding's for its one token), and every path
    reads a prompt in the same pieces, `PREFILL_CHUNK` tokens from its start (decoding/loop.py
    and planning/call.py `prefill`), the last prompt token left for the first step. So an exact
    call reads a prompt as a plain call does, at its cost: a prompt position is then computed
    by the same call alone, in any batch, before any method."""
    return tokens > 1 and rows == 1


# rows at which `uniform` compares one product with tiles of TILE: multiples of TILE at and
# beside the sizes where kernels change their blocking (16, 64, 256, 512), up to the largest
# exact call (a prompt piece of 256 tokens beside 16 rows of a draft of 16 and its bonus)
UNIFORM_ROWS = (16, 48, 128, 264, 528)

_tiling = contextvars.ContextVar("anydraft_exact_tiling", default=False)
_uniform: dict[tuple, bool] = {}
_installing = threading.Lock()  # two workers making exact batches of one model install once


def uniform(layer: torch.nn.Module) -> bool:
    """Whether one product of each of `UNIFORM_ROWS` rows gives every row bit for bit what
    tiles of `TILE` give, for ``layer``'s kind (its class, shape, dtype, bias) at the current
    thread count: measured once, on random rows (kernels are chosen by shape, not values)."""
    weight = layer.weight
    key = (type(layer).__name__, layer.in_features, layer.out_features, weight.dtype,
           layer.bias is not None, torch.get_num_threads())
    if key not in _uniform:
        rows = torch.randn(UNIFORM_ROWS[-1], layer.in_features,
                           generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        tiles = torch.cat([layer(rows[i:i + TILE]) for i in range(0, len(rows), TILE)])
        _uniform[key] = all(torch.equal(layer(rows[:m]), tiles[:m]) for m in UNIFORM_ROWS)
    return _uniform[key]


@contextlib.contextmanager
def tiled():
    """Inside, every `TiledLinear` of any model multiplies in tiles of `TILE` rows."""
    token = _tiling.set(True)
    try:
        yield
    finally:
        _tiling.reset(token)


class TiledLinear(torch.nn.Module):
    """A linear layer (``nn.Linear`` or models/kernels.py `PackedLinear`) that, inside `tiled`,
    multiplies its input in tiles of exactly `TILE` rows, or in one product padded to a multiple
    of `TILE` where that is the same (``whole`` and `uniform`); elsewhere it is the layer itself."""

    def __init__(self, inner: torch.nn.Module, whole: bool = True):
        super().__init__()
        self.inner, self.whole = inner, whole
        self.in_features, self.out_features = inner.in_features, inner.out_features

    @property
    def weight(self):  # what reads a linear layer's width or dtype reads the inner one's
        return self.inner.weight

    @property
    def bias(self):
        return self.inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _tiling.get():
            return self.inner(x)
        lead, flat = x.shape[:-1], x.reshape(-1, x.shape[-1])
        m = flat.shape[0]
        pad = -m % TILE
        if pad:
            flat = torch.cat([flat, flat.new_zeros((pad, flat.shape[1]))])
        if self.whole and m + pad <= UNIFORM_ROWS[-1] and uniform(self.inner):
            out = self.inner(flat)
        else:
            out = torch.cat([self.inner(flat[i:i + TILE]) for i in range(0, m + pad, TILE)])
        return out[:m].reshape(*lead, out.shape[-1])


def install(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap every linear layer of ``model`` (in place, once) in a `TiledLinear`; return it.
    Outside `tiled` the model computes exactly what it did before. The output layer keeps its
    tiles: it scores only the positions whose logits are asked for, and checking it at
    `UNIFORM_ROWS` would cost seconds (151,936 x 1,536 for Qwen2.5)."""
    from .kernels import PackedLinear

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with _installing:
        for module in list(model.modules()):
            if isinstance(module, TiledLinear):
                continue
            for name, child in list(module.named_children()):
                if type(child) in (torch.nn.Linear, PackedLinear):
                    setattr(module, name, TiledLinear(child, whole=child is not head))
    return model
