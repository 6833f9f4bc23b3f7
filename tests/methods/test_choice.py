"""Method selection and the errors a user can cause when choosing a method."""

import pytest

from anydraft import AnydraftError, Decoder
from anydraft.methods import choose_auto
from anydraft.planning.estimates import Mean
from anydraft.planning.settings import Settings
from tests.helpers import byte_tokenizer, tiny_llama

TRIAL_STEPS = Settings.trial_steps


class FakePairing:
    def __init__(self, same):
        self.same_tokenizer = same
        self.adaptive = False


def test_auto_picks_sd_for_same_tokenizer_else_slem_greedy_tli_sampling():
    assert choose_auto(None, greedy=True) == "ar"
    assert choose_auto(FakePairing(True), greedy=False) == "sd"
    assert choose_auto(FakePairing(False), greedy=True) == "slem"
    assert choose_auto(FakePairing(False), greedy=False) == "tli"


def measured(pairing, method, greedy, a, steps=TRIAL_STEPS, overhead=0.0):
    acc = pairing.estimates.of(method, greedy)
    acc.positions, acc.steps, acc.overhead = [Mean(a)], steps, Mean(overhead)


def test_adaptive_auto_tries_each_candidate_then_keeps_the_fastest(toys):
    pairing = toys.pairing()
    pairing.adaptive = True
    pairing.estimates.costs.target = {1: Mean(0.1), 6: Mean(0.11)}
    pairing.estimates.costs.draft = Mean(0.01)
    assert choose_auto(pairing, greedy=False) == "tli"  # nothing measured: the usual best first
    measured(pairing, "tli", False, 0.3)
    assert choose_auto(pairing, greedy=False) == "slrs"  # then the next one gets its trial
    measured(pairing, "slrs", False, 0.5, steps=TRIAL_STEPS - 1)
    assert choose_auto(pairing, greedy=False) == "slrs"
    measured(pairing, "slrs", False, 0.5)
    assert choose_auto(pairing, greedy=False) == "slrs"  # it accepts more
    measured(pairing, "slrs", False, 0.5, overhead=0.2)
    assert choose_auto(pairing, greedy=False) == "tli"  # ... but its steps cost too much
    assert choose_auto(pairing, greedy=True) == "slem"  # greedy is measured on its own


def test_toy_pairing_detects_different_tokenizers(toys):
    assert not toys.pairing().same_tokenizer


def test_sd_with_different_tokenizers_is_a_clear_error(toys):
    tok = byte_tokenizer()
    with pytest.raises(AnydraftError, match="sd.*tokenizer.*slem"):
        Decoder(target=tiny_llama(len(tok)), tokenizer=tok, drafter=tiny_llama(len(toys.target_tok) + 1),
                drafter_tokenizer=toys.target_tok, method="sd")


def test_same_tokenizer_tiny_pair_runs_every_method_identically():
    tok = byte_tokenizer()
    dec = Decoder(target=tiny_llama(len(tok), seed=0), tokenizer=tok,
                  drafter=tiny_llama(len(tok), seed=1), drafter_tokenizer=tok, num_draft_tokens=3)
    plain = dec.generate("hello world", max_new_tokens=24, method="ar")
    for method in ("sd", "slem", "tli", "slrs", "lookup", "auto"):
        out = dec.generate("hello world", max_new_tokens=24, method=method)
        assert out.token_ids == plain.token_ids, method
        assert out.stats["new_tokens"] == out.stats["accepted"] + out.stats["target_tokens"]
    # adaptive auto: the drafter method plus prompt lookup; fixed draft length: the method alone
    assert dec.generate("hello world", max_new_tokens=24, method="auto").stats["method"] == "sd+lookup"
    fixed = Decoder(target=dec.target.model, tokenizer=tok, drafter=dec.drafter.model,
                    drafter_tokenizer=tok, adaptive=False)
    assert fixed.generate("hello world", max_new_tokens=24, method="auto").stats["method"] == "sd"


@pytest.mark.parametrize("adaptive, want", [(True, "lookup"), (False, "ar")])
def test_auto_without_a_drafter_copies_when_adaptive(adaptive, want):
    tok = byte_tokenizer()
    dec = Decoder(target=tiny_llama(len(tok), seed=0), tokenizer=tok, adaptive=adaptive)
    out = dec.generate("abc abc abc abc", max_new_tokens=16, chat=False)
    assert out.stats["method"] == want
    assert out.token_ids == dec.generate("abc abc abc abc", max_new_tokens=16, chat=False,
                                         method="ar").token_ids


def test_drafter_on_another_device_is_a_clear_error(monkeypatch):
    import anydraft.decoder as decoder_module

    tok = byte_tokenizer()
    drafter = tiny_llama(len(tok), seed=1)
    monkeypatch.setattr(decoder_module.LoadedModel, "device",
                        property(lambda self: "meta" if self.model is drafter else "cpu"))
    with pytest.raises(AnydraftError, match="same device"):
        Decoder(target=tiny_llama(len(tok)), tokenizer=tok, drafter=drafter, drafter_tokenizer=tok)
