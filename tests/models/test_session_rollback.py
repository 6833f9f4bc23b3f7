"""Models whose cache cannot be rolled back to any position (recurrent and hybrid layers) are
refused with a clear error, and a rollback that did not happen never passes silently."""

import pytest
import torch

from anydraft.errors import AnydraftError
from anydraft.models.session import HFSession, check_rollback
from tests.helpers import tiny_llama


def tiny(model_type: str, **kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                  **kw)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", ["mamba", "rwkv"])
def test_recurrent_models_are_refused(model_type):
    with pytest.raises(AnydraftError, match="layers: speculative decoding takes rejected draft"):
        HFSession(tiny(model_type))


@pytest.mark.parametrize("model_type", ["jamba", "qwen3_next", "granitemoehybrid", "falcon_h1"])
def test_hybrid_configs_are_refused(model_type):
    """Config only (building these models needs kernels or more memory than a test should)."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    with pytest.raises(AnydraftError, match="recurrent and hybrid models"):
        check_rollback(SimpleNamespace(config=AutoConfig.for_model(model_type)))


def test_attention_models_pass():
    from types import SimpleNamespace

    from transformers import AutoConfig

    check_rollback(tiny_llama(64))
    for model_type in ("gemma3_text", "qwen2", "llama"):
        check_rollback(SimpleNamespace(config=AutoConfig.for_model(model_type)))


def test_a_rollback_the_cache_did_not_do_raises(monkeypatch):
    session = HFSession(tiny_llama(64))
    session.feed([1, 2, 3, 4])
    monkeypatch.setattr(session.cache, "crop", lambda n: None)  # as a recurrent layer would
    with pytest.raises(AnydraftError, match="could not be rolled back to 2 tokens"):
        session.rollback(2)
    assert len(session) == 4
    monkeypatch.undo()
    session.rollback(2)
    assert len(session) == 2 and session.feed([3], rows=1).shape == torch.Size([1, 64])


def test_a_recurrent_model_is_refused_at_load_not_at_the_first_request():
    from types import SimpleNamespace

    from transformers import AutoConfig

    from anydraft.models.backends import load
    from tests.helpers import byte_tokenizer

    model = SimpleNamespace(config=AutoConfig.for_model("mamba"), eval=lambda: model)
    with pytest.raises(AnydraftError, match="recurrent and hybrid models"):
        load(model, tokenizer=byte_tokenizer())
