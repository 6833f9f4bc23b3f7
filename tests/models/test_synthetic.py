"""Synthetic models (random weights of a stored shape) and the null backend (models/null.py)."""

import pytest
import torch

from anydraft import Decoder
from anydraft.errors import AnydraftError
from anydraft.models import synthetic
from anydraft.models.backends import load
from anydraft.models.batch import RowView
from anydraft.models.loading import resolve
from anydraft.models.null import MASKED
from tests.conftest import require_model

TARGET, DRAFTER = "synthetic:qwen2.5-7b:tiny", "synthetic:smollm2-135m:tiny"


def require_tokenizers(*specs: str) -> None:
    """Skip unless each spec's tokenizer is cached or its catalog GGUF is installed."""
    for spec in specs:
        family = synthetic.parse(spec)[3]["tokenizer"]
        if not (synthetic.tokenizer_dir(family) / "tokenizer_config.json").is_file():
            require_model(synthetic.FAMILIES[family])


def test_every_stored_shape_parses_and_says_what_it_is():
    assert set(synthetic.names()) >= {"qwen2.5-7b", "llama3.1-8b", "qwen2.5-0.5b",
                                      "smollm2-135m", "gemma3-270m"}
    for name in synthetic.names():
        text = synthetic.describe(f"synthetic:{name}")
        assert "synthetic" in text and "random weights" in text
        assert synthetic.parse(f"synthetic:{name}")[3]["tokenizer"] in synthetic.FAMILIES
    assert "stand-in" in synthetic.describe("synthetic:llama3.1-8b")  # not its family's tokenizer
    assert "fixed table" in synthetic.describe("null:qwen2.5-0.5b")
    assert synthetic.vocab_size("null:qwen2.5-0.5b") == 151_936
    assert synthetic.vocab_size("null:gemma3-270m") == 262_144


@pytest.mark.parametrize("spec, words", [
    ("synthetic:qwen9-70b", "unknown synthetic shape"),
    ("synthetic:qwen2.5-7b:huge", "unknown scale"),
])
def test_bad_specs_name_the_choices(spec, words):
    with pytest.raises(AnydraftError, match=words):
        resolve(spec)


def test_tiny_keeps_the_vocabulary_and_shrinks_the_rest():
    real, tiny = synthetic.config_dict("synthetic:qwen2.5-7b"), synthetic.config_dict(TARGET)
    assert real["hidden_size"] == 3584 and real["num_hidden_layers"] == 28
    assert tiny["vocab_size"] == real["vocab_size"] and tiny["hidden_size"] == synthetic.TINY["hidden_size"]


def test_a_synthetic_model_repeats_and_never_chooses_a_padded_id():
    require_tokenizers(TARGET, DRAFTER)
    a = load(TARGET, dtype="float32", device="cpu")
    b = load(TARGET, dtype="float32", device="cpu")
    other = load(DRAFTER, dtype="float32", device="cpu")
    assert a.path == "torch float32, synthetic"
    ids = a.tokenizer.encode("def f(x): return x")
    la, lb = a.new_session().feed(ids), b.new_session().feed(ids)
    assert torch.equal(la, lb)  # seeded: the same weights, the same logits
    assert la.shape[-1] == 152_064
    padded = load("synthetic:llama3.1-8b:tiny", dtype="float32", device="cpu")
    logits = padded.new_session().feed(ids)
    assert float(logits[:, len(padded.tokenizer):].max()) <= synthetic.PADDED_LOGIT / 2
    assert not torch.equal(other.new_session().feed(ids)[:, :100], la[:, :100])


def test_auto_dtype_is_fixed_without_measuring():
    require_tokenizers(TARGET)
    assert load(TARGET, dtype="auto", device="cpu").dtype == "float32"
    with pytest.raises(AnydraftError, match="no GGUF"):
        load(TARGET, backend="llamacpp")


def test_null_logits_depend_on_the_text_only():
    require_tokenizers("null:qwen2.5-0.5b")
    model = load("null:qwen2.5-0.5b")
    assert model.backend == "null" and model.logits_width == 151_936 and model.batches
    ids = model.tokenizer.encode("the quick brown fox jumps")
    whole = model.new_session().feed(ids)
    one = model.new_session()
    singles = torch.cat([one.feed([t]) for t in ids])
    assert torch.equal(whole, singles)  # a verification of many sees what steps of one see
    one.rollback(2)
    assert len(one) == 2 and torch.equal(one.feed(ids[2:], rows=1), whole[-1:])
    batch = model.new_batch(2)
    rows = [RowView(batch), RowView(batch)]
    assert torch.equal(rows[1].feed(ids), whole) and len(rows[0]) == 0
    assert float(whole[:, model.tokenizer.eos_token_id].max()) == MASKED
    padded = load("null:llama3.1-8b")  # SmolLM2's 49,152 tokens stand in for Llama-3's 128,256
    logits = padded.new_session().feed(padded.tokenizer.encode("the quick brown fox"))
    assert logits.shape[-1] == 128_256 and float(logits[:, len(padded.tokenizer):].max()) == MASKED
    whole[:, 0] = 123.0  # a caller writing into the logits changes nothing the model keeps
    assert not torch.equal(model.new_session().feed(ids), whole)


@pytest.mark.parametrize("pair", [(TARGET, DRAFTER), ("null:qwen2.5-0.5b", "null:smollm2-135m")])
def test_every_method_is_plain_decoding_on_synthetic_pairs(pair):
    require_tokenizers(*pair)
    decoder = Decoder(*pair, device="cpu", num_draft_tokens=4, adaptive=False)
    plain = decoder.generate("Write a haiku", 20, method="ar").token_ids
    assert len(plain) == 20
    for method in ("slem", "tli", "slrs", "auto"):
        assert decoder.generate("Write a haiku", 20, method=method).token_ids == plain, method


def test_doctor_says_a_model_is_synthetic(monkeypatch, capsys):
    from anydraft.doctor import report as doctor
    from anydraft.hardware import profile

    require_tokenizers("null:smollm2-135m")
    monkeypatch.setattr(profile, "save", lambda *args, **kwargs: None)  # keep the cache as it is
    data = doctor.report({"null:smollm2-135m": "drafter"}, device="cpu")
    assert "no model" in data["models"]["null:smollm2-135m"]["synthetic"]
    doctor.print_report(data)
    assert "SYNTHETIC: null:smollm2-135m" in capsys.readouterr().out
