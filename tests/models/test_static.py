"""The compiled static-cache path (models/static.py): the same logits as the dynamic cache, free
rollbacks, padded shapes that never leak, pooled caches, and greedy output equal to plain
decoding through a real method. Compiling a tiny model takes seconds per shape."""

from __future__ import annotations

import pytest
import torch

from anydraft import Decoder
from anydraft.errors import AnydraftError
from anydraft.models.loading import parse_dtype, split_kernels
from anydraft.models.session import HFSession
from anydraft.models.static import BUCKETS, CompiledModel
from tests.helpers import byte_tokenizer, tiny_llama

pytestmark = pytest.mark.slow

IDS = [(37 * i + 5) % 250 + 3 for i in range(120)]


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-4
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.fixture(scope="module")
def pair():
    model = tiny_llama(300)
    return model, CompiledModel(model)


def test_same_logits_as_the_dynamic_cache_through_rollbacks(pair):
    model, compiled = pair
    plain, static = HFSession(model), compiled.new_session()
    close(plain.feed(IDS[:30], rows=2), static.feed(IDS[:30], rows=2))  # padded to 32
    for m in (1, 3, 1):  # 3 is padded to 4: the padding is cut off the cache at once
        close(plain.feed(IDS[30:30 + m], rows=m), static.feed(IDS[30:30 + m], rows=m))
        assert len(static) == 30 + m
        plain.rollback(30)
        static.rollback(30)
    # rolled back below a padded call: the stale positions are overwritten, never read
    plain.rollback(25)
    static.rollback(25)
    close(plain.feed(IDS[40:43]), static.feed(IDS[40:43]))
    # a read longer than the largest shape runs uncompiled on the same cache
    close(plain.feed(IDS[:max(BUCKETS) + 7], rows=1), static.feed(IDS[:max(BUCKETS) + 7], rows=1))
    assert len(plain) == len(static) == 28 + max(BUCKETS) + 7


def test_a_finished_sessions_cache_is_reused_from_empty(pair):
    model, compiled = pair
    first = compiled.new_session()
    first.feed(IDS[:30])
    cache = first.cache
    del first
    again = compiled.new_session()
    assert again.cache is cache and len(again) == 0
    close(HFSession(model).feed(IDS[50:52]), again.feed(IDS[50:52]))


def test_a_closed_sessions_cache_serves_the_next_one_at_once(pair):
    """`Generation.leave` closes a finished session: its cache goes to the next one then, not
    when the collector finds the session (issue 61: a static session had no ``close``)."""
    _, compiled = pair
    first = compiled.new_session()
    first.feed(IDS[:5])
    cache, keep = first.cache, first  # still referenced: only ``close`` can hand it over
    first.close()
    assert compiled.new_session().cache is cache and keep.cache is None
    first.close()  # twice: nothing more


def test_greedy_sd_on_compiled_models_equals_plain_greedy():
    tok = byte_tokenizer()
    target, drafter = tiny_llama(len(tok), seed=0), tiny_llama(len(tok), seed=1)
    plain = Decoder(target=target, tokenizer=tok, method="ar")
    fast = Decoder(target=CompiledModel(target), tokenizer=tok, drafter=CompiledModel(drafter),
                   drafter_tokenizer=tok, method="sd", num_draft_tokens=4, adaptive=False)
    want = plain.generate("the quick brown", 24, chat=False).token_ids
    got = fast.generate("the quick brown", 24, chat=False)
    assert got.token_ids == want
    assert got.stats["drafted"] > 0 and got.stats["rejected"] > 0  # drafts judged, rejections rolled back


def test_sliding_window_models_are_refused():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    with pytest.raises(AnydraftError, match="has sliding_attention layers: run it without \\+compile"):
        CompiledModel(MistralForCausalLM(config))


def test_models_that_rescale_their_logits_are_refused():
    model = tiny_llama(300)
    model.config.logits_scaling = 8.0  # as Granite does, in its own forward pass
    with pytest.raises(AnydraftError, match="rescales its logits \\(logits_scaling\\)"):
        CompiledModel(model)


def test_the_compile_suffix_parses():
    assert split_kernels("float32+compile") == ("float32", "compile")
    assert parse_dtype("bfloat16+compile") == torch.bfloat16
    with pytest.raises(AnydraftError, match="unknown dtype"):
        parse_dtype("float32+jit")
