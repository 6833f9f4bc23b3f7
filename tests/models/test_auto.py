"""``dtype="auto"`` and ``backend="auto"`` (models/auto.py): the paths a model can run on here,
and the choice follows their measured curves (never a constant)."""

import dataclasses

import pytest

from anydraft.hardware import profile
from anydraft.models import auto
from tests.hardware.test_machine import AVX512_BF16
from tests.hardware.test_profile import AMX_BF16, AMX_LLAMA


@pytest.mark.parametrize("curves, want", [
    # native bfloat16: flat and faster (a Zen 4 / Sapphire Rapids shape)
    ({"bfloat16": {1: 0.23, 5: 0.21, 9: 0.25}, "float32": {1: 0.37, 5: 0.74, 9: 0.86}}, "bfloat16"),
    # emulated bfloat16 that grows with M, float32 slower at M=1: bfloat16 still wins (AVX2 figures)
    ({"bfloat16": {1: 0.30, 5: 1.0, 9: 1.7}, "float32": {1: 0.76, 5: 2.35, 9: 2.56}}, "bfloat16"),
    # a machine where float32 is the faster path
    ({"bfloat16": {1: 0.9, 5: 2.0, 9: 3.0}, "float32": {1: 0.3, 5: 0.5, 9: 0.6}}, "float32"),
    # oneDNN float32 flatter than the default kernels (Zen 3, AVX2: docs/hardware.md)
    ({"float32": {1: 0.42, 5: 1.24, 9: 1.29}, "float32+onednn": {1: 0.30, 5: 0.45, 9: 0.50}},
     "float32+onednn"),
    # a compiled path, measured before (`doctor --compile`), and faster
    ({"float32": {1: 0.42, 5: 1.24, 9: 1.29}, "float32+compile": {1: 0.20, 5: 0.40, 9: 0.45}},
     "float32+compile"),
])
def test_auto_takes_the_path_its_measurements_favour(curves, want, monkeypatch):
    monkeypatch.setattr(auto, "candidates", lambda device: tuple(p for p in curves if "compile" not in p))
    monkeypatch.setattr(auto, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: curves.get(key))
    dtype, model, measured = auto.choose_dtype("any-model")
    assert (dtype, model, measured) == (want, None, curves)  # from the cache: nothing loaded


def test_the_candidates_follow_the_machine(monkeypatch):
    import torch

    from anydraft.models import kernels

    native = dataclasses.replace(AVX512_BF16)
    avx2 = dataclasses.replace(AVX512_BF16, features=("avx2",), torch_kernels="AVX2")
    monkeypatch.setattr(auto, "this_machine", lambda: avx2)
    assert "bfloat16" not in auto.candidates("cpu")  # emulated: not a candidate
    assert ("float32+onednn" in auto.candidates("cpu")) == kernels.available(torch.float32)
    monkeypatch.setattr(auto, "this_machine", lambda: native)
    assert {"float32", "bfloat16"} <= set(auto.candidates("cpu"))
    assert "float16" in auto.candidates("cuda")


def test_compiled_paths_are_weighed_where_asked_for_on_cuda_or_once_measured(monkeypatch):
    measured = set()
    monkeypatch.setattr(auto, "candidates", lambda device: ("float32", "float32+onednn"))
    monkeypatch.setattr(auto, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: {1: 0.1} if key in measured else None)
    assert auto.torch_paths("m", "cpu") == ("float32", "float32+onednn")  # minutes to compile
    assert auto.torch_paths("m", "cpu", compile=True)[-1] == "float32+compile"  # doctor --compile
    assert auto.torch_paths("m", "cuda")[-1] == "float32+compile"  # CUDA graphs: always measured
    measured.add("float32+compile")
    assert auto.torch_paths("m", "cpu")[-1] == "float32+compile"  # measured once: weighed


LLAMA = {1: 0.12, 5: 0.45, 9: 0.75}  # a quantized GGUF on llama.cpp: fast, steep (AVX2 shape)
ONEDNN = {1: 0.30, 5: 0.45, 9: 0.50}  # float32 on oneDNN: slower plain step, flat
# too steep to batch (5 rows: 1.1x one's throughput); 2.5x ONEDNN's one request, 0.26x its 16
STEEP_LLAMA = {1: 0.12, 5: 0.55, 9: 1.0, 17: 1.9, 33: 3.7}


def prefers(role, curve, other, rows=1, other_path="float32"):
    """Whether `auto` runs a model in ``role`` on llama.cpp (``curve``) rather than on the
    torch path ``other_path`` (``other``)."""
    return auto.best_for(role, {other_path: other, "llamacpp": curve}, rows) == "llamacpp"


