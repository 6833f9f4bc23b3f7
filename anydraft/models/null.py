"""The null backend: sessions whose logits come from a fixed table, for host overhead.

``null:NAME`` (NAME a synthetic shape, models/synthetic/) is a model with that shape's
vocabulary and tokenizer and no weights: a feed costs microseconds, so a decoding step costs
only what anydraft itself does around the model (policy, drafting bookkeeping, translation,
verification, sampling). `anydraft bench` reports that time per target call and per drafted
token (bench/host.py).

It behaves as a model must for the layers above: the logits at a position depend only on the
token there and its position (so on the text before it), whether the position is fed alone or
in a verification of many, and a rollback forgets positions. The table has `TABLE_ROWS` rows;
each position reads one, with the bias of random weights (`synthetic.output_bias`). EOS and the
ids past the tokenizer never win (`MASKED`), so every run decodes the tokens it was asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import AnydraftError
from . import synthetic
from .batch import RowLengths
from .session import rows_to_return

# rows of the logits table: enough that the text does not settle into a short loop (the
# position takes part in choosing a row), few enough that the largest vocabulary's table is
# small (64 x 262,144 float32: 64 MiB)
TABLE_ROWS = 64
MASKED = -1e4  # the logit of EOS and of ids past the tokenizer: never the argmax, ~never sampled
# the context window of a null session: a fixed table has none of its own
MAX_LENGTH = 1 << 20
# row of a position: a hash of its token and the position (primes: neighbours spread out)
TOKEN_PRIME, POSITION_PRIME = 1_000_003, 7_919


class NullModel:
    """What `LoadedModel` needs of a model: its sessions, batches, width and EOS ids."""

    backend = "null"

    def __init__(self, spec: str, tokenizer):
        if synthetic.parse(spec)[0] != "null":
            raise AnydraftError(f"{spec!r} is not a null model spec (null:NAME)")
        self.name, self.vocab_size, self.max_length = spec, synthetic.vocab_size(spec), MAX_LENGTH
        self.eos_ids: tuple[int, ...] = ()  # none: every run decodes what it was asked for
        generator = torch.Generator().manual_seed(synthetic.seed(spec))
        # what random weights give (models/synthetic/: English-looking words ahead), and never
        # EOS (a run decodes what it was asked for) or an id past the tokenizer
        self.table = torch.randn(TABLE_ROWS, self.vocab_size, generator=generator)
        self.table += synthetic.output_bias(tokenizer, self.vocab_size)
        self.table[:, min(len(tokenizer), self.vocab_size):] = MASKED
        eos = {tokenizer.eos_token_id} | set(getattr(tokenizer, "all_special_ids", ()))
        self.table[:, [i for i in eos if i is not None and i < self.vocab_size]] = MASKED
        self.seed = synthetic.seed(spec)

    def logits(self, start: int, ids: Sequence[int], rows: int) -> torch.Tensor:
        """The logits after the last ``rows`` of ``ids``, fed from position ``start``: one
        table row per position (a copy: callers may write into what a session returns)."""
        first = start + len(ids) - rows
        index = [(t * TOKEN_PRIME + (first + i) * POSITION_PRIME + self.seed) % TABLE_ROWS
                 for i, t in enumerate(ids[len(ids) - rows:])]
        return self.table[index]

    def new_session(self) -> NullSession:
        return NullSession(self)

    def new_batch(self, max_rows: int) -> NullBatch:
        return NullBatch(self, max_rows)


class NullSession:
    """A `Session` (models/session.py) of a `NullModel`."""

    batch = None  # a sequence of its own
    exact = False  # models/exact.py

    def __init__(self, model: NullModel):
        self.model, self.vocab_size, self.max_length = model, model.vocab_size, model.max_length
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def feed(self, ids: Sequence[int], rows: int | None = None) -> torch.Tensor:
        rows = rows_to_return(self._length, self.max_length, ids, rows)
        out = self.model.logits(self._length, ids, rows)
        self._length += len(ids)
        return out

    def rollback(self, n: int) -> None:
        assert 0 <= n <= self._length, (n, self._length)
        self._length = n


class NullBatch(RowLengths):
    """A `BatchSession` (models/batch.py) of a `NullModel`: every row's logits in one call."""

    def __init__(self, model: NullModel, max_rows: int):
        if max_rows < 1:
            raise AnydraftError(f"a batch needs at least one row (got max_rows={max_rows})")
        self.model, self.max_rows = model, max_rows
        self.vocab_size, self.max_length = model.vocab_size, model.max_length
        self.lengths: dict[int, int] = {}

    def feed_rows(self, feeds: dict[int, Sequence[int]], rows: dict[int, int]) -> dict[int, torch.Tensor]:
        self.reclaim()
        out = {}
        for row, ids in feeds.items():
            wanted = rows_to_return(self.lengths[row], self.max_length, ids, rows[row])
            out[row] = self.model.logits(self.lengths[row], ids, wanted)
            self.lengths[row] += len(ids)
        return out
