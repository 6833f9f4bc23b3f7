"""Cost curves (hardware/profile.py): measured from the sessions of the models handed in, cached
per machine, and what a curve says (its rate; the rows a server's call takes). The choice
``auto`` makes from them: tests/models/test_auto.py."""

import dataclasses
import json

import pytest

from anydraft.hardware import machine as hw
from anydraft.hardware import profile
from anydraft.models.loaded import LoadedModel
from tests.hardware.test_machine import AVX512_BF16
from tests.helpers import byte_tokenizer, tiny_llama


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
