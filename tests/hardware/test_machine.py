"""hardware/machine.py: the machine as read from it, its cache key, and its cores' counters."""

import dataclasses

from anydraft.hardware import machine as hw

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


def test_niced_work_leaves_the_cores_free_to_a_process_that_is_not_niced(tmp_path, monkeypatch):
    # user nice system idle iowait irq softirq steal: cpu0 spent 100 ticks on niced work, cpu1 50 on
    # user work; this process used 20 ticks
    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0\ncpu0 10 100 5 300 7 0 0 0\ncpu1 50 0 0 400 0 0 0 0\n")
    monkeypatch.setattr(hw, "open", lambda path: open(stat) if path == str(stat) else
                        __import__("io").StringIO("1 (x) S " + "0 " * 10 + "15 5 0"), raising=False)
    total, busy, own = hw.cpu_ticks([0, 1], str(stat), niced=True)
    assert (total, busy, own) == (872, 165, 20)
    assert hw.cpu_ticks([0, 1], str(stat), niced=False)[1] == 65
    assert hw.cpu_ticks([1], str(stat), niced=False)[:2] == (450, 50)
