"""Quantized copies of a GGUF model (models/llamacpp.py `quantize`) and doctor's advice on them."""

from __future__ import annotations

import os

import pytest

from anydraft import Decoder
from anydraft.doctor import report as doctor
from anydraft.errors import AnydraftError
from anydraft.models.loading import resolve
from tests.conftest import require_llamacpp, require_model


def test_a_copy_is_written_once_and_runs(tmp_path, monkeypatch):
    require_llamacpp()
    source = resolve(require_model("smollm2-135m"))
    gguf = os.path.join(source.path, source.gguf_file)
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path))
    from anydraft.models.llamacpp import quantize

    path = quantize(gguf, "q8_0")
    assert path.startswith(str(tmp_path / "quantized")) and path.endswith(".Q8_0.gguf")
    written = os.stat(path).st_mtime_ns
    assert quantize(gguf, "q8_0") == path and os.stat(path).st_mtime_ns == written  # once
    assert not list((tmp_path / "quantized").glob("*.partial"))
    # the copy is a model of its own: it loads, and speculative greedy equals its plain greedy
    copy = Decoder(target=path, backend="llamacpp")
    plain = copy.generate("def add(a, b):", 16, method="ar", chat=False).token_ids
    assert copy.generate("def add(a, b):", 16, method="lookup", chat=False).token_ids == plain
    with pytest.raises(AnydraftError, match="unknown quantization 'q3_x'"):
        quantize(gguf, "q3_x")


def test_only_gguf_models_are_quantized(tmp_path):
    require_llamacpp()
    (tmp_path / "config.json").write_text("{}")
    from anydraft.models.llamacpp import quantize

    with pytest.raises(AnydraftError, match="not a GGUF model"):
        quantize(str(tmp_path), "q4_0")


def report(curves: dict, auto: str) -> dict:
    rates = {path: 1 / curve[1] for path, curve in curves.items()}  # plain steps: enough here
    return {"curves_ms": curves, "tokens_per_s": rates,
            "backend_auto": {"target": auto, "drafter": auto},
            "copies": {p.split()[-1].lower(): f"/cache/{p.split()[-1]}.gguf"
                       for p in curves if p.startswith(doctor.LLAMACPP_COPY)}}


SHIPPED = "llama.cpp (GGUF as shipped)"  # doctor's name of llama.cpp's path (doctor.gguf_path)


def test_doctor_recommends_a_copy_only_when_it_beats_what_auto_runs():
    assert doctor.gguf_path("llamacpp") == SHIPPED
    q4, q8 = f"{doctor.LLAMACPP_COPY} Q4_0", f"{doctor.LLAMACPP_COPY} Q8_0"
    slower = report({SHIPPED: {1: 50, 9: 300}, q4: {1: 60, 9: 320}}, SHIPPED)
    assert doctor.advice("m", slower, "target").startswith("no quantized copy of m would beat")
    faster = report({SHIPPED: {1: 50, 9: 300}, q4: {1: 60, 9: 320}, q8: {1: 40, 9: 250}},
                    SHIPPED)
    line = doctor.advice("m", faster, "target")
    assert "Q8_0 copy of m would run as the target" in line and "--target /cache/Q8_0.gguf" in line
    assert "plain decoding of the copy" in line
    # a drafter by its one-token step: the cheaper first step wins, whatever the curve's slope
    drafter = report({SHIPPED: {1: 10, 9: 60}, q4: {1: 6, 9: 90}, q8: {1: 8, 9: 40}},
                     SHIPPED)
    line = doctor.advice("d", drafter, "drafter")
    assert "Q4_0 copy of d would run as the drafter at 6.0 ms" in line and "--drafter /cache/Q4_0.gguf" in line
    assert "output stays exactly the target's" in line