def test_llamacpp_wins_a_target_by_rate_and_a_drafter_by_its_one_token_step():
    assert prefers("target", LLAMA, ONEDNN)
    assert not prefers("target", LLAMA, {1: 0.05, 5: 0.06, 9: 0.07})
    assert prefers("drafter", {1: 0.012, 9: 0.06}, {1: 0.03, 9: 0.04})
    assert not prefers("drafter", {1: 0.05, 9: 0.06}, {1: 0.03, 9: 0.2})


def test_a_server_target_keeps_closest_to_the_best_path_at_every_load():
    # one request: llama.cpp 17 tokens/s, PyTorch 7 (0.40x); 16: PyTorch 94, llama.cpp 53 (0.56x)
    assert prefers("target", AMX_LLAMA, AMX_BF16)  # one sequence: llama.cpp
    assert prefers("target", AMX_LLAMA, AMX_BF16, rows=16)  # a server: also
    flat_fast = {1: 0.08, 2: 0.08, 5: 0.085, 9: 0.09, 17: 0.1, 33: 0.2}  # 0.73x at one, 3.4x at 16
    assert not prefers("target", AMX_LLAMA, flat_fast, rows=16)
    # a compiled torch path scores one row a call: it loses the loaded end
    assert prefers("target", AMX_LLAMA, flat_fast, rows=16, other_path="bfloat16+compile")
    assert prefers("drafter", AMX_LLAMA, AMX_BF16, rows=16)  # rows: targets only
    steep_fast = {1: 0.05, 2: 0.095, 5: 0.225, 9: 0.40, 17: 0.75, 33: 1.45}
    curves = {"float32": steep_fast, "bfloat16": AMX_BF16}
    assert auto.fastest(curves) == "float32"  # one sequence: the best rate
    # 0.35x at one request, but the steep path never batches (9 rows: 1.13x one's throughput)
    assert auto.fastest(curves, 16) == "bfloat16"
    assert auto.fastest({"float32": steep_fast, "bfloat16": AMX_BF16}, 2) == "float32"  # 0.38x at two


@pytest.mark.parametrize("llama, rows, want", [(LLAMA, 1, "llamacpp"), ({1: 0.9, 5: 4.0, 9: 8.0}, 1, "torch"),
                                               (AMX_LLAMA, 1, "llamacpp"), (AMX_LLAMA, 16, "llamacpp"),
                                               (STEEP_LLAMA, 1, "llamacpp"), (STEEP_LLAMA, 16, "torch")])
def test_auto_backend_follows_the_measured_curves(llama, rows, want, monkeypatch):
    found = {"float32+onednn": AMX_BF16 if llama is AMX_LLAMA else ONEDNN, "gguf": llama}
    monkeypatch.setattr(auto, "gguf_engines", lambda spec: ("llamacpp",))
    monkeypatch.setattr(auto, "candidates", lambda device: ("float32+onednn",))
    monkeypatch.setattr(auto, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: found[key])
    backend, dtype, model = auto.choose_backend("any.gguf", "target", rows=rows)
    assert (backend, model) == (want, None)
    assert dtype == ("" if want == "llamacpp" else "float32+onednn")


@pytest.mark.parametrize("role, rows, want", [("target", 1, "ik"), ("drafter", 1, "ik"), ("target", 16, "ik")])
def test_auto_backend_weighs_every_installed_engine(role, rows, want, monkeypatch):
    """ik_llama.cpp's flat curve (issue 59, Zen 3, in seconds of a 70 ms step) beside
    llama.cpp's steep one and torch: every engine's curve is measured and the best taken."""
    ik = {1: 0.065, 2: 0.071, 3: 0.080, 5: 0.098, 9: 0.18}
    found = {"torch": ONEDNN, "llamacpp": {1: 0.07, 2: 0.116, 3: 0.152, 5: 0.215, 9: 0.44}, "ik": ik}
    monkeypatch.setattr(auto, "gguf_engines", lambda spec: ("llamacpp", "ik"))
    monkeypatch.setattr(auto, "candidates", lambda device: ("float32+onednn",))
    monkeypatch.setattr(auto, "model_key", lambda spec, backend, dtype, device: backend)
    monkeypatch.setattr(profile, "cached", lambda key: found[key])
    assert auto.choose_backend("any.gguf", role, rows=rows) == (want, "", None)
    found["ik"] = {m: 2 * t for m, t in ik.items()}  # twice as slow: llama.cpp runs one sequence
    assert auto.choose_backend("any.gguf", "target")[0] == "llamacpp"


def test_a_model_llamacpp_cannot_run_stays_on_torch_unmeasured(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("nothing is measured for a choice that does not exist")

    monkeypatch.setattr(auto, "curves", fail)
    (tmp_path / "config.json").write_text("{}")  # a transformers directory, not a GGUF
    assert auto.choose_backend(str(tmp_path), "target", "float32") == ("torch", "float32", None)
