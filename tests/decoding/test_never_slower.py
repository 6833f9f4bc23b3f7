"""`auto` starts no drafter where the measured cost curves say no draft could pay even at a high
acceptance (decoder.py `_drafting_pays`, planning/cost.py `drafting_pays`): it decodes plainly,
with prompt-lookup copies, and a method named still drafts."""

import pytest

import anydraft.decoder as decoder_module
from anydraft import Decoder
from tests.helpers import save_tiny_pair

STEEP = {1: 0.10, 2: 0.20, 5: 0.50, 9: 0.90}  # M tokens cost M steps: no draft can pay
FLAT = {1: 0.10, 2: 0.11, 5: 0.12, 9: 0.15}
DRAFTER = {1: 0.01, 2: 0.015}


@pytest.mark.parametrize("target_curve, drafts", [(STEEP, False), (FLAT, True), (None, True)])
def test_auto_drafts_only_where_a_draft_could_pay(tmp_path, monkeypatch, target_curve, drafts):
    target, drafter = save_tiny_pair(tmp_path)
    monkeypatch.setattr(decoder_module, "cached_curve",
                        lambda spec, loaded, backend=None: target_curve if spec == str(target) else DRAFTER)
    notes = []
    dec = Decoder(target=str(target), drafter=str(drafter), dtype="float32", progress=notes.append)
    assert dec.auto_drafts is drafts
    assert any("could pay" in note for note in notes) is not drafts
    out = dec.generate("abcabcabc", max_new_tokens=12, chat=False)
    if not drafts:
        assert out.stats["drafter_calls"] == 0  # copies at most: no drafter pass
    named = dec.generate("abcabcabc", max_new_tokens=12, chat=False, method="slem")  # still runs
    assert named.token_ids == out.token_ids
