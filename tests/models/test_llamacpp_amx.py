"""llama.cpp's AMX kernels crash on virtual machines: a clear error names the fix instead."""

import pytest

from anydraft.errors import AnydraftError
from anydraft.models.llamacpp import check_amx

AMX_BUILD = "CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 |"
PLAIN_BUILD = "CPU : AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 |"


def test_an_amx_build_on_a_virtual_machine_is_refused_with_the_fix(monkeypatch):
    monkeypatch.delenv("ANYDRAFT_LLAMACPP_AMX", raising=False)
    with pytest.raises(AnydraftError, match="mno-amx-int8.*torch backend.*ANYDRAFT_LLAMACPP_AMX"):
        check_amx(AMX_BUILD, frozenset({"avx2", "amx_int8", "hypervisor"}))


def test_builds_and_machines_that_run_fine_pass(monkeypatch):
    monkeypatch.delenv("ANYDRAFT_LLAMACPP_AMX", raising=False)
    check_amx(PLAIN_BUILD, frozenset({"avx2", "amx_int8", "hypervisor"}))  # built without AMX
    check_amx(AMX_BUILD, frozenset({"avx2", "amx_int8"}))  # bare metal
    monkeypatch.setenv("ANYDRAFT_LLAMACPP_AMX", "1")
    check_amx(AMX_BUILD, frozenset({"avx2", "amx_int8", "hypervisor"}))  # the user says it works
