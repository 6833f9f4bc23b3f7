"""The machine profile and `dtype="auto"`: features read, curves measured and cached per
machine, and the choice follows the measured curves (never a constant)."""

import dataclasses
import json

import pytest

from anydraft.hardware import machine as hw
from anydraft.hardware import profile
from anydraft.models.backends import LoadedModel
from tests.helpers import byte_tokenizer, tiny_llama

AVX512_BF16 = hw.Machine("cpu", 2, ("avx2", "avx512f", "avx512_bf16"), "AVX512", "", "2.13.0", ())


def test_bfloat16_is_native_only_with_the_hardware_and_pytorch_allowed_to_use_it():
    assert AVX512_BF16.native_bf16
    assert dataclasses.replace(AVX512_BF16, features=("avx2", "amx_tile", "amx_bf16")).native_bf16
    assert not dataclasses.replace(AVX512_BF16, features=("avx2", "avx512f")).native_bf16  # Zen 3-like
    assert not dataclasses.replace(AVX512_BF16, torch_kernels="AVX2").native_bf16  # ATEN_CPU_CAPABILITY=avx2
    assert not dataclasses.replace(AVX512_BF16, onednn_isa="AVX2").native_bf16  # ONEDNN_MAX_CPU_ISA=AVX2


def test_another_machine_gets_another_cache_key():
    assert AVX512_BF16.key != dataclasses.replace(AVX512_BF16, features=("avx2",)).key
    assert AVX512_BF16.key != dataclasses.replace(AVX512_BF16, onednn_isa="AVX2").key
    assert AVX512_BF16.key == dataclasses.replace(AVX512_BF16).key


def test_this_machine_reads_the_running_cpu():
    m = hw.this_machine()
    assert m.cores >= 1 and m.torch and m.torch_kernels
    assert set(m.features) <= set(hw.FEATURES)
    assert any(line.startswith("cpu: ") for line in m.lines())


def test_models_measured_together_get_a_curve_each_with_every_size():
    tok = byte_tokenizer()
    models = {name: LoadedModel(name, tiny_llama(len(tok), max_positions=64, layers=layers), tok)
              for name, layers in (("two", 2), ("four", 4))}
    curves = profile.measure(models, sizes=(1, 5, 9), repeats=2)
    assert sorted(curves) == ["four", "two"]
    assert all(sorted(c) == [1, 5, 9] and all(s > 0 for s in c.values()) for c in curves.values())


def test_busy_counts_other_processes_not_this_one(monkeypatch):
    total, used, mine = profile.cpu_ticks()  # the real counters read
    assert total >= used >= 0 and mine >= 0
    samples = iter([(1000, 100, 50), (1200, 300, 240)])  # 200 ticks: 190 of them ours
    monkeypatch.setattr(profile, "cpu_ticks", lambda: next(samples))
    assert not profile.busy(0)
    samples = iter([(1000, 100, 50), (1200, 280, 60)])  # others used 170 of 200
    monkeypatch.setattr(profile, "cpu_ticks", lambda: next(samples))
    assert profile.busy(0)


def test_curves_are_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path))
    other = dataclasses.replace(AVX512_BF16, features=("avx2",))
    profile.save("m|torch|float32|cpu", {1: 0.1, 9: 0.2}, AVX512_BF16)
    assert profile.cached("m|torch|float32|cpu", AVX512_BF16) == {1: 0.1, 9: 0.2}
    assert profile.cached("m|torch|float32|cpu", other) is None  # measured elsewhere: not reused
    assert profile.cached("m|torch|bfloat16|cpu", AVX512_BF16) is None


def test_huge_pages_are_a_field_of_each_entry_not_part_of_the_key(tmp_path, monkeypatch):
    """The `anydraft` command starts itself again with huge pages, a program that imports
    anydraft may not: with the state in the machine's key, each missed every curve the other
    had measured on the same machine (issue 61)."""
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path))
    with_pages = dataclasses.replace(AVX512_BF16, hugepages=True)
    assert with_pages.key == AVX512_BF16.key
    profile.save("m|torch|float32|cpu", {1: 0.1, 9: 0.2}, with_pages)
    profile.store("m|torch|float32|cpu", {"cost": 0.02}, "exact", AVX512_BF16)
    assert profile.cached("m|torch|float32|cpu", AVX512_BF16) == {1: 0.1, 9: 0.2}
    assert profile.entry("m|torch|float32|cpu", "exact", with_pages) == {"cost": 0.02}
    data = json.loads(profile._path(AVX512_BF16).read_text())
    assert data["curves"]["m|torch|float32|cpu"]["hugepages"] is True  # as each was measured
    assert data["exact"]["m|torch|float32|cpu"]["hugepages"] is False


