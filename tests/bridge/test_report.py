import json

import pytest

from anydraft.bridge import format_pair_report, pair_report

KEYS = {
    "same_tokenizer",
    "target_vocab",
    "drafter_vocab",
    "overlap",
    "overlap_of_target",
    "overlap_of_drafter",
    "target_kind",
    "drafter_kind",
    "eos_maps_to",
    "bos_maps_to",
    "target_canonical",
    "drafter_canonical",
}


def test_report_synthetic(synthetic_tables):
    r = pair_report(synthetic_tables["byte-bpe"], synthetic_tables["sentencepiece"])
    assert KEYS <= r.keys() and not r["same_tokenizer"]
    json.dumps(r)
    assert 0 < r["overlap_of_target"] <= 1 and 0 <= r["drafter_canonical"] <= 1
    assert "shared tokens" in format_pair_report(r)


@pytest.mark.real
def test_report_real(real_tokenizers):
    r = pair_report(real_tokenizers["qwen2.5-coder-1.5b"], real_tokenizers["gemma3-270m"])
    assert r["overlap"] > 90_000 and abs(r["overlap_of_target"] - 0.632) < 0.01
    assert r["eos_maps_to"] == 151645 and r["drafter_kind"] == "sentencepiece"
    # Qwen's NFC rewrites the decomposed "e\u0301" sample: not every round trip is exact
    assert r["target_canonical"] < 1
    r = pair_report(real_tokenizers["qwen2.5-coder-1.5b"], real_tokenizers["qwen2.5-coder-0.5b"])
    assert r["same_tokenizer"] and r["overlap_of_drafter"] == 1
    print(format_pair_report(r))
