"""Host time (bench/host.py): wall time outside the models' calls."""

import pytest

from anydraft import Decoder
from anydraft.bench.host import host_fields, host_lines
from tests.models.test_synthetic import require_tokenizers

PAIR = ("null:qwen2.5-0.5b", "null:smollm2-135m")


def test_host_per_call_and_the_drafting_share_of_it():
    ar = {"host_seconds": 0.010, "target_calls": 10, "drafted": 0}
    slem = {"host_seconds": 0.050, "target_calls": 10, "drafted": 40}
    fields = host_fields(slem, ar)
    assert fields["host_ms_per_call"] == pytest.approx(5.0)
    # 4 ms a call more than plain decoding's 1 ms, for 4 drafted tokens a call
    assert fields["host_ms_per_drafted"] == pytest.approx(1.0)
    assert host_fields(ar, ar)["host_ms_per_drafted"] is None
    rows = [{"seconds": 0.1, **fields}]
    assert "| slem | 5.000 | 1.000 | 50.0% |" in host_lines({("slem",): rows})


def test_a_run_counts_its_model_time_and_the_rest_is_host_time():
    require_tokenizers(*PAIR)
    decoder = Decoder(*PAIR, device="cpu", num_draft_tokens=4, adaptive=False)
    stats = decoder.generate("Write a haiku", 16, method="slem").stats
    assert stats["drafter_model_seconds"] > 0 and stats["drafter_calls"] > 0
    assert stats["drafter_model_seconds"] <= stats["draft_seconds"]
    model = stats["target_seconds"] + stats["drafter_model_seconds"]
    assert stats["host_seconds"] == pytest.approx(stats["seconds"] - model)
