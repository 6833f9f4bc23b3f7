"""The batch protocol (models/batch.py): each row of a `BatchSession` behaves exactly as a
session of its own, whatever the other rows do. `check_rows` is the contract every batched
backend must pass; it runs here on `SerialBatch`."""

from __future__ import annotations

import gc

import pytest
import torch

from anydraft.errors import AnydraftError
from anydraft.models.backends import load
from anydraft.models.batch import RowView, SerialBatch
from anydraft.models.session import HFSession
from tests.helpers import byte_tokenizer, tiny_llama

IDS = [(37 * i + 5) % 250 + 3 for i in range(200)]


def same(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4, margin: float = 0.0) -> None:
    """``a`` within ``tol`` of ``b``, with the same argmax on every row where ``b``'s top two
    logits are at least ``margin`` apart (every row by default: greedy decoding must agree)."""
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < tol
    top = b.topk(2, -1).values
    clear = top[:, 0] - top[:, 1] >= margin
    assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def check_rows(batch, new_session, tol: float = 1e-4, margin: float = 0.0) -> None:
    """Three rows of different lengths, fed together and apart, rolled back on their own, one
    leaving and a new one taking its id, each compared with a session of its own (`same`: a
    backend that rounds with the shape of a call passes its measured ``tol`` and ``margin``)."""
    rows = [batch.add_row() for _ in range(3)]
    alone = {row: new_session() for row in rows}
    prompts = {rows[0]: IDS[:5], rows[1]: IDS[10:150], rows[2]: IDS[50:53]}
    got = batch.feed_rows(prompts, {row: 2 for row in rows})
    for row in rows:
        same(got[row], alone[row].feed(prompts[row], 2), tol, margin)
        assert batch.length(row) == len(alone[row])
    for turn in range(4):  # drafts of different lengths, rejected in part, on some rows only
        feeds = {row: IDS[turn + i:turn + i + 1 + (i + turn) % 4] for i, row in enumerate(rows) if (i + turn) % 3}
        got = batch.feed_rows(feeds, {row: len(ids) for row, ids in feeds.items()})
        for row, ids in feeds.items():
            same(got[row], alone[row].feed(ids, len(ids)), tol, margin)
            keep = len(alone[row]) - len(ids) + 1
            batch.rollback(row, keep)
            alone[row].rollback(keep)
        assert all(batch.length(row) == len(alone[row]) for row in rows)
    batch.remove_row(rows[1])
    again = batch.add_row()
    assert again == rows[1] and batch.length(again) == 0  # a fresh row, nothing of the old one
    fresh = new_session()
    same(batch.feed_rows({again: IDS[:4]}, {again: 4})[again], fresh.feed(IDS[:4], 4), tol, margin)
    for row in rows:
        batch.remove_row(row)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(300)


def test_serial_rows_behave_as_sessions_of_their_own(model):
    check_rows(SerialBatch(lambda: HFSession(model), max_rows=3), lambda: HFSession(model))


def test_a_full_batch_says_so_and_a_view_frees_its_row(model):
    batch = SerialBatch(lambda: HFSession(model), max_rows=2)
    first, second = RowView(batch), RowView(batch)
    with pytest.raises(AnydraftError, match="all 2 rows of the batch are taken"):
        batch.add_row()
    first.close()
    third = RowView(batch)
    assert third.row == first.row
    del second
    gc.collect()
    assert RowView(batch).row in (0, 1)  # the collected view's row came back


def test_a_row_view_is_a_session(model):
    view, plain = RowView(load(model, tokenizer=byte_tokenizer()).new_batch(2)), HFSession(model)
    same(view.feed(IDS[:20], rows=3), plain.feed(IDS[:20], rows=3))
    view.rollback(12)
    plain.rollback(12)
    same(view.feed(IDS[30:33]), plain.feed(IDS[30:33]))
    assert len(view) == len(plain) == 15
    assert (view.vocab_size, view.max_length) == (plain.vocab_size, plain.max_length)


def test_a_batch_needs_a_row():
    with pytest.raises(AnydraftError, match="at least one row"):
        SerialBatch(lambda: None, max_rows=0)
