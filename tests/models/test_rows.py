"""`TorchBatch` (models/rows.py): rows of one transformers model in one forward pass, each
exactly a session of its own (`check_rows`), other rows and stale positions never seen."""

from __future__ import annotations

import pytest
import torch

from anydraft.models.rows import TorchBatch, batchable
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
    was filled with huge values where nothing real was written yet."""
    batch = TorchBatch(model, max_rows=2)
    short, long_ = batch.add_row(), batch.add_row()
    prompt = [(7 * i + 11) % 290 + 3 for i in range(500)]
    batch.feed_rows({long_: prompt[:300]}, {long_: 1})  # the cache exists: now poison it
    with torch.inference_mode():
        for layer in batch.cache.layers:
            layer.keys[short].fill_(1e4)
            layer.values[short].fill_(1e4)
    batch.rollback(long_, 0)
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