def test_tests_measure_into_a_cache_of_their_own_and_find_the_installed_models(session_cache,
                                                                               monkeypatch):
    """Curves measured by tests (of temporary models too) stay out of the user's profiles, and
    no test reads what an earlier run measured; the catalog's models are the real ones."""
    from anydraft.models import catalog

    cache, real = session_cache
    path = profile._path(hw.this_machine())
    assert path.is_relative_to(cache) and not path.resolve().is_relative_to(real.resolve())
    installed = {name: entry.installed for name, entry in catalog.CATALOG.items()}
    monkeypatch.setenv("ANYDRAFT_CACHE", str(real))
    assert installed == {name: entry.installed for name, entry in catalog.CATALOG.items()}


def test_the_rate_rewards_a_flat_curve_and_a_fast_plain_step():
    flat, steep = {1: 0.1, 9: 0.1}, {1: 0.1, 9: 0.9}
    assert profile.rate(flat) > profile.rate(steep) == pytest.approx(1 / 0.1)  # plain steps only
    assert profile.rate({1: 0.05, 9: 0.45}) > profile.rate({1: 0.2, 9: 0.25})


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
    monkeypatch.setattr(profile, "candidates", lambda device: tuple(p for p in curves if "compile" not in p))
    monkeypatch.setattr(profile, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: curves.get(key))
    dtype, model, measured = profile.choose_dtype("any-model")
    assert (dtype, model, measured) == (want, None, curves)  # from the cache: nothing loaded


def test_the_candidates_follow_the_machine(monkeypatch):
    import torch

    from anydraft.models import kernels

    native = dataclasses.replace(AVX512_BF16)
    avx2 = dataclasses.replace(AVX512_BF16, features=("avx2",), torch_kernels="AVX2")
    monkeypatch.setattr(profile, "this_machine", lambda: avx2)
    assert "bfloat16" not in profile.candidates("cpu")  # emulated: not a candidate
    assert ("float32+onednn" in profile.candidates("cpu")) == kernels.available(torch.float32)
    monkeypatch.setattr(profile, "this_machine", lambda: native)
    assert {"float32", "bfloat16"} <= set(profile.candidates("cpu"))
    assert "float16" in profile.candidates("cuda")


def test_compiled_paths_are_weighed_where_asked_for_on_cuda_or_once_measured(monkeypatch):
    measured = set()
    monkeypatch.setattr(profile, "candidates", lambda device: ("float32", "float32+onednn"))
    monkeypatch.setattr(profile, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: {1: 0.1} if key in measured else None)
    assert profile.torch_paths("m", "cpu") == ("float32", "float32+onednn")  # minutes to compile
    assert profile.torch_paths("m", "cpu", compile=True)[-1] == "float32+compile"  # doctor --compile
    assert profile.torch_paths("m", "cuda")[-1] == "float32+compile"  # CUDA graphs: always measured
    measured.add("float32+compile")
    assert profile.torch_paths("m", "cpu")[-1] == "float32+compile"  # measured once: weighed


LLAMA = {1: 0.12, 5: 0.45, 9: 0.75}  # a quantized GGUF on llama.cpp: fast, steep (AVX2 shape)
ONEDNN = {1: 0.30, 5: 0.45, 9: 0.50}  # float32 on oneDNN: slower plain step, flat
# too steep to batch (5 rows: 1.1x one's throughput); 2.5x ONEDNN's one request, 0.26x its 16
STEEP_LLAMA = {1: 0.12, 5: 0.55, 9: 1.0, 17: 1.9, 33: 3.7}


def prefers(role, curve, other, rows=1, other_path="float32"):
    """Whether `auto` runs a model in ``role`` on llama.cpp (``curve``) rather than on the
    torch path ``other_path`` (``other``)."""
    return profile.best_for(role, {other_path: other, "llamacpp": curve}, rows) == "llamacpp"


def test_llamacpp_wins_a_target_by_rate_and_a_drafter_by_its_one_token_step():
    assert prefers("target", LLAMA, ONEDNN)
    assert not prefers("target", LLAMA, {1: 0.05, 5: 0.06, 9: 0.07})
    assert prefers("drafter", {1: 0.012, 9: 0.06}, {1: 0.03, 9: 0.04})
    assert not prefers("drafter", {1: 0.05, 9: 0.06}, {1: 0.03, 9: 0.2})


# Qwen2.5-Coder-1.5B on an Intel Xeon with AMX, 2 cores (2026-12-03): llama.cpp runs one
# sequence faster, PyTorch bfloat16 on oneDNN scores 16 rows for little more than one
AMX_LLAMA = {1: 0.058, 2: 0.111, 5: 0.143, 9: 0.221, 17: 0.301, 33: 0.476}
AMX_BF16 = {1: 0.144, 2: 0.172, 5: 0.153, 9: 0.153, 17: 0.174, 33: 0.229}


