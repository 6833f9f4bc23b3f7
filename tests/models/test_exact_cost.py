"""``exact="auto"`` (models/exact_cost.py): exact scoring where this machine measured that it
costs at most `AUTO_COST`, off where it costs more, was not measured or cannot run, and said so
in the decoder, doctor, /health (tests/server) and the bench."""

from types import SimpleNamespace

import pytest

from anydraft import Decoder
from anydraft.doctor import report as doctor
from anydraft.hardware import profile
from anydraft.models import auto, exact_cost
from anydraft.models.backends import load
from tests.models.test_synthetic import require_tokenizers

TINY = "synthetic:qwen2.5-0.5b:tiny"


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(profile, "busy", lambda seconds=0.5: False)  # measurements are cached


def _store(spec: str, loaded, cost: float) -> None:
    key = auto.model_key(spec, loaded.backend, loaded.dtype or "gguf", loaded.device.type)
    profile.store(key, {"cost": cost, "ratios": {"1": 1 + cost}}, "exact")


def test_auto_follows_the_measured_cost():
    require_tokenizers(TINY)
    loaded = load(TINY, "torch", dtype="float32", device="cpu")
    choice = exact_cost.choose(TINY, loaded)
    assert not choice.on and choice.cost is None
    assert f"`anydraft doctor --target {TINY}` measures it" in choice.why
    _store(TINY, loaded, exact_cost.AUTO_COST)  # at the limit: on
    assert exact_cost.choose(TINY, loaded) == exact_cost.Choice(
        True, "calls up to 3.0% slower on torch float32, synthetic here, at most 3%", 0.03)
    _store(TINY, loaded, 0.2)
    choice = exact_cost.choose(TINY, loaded)
    assert not choice.on and "up to 20.0% slower" in choice.why and "over 3%" in choice.why
    # a model object has no name to find its measurement by
    assert exact_cost.choose(None, loaded).why.startswith("a model object: its cost is not measured")


def test_the_decoder_turns_exact_on_where_it_is_cheap():
    require_tokenizers(TINY)
    said = []
    loaded = load(TINY, "torch", dtype="float32", device="cpu")
    _store(TINY, loaded, 0.01)
    dec = Decoder(TINY, dtype="float32", device="cpu", progress=said.append)
    assert dec.target.exact and dec.exact_choice.on
    assert "exact auto: on (calls up to 1.0% slower" in said[-1]
    assert not Decoder(TINY, dtype="float32", device="cpu", exact=False).target.exact
    _store(TINY, loaded, 0.5)
    dec = Decoder(TINY, dtype="float32", device="cpu")
    assert not dec.target.exact and not dec.exact_choice.on
    assert Decoder(TINY, dtype="float32", device="cpu", exact=True).exact_choice is None


def test_auto_is_off_where_exact_cannot_run_or_serializes_a_batch():
    cannot = SimpleNamespace(exact_problem=lambda: "runs compiled (+compile)", backend="torch")
    assert exact_cost.choose("m", cannot).why == "not available: the target runs compiled (+compile)"
    llama = SimpleNamespace(exact_problem=lambda: None, backend="llamacpp")
    assert "one after another" in exact_cost.choose("m", llama, rows=8).why


def test_measure_compares_each_call_exact_and_plain(quiet):
    require_tokenizers(TINY)
    loaded = load(TINY, "torch", dtype="float32", device="cpu")
    found = exact_cost.measure_and_save(TINY, loaded)
    assert set(found["ratios"]) == {*map(str, exact_cost.SIZES), f"1@{exact_cost.LONG_CONTEXT}"}
    assert found["cost"] == pytest.approx(max(0, max(found["ratios"].values()) - 1), abs=1e-3)
    assert not loaded.exact  # the measurement scored exactly beside the model, not through it
    assert exact_cost.cached(TINY, "torch", "float32", "cpu") == found


def test_doctor_prints_the_cost_per_path(quiet, monkeypatch, capsys):
    require_tokenizers(TINY)
    monkeypatch.setattr(auto, "torch_paths", lambda spec, device, compile=False: ("float32",))
    data = doctor.report({TINY: "target"}, device="cpu")
    found = data["models"][TINY]["exact"]["torch float32"]
    assert set(found) == {"cost", "ratios"}
    doctor.print_report(data)
    out = capsys.readouterr().out
    assert "- torch float32: M=1 " in out and f"1@{exact_cost.LONG_CONTEXT} " in out
    assert f"so exact auto is {'on' if found['cost'] <= exact_cost.AUTO_COST else 'off'} there" in out
    # measured once: the next doctor reads it
    monkeypatch.setattr(exact_cost, "measure", lambda loaded: pytest.fail("measured again"))
    assert doctor.report({TINY: "target"}, device="cpu")["models"][TINY]["exact"]["torch float32"] == found
