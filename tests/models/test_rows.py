"""`TorchBatch` (models/rows.py): rows of one transformers model in one forward pass, each
exactly a session of its own (`check_rows`), other rows and stale positions never seen."""

from __future__ import annotations

import threading

import pytest
import torch

from anydraft.models.rows import MIN_CAPACITY, TorchBatch, batchable
from anydraft.models.session import HFSession
from tests.helpers import tiny_llama
from tests.models.test_batch import IDS, check_rows, same


@pytest.fixture(scope="module")
def model():
    return tiny_llama(300, max_positions=1024)


def test_rows_behave_as_sessions_of_their_own(model):
    assert batchable(model)
    check_rows(TorchBatch(model, max_rows=3), lambda: HFSession(model))


def test_eager_attention_takes_the_same_mask_as_additive_scores():
    eager = tiny_llama(300)
    eager.config._attn_implementation = "eager"
    check_rows(TorchBatch(eager, max_rows=3), lambda: HFSession(eager))


def test_a_call_computes_only_the_tokens_fed(model):
    """Packed rows: 1 token beside 9 is one sequence of 10 positions, with no padding."""
    batch = TorchBatch(model, max_rows=2)
    a, b = batch.add_row(), batch.add_row()
    body, shapes = batch.body, []

    def spy(**kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return body(**kwargs)

    batch.body = spy
    got = batch.feed_rows({a: IDS[:1], b: IDS[:9]}, {a: 1, b: 9})
    assert shapes == [(1, 10)]
    same(got[b], HFSession(model).feed(IDS[:9], 9))


def test_padding_and_stale_positions_never_leak(model):
    """A 5-token row beside a 500-token one in one call (the issue's padding case: a packed call
    pads nothing, but each row must still attend to its own positions only), after the cache
    was filled with huge values where nothing real is left."""
    batch = TorchBatch(model, max_rows=2)
    short, long_ = batch.add_row(), batch.add_row()
    prompt = [(7 * i + 11) % 290 + 3 for i in range(500)]
    batch.feed_rows({long_: prompt[:300], short: IDS[:3]}, {long_: 1, short: 1})
    with torch.inference_mode():  # the caches exist: now poison the short row's
        for layer in batch.cache.layers:
            layer.keys[short].fill_(1e4)
            layer.values[short].fill_(1e4)
    batch.rollback(long_, 0)
    batch.rollback(short, 0)
    got = batch.feed_rows({short: IDS[:5], long_: prompt}, {short: 5, long_: 3})
    same(got[short], HFSession(model).feed(IDS[:5], 5))
    same(got[long_], HFSession(model).feed(prompt, 3))
    # rolled back, the short row's old tail stays in its cache: its attention must stop at
    # its length
    batch.rollback(short, 2)
    alone = HFSession(model)
    alone.feed(IDS[:2])
    got = batch.feed_rows({short: [9], long_: [5]}, {short: 1, long_: 1})
    same(got[short], alone.feed([9], 1))


def test_models_a_batch_cannot_run_are_left_to_the_serial_batch():
    from transformers import MistralConfig, MistralForCausalLM

    sliding = MistralForCausalLM(MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                                               num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, sliding_window=8))
    assert not batchable(sliding)
    scaled = tiny_llama(300)
    scaled.config.logits_scaling = 4.0
    assert not batchable(scaled)


@pytest.mark.parametrize("exact", [False, True])
def test_calls_of_other_threads_in_the_middle_of_a_packed_call_change_nothing(exact):
    """Server workers share one model: another worker's call (a batch's or a session's) that
    runs while a packed call is between two layers changes neither call's logits (issue 61: the
    attention implementation was switched per call and switched back under the other one)."""
    model = tiny_llama(300, max_positions=1024)
    outer, inner = TorchBatch(model, max_rows=2, exact=exact), TorchBatch(model, max_rows=1, exact=exact)
    a, b, c = outer.add_row(), outer.add_row(), inner.add_row()
    outer.feed_rows({a: IDS[:5], b: IDS[3:6]}, {a: 1, b: 1})
    feeds, wanted = {a: IDS[5:9], b: IDS[6:7]}, {a: 4, b: 1}
    alone = outer.feed_rows(feeds, wanted)
    inner_alone = inner.feed_rows({c: IDS[:7]}, {c: 7})[c]
    session_alone = HFSession(model).feed(IDS[:6], 6)
    for row, ids in feeds.items():
        outer.rollback(row, outer.length(row) - len(ids))
    inner.rollback(c, 0)

    seen = {}

    def others():
        seen["inner"] = inner.feed_rows({c: IDS[:7]}, {c: 7})[c]
        seen["session"] = HFSession(model).feed(IDS[:6], 6)

    def another_thread(module, args, output):  # runs, and ends, after the outer call's first layer
        if not seen:
            seen["started"] = True
            thread = threading.Thread(target=others)
            thread.start()
            thread.join()

    hook = model.get_decoder().layers[0].register_forward_hook(another_thread)
    try:
        got = outer.feed_rows(feeds, wanted)
    finally:
        hook.remove()
    assert seen
    for row in feeds:
        assert torch.equal(got[row], alone[row])
    assert torch.equal(seen["inner"], inner_alone)
    assert torch.equal(seen["session"], session_alone)


def test_a_long_row_costs_the_other_rows_no_memory():
    """A 32k-token prompt in one row of a 16-row batch: each row's cache holds at most twice its
    own length (the long row: at most its window), and a row that leaves frees its own (issue 61:
    every row was sized to the longest, and never shrunk)."""
    window = 32768
    model = tiny_llama(300, max_positions=window)
    batch = TorchBatch(model, max_rows=16)
    rows = [batch.add_row() for _ in range(16)]
    long_, short = rows[0], rows[1:]
    batch.feed_rows({r: IDS[:5] for r in short}, {r: 1 for r in short})
    prompt = [(7 * i + 11) % 290 + 3 for i in range(window - 1)]
    for start in range(0, len(prompt), 2048):
        batch.feed_rows({long_: prompt[start:start + 2048]}, {long_: 1})

    def positions(row):
        return {layer.keys[row].shape[2] for layer in batch.cache.layers}

    assert positions(long_) == {window}
    assert all(positions(r) == {MIN_CAPACITY} for r in short)
    batch.remove_row(long_)
    assert all(long_ not in layer.keys and long_ not in layer.values for layer in batch.cache.layers)