def test_a_server_batches_the_requests_there_are_up_to_the_most_throughput():
    # steep: 15 rows for 53 tokens/s where one gives 17
    assert profile.served(AMX_LLAMA, 16) == (15, pytest.approx(15 / (0.221 + 6 * 0.080 / 8)))
    rows, tokens_per_s = profile.served(AMX_BF16, 16)
    assert rows == 15 and tokens_per_s == pytest.approx(15 / (0.153 + 6 * 0.021 / 8))
    assert profile.served(AMX_BF16, 16, batches=False) == (1, pytest.approx(1 / 0.144))
    rates = profile.server_rates(AMX_LLAMA, 16)
    assert rates[0] == pytest.approx(1 / 0.058) and rates[1] == pytest.approx(2 / 0.111)  # the load's rows
    assert rates[-1] == rates[-2] == pytest.approx(15 / (0.221 + 6 * 0.080 / 8))  # 15 rows at most
    assert list(profile.server_rates(AMX_BF16, 4, batches=False)) == pytest.approx([1 / 0.144] * 4)


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
    assert profile.fastest(curves) == "float32"  # one sequence: the best rate
    # 0.35x at one request, but the steep path never batches (9 rows: 1.13x one's throughput)
    assert profile.fastest(curves, 16) == "bfloat16"
    assert profile.fastest({"float32": steep_fast, "bfloat16": AMX_BF16}, 2) == "float32"  # 0.38x at two


@pytest.mark.parametrize("llama, rows, want", [(LLAMA, 1, "llamacpp"), ({1: 0.9, 5: 4.0, 9: 8.0}, 1, "torch"),
                                               (AMX_LLAMA, 1, "llamacpp"), (AMX_LLAMA, 16, "llamacpp"),
                                               (STEEP_LLAMA, 1, "llamacpp"), (STEEP_LLAMA, 16, "torch")])
def test_auto_backend_follows_the_measured_curves(llama, rows, want, monkeypatch):
    found = {"float32+onednn": AMX_BF16 if llama is AMX_LLAMA else ONEDNN, "gguf": llama}
    monkeypatch.setattr(profile, "gguf_engines", lambda spec: ("llamacpp",))
    monkeypatch.setattr(profile, "candidates", lambda device: ("float32+onednn",))
    monkeypatch.setattr(profile, "model_key", lambda spec, backend, dtype, device: dtype)
    monkeypatch.setattr(profile, "cached", lambda key: found[key])
    backend, dtype, model = profile.choose_backend("any.gguf", "target", rows=rows)
    assert (backend, model) == (want, None)
    assert dtype == ("" if want == "llamacpp" else "float32+onednn")


@pytest.mark.parametrize("role, rows, want", [("target", 1, "ik"), ("drafter", 1, "ik"), ("target", 16, "ik")])
def test_auto_backend_weighs_every_installed_engine(role, rows, want, monkeypatch):
    """ik_llama.cpp's flat curve (issue 59, Zen 3, in seconds of a 70 ms step) beside
    llama.cpp's steep one and torch: every engine's curve is measured and the best taken."""
    ik = {1: 0.065, 2: 0.071, 3: 0.080, 5: 0.098, 9: 0.18}
    found = {"torch": ONEDNN, "llamacpp": {1: 0.07, 2: 0.116, 3: 0.152, 5: 0.215, 9: 0.44}, "ik": ik}
    monkeypatch.setattr(profile, "gguf_engines", lambda spec: ("llamacpp", "ik"))
    monkeypatch.setattr(profile, "candidates", lambda device: ("float32+onednn",))
    monkeypatch.setattr(profile, "model_key", lambda spec, backend, dtype, device: backend)
    monkeypatch.setattr(profile, "cached", lambda key: found[key])
    assert profile.choose_backend("any.gguf", role, rows=rows) == (want, "", None)
    found["ik"] = {m: 2 * t for m, t in ik.items()}  # twice as slow: llama.cpp runs one sequence
    assert profile.choose_backend("any.gguf", "target")[0] == "llamacpp"


def test_a_model_llamacpp_cannot_run_stays_on_torch_unmeasured(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("nothing is measured for a choice that does not exist")

    monkeypatch.setattr(profile, "curves", fail)
    (tmp_path / "config.json").write_text("{}")  # a transformers directory, not a GGUF
    assert profile.choose_backend(str(tmp_path), "target", "float32") == ("torch", "float32", None)
