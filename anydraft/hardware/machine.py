"""The machine as read from it: CPU model and features, cores, which kernels PyTorch runs, CUDA
devices, and how busy its cores are (`cpu_ticks`). Light at import time (torch is imported when
asked for)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from dataclasses import asdict, dataclass

from .hugepages import state as hugepages_state

# the CPU features that decide which kernels can run fast: AVX2 everywhere; AVX-512; bfloat16
# and float16 dot products; AMX tiles (Intel, from Sapphire Rapids)
FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Machine:
    cpu: str
    cores: int
    features: tuple[str, ...]  # the FEATURES this CPU has
    torch_kernels: str  # the ISA PyTorch's own kernels use (ATEN_CPU_CAPABILITY can lower it)
    onednn_isa: str  # ONEDNN_MAX_CPU_ISA ("" when not set: all the CPU has)
    torch: str
    cuda: tuple[str, ...]  # one "name (sm_XY)" per CUDA device
    # whether large allocations (the models' weights) get huge pages (hardware/hugepages.py): a
    # one-token step is several percent faster with them. Not part of `key`: each cached
    # measurement records it instead
    hugepages: bool = False

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 matrix products run in hardware here (AVX-512 bf16 or AMX), with
        PyTorch allowed to use them; elsewhere bfloat16 is emulated."""
        hardware = "avx512_bf16" in self.features or "amx_bf16" in self.features
        held = "AVX2" in self.torch_kernels.upper() or self.onednn_isa.upper().startswith(("AVX2", "SSE"))
        return hardware and not held

    @property
    def key(self) -> str:
        """Identifies this machine's speed: measurements cached under another key are not reused.
        Huge pages are left out: they follow how the process was started (the `anydraft` command
        starts itself again with them, a program that imports anydraft has them only if it asks),
        and a program must find what the command measured on the same machine (`Decoder(target,
        drafter="auto")` after `anydraft scout`, issue 61). Each entry records the state it was
        measured in (`hugepages` beside the measurement). Entries saved while the state was part
        of the key are not found: they are measured again."""
        identity = asdict(self)
        del identity["hugepages"]
        return hashlib.sha256(repr(sorted(identity.items())).encode()).hexdigest()[:16]

    def lines(self) -> list[str]:
        features = ", ".join(self.features) or "none of " + ", ".join(FEATURES)
        return [
            f"cpu: {self.cpu}, {self.cores} cores; features: {features}",
            f"torch {self.torch}: kernels {self.torch_kernels}"
            + (f", oneDNN held to {self.onednn_isa}" if self.onednn_isa else "")
            + f"; bfloat16 {'native' if self.native_bf16 else 'emulated'}",
            "cuda: " + (", ".join(self.cuda) if self.cuda else "none"),
            f"memory: huge pages {'on' if self.hugepages else 'off'} ({hugepages_state()[1]})",
        ]


def cpu_ticks(cpus: list[int] | None = None, stat: str = "/proc/stat",
              niced: bool = True) -> tuple[int, int, int]:
    """(all CPU time, busy CPU time, this process's CPU time) in clock ticks: of the CPUs
    ``cpus``, or of the whole machine (None); busy without niced processes' time unless
    ``niced``. Raises OSError where there is no /proc."""
    with open(stat) as f:
        lines = f.read().splitlines()
    wanted = {"cpu"} if cpus is None else {f"cpu{i}" for i in cpus}
    total = busy = 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:]]
            total += sum(values)
            # all but idle and iowait (and nice, the niced processes' user time, unless asked)
            busy += sum(values) - values[3] - values[4] - (0 if niced else values[1])
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return total, busy, int(own[11]) + int(own[12])  # utime + stime


def cpu_flags() -> frozenset[str]:
    """Every feature flag the CPU reports (empty where /proc/cpuinfo does not exist)."""
    return _cpuinfo()[1]


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    name, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                if flags and name:
                    break
    except OSError:  # not Linux: features unknown, everything is measured anyway
        pass
    return name, flags


@functools.lru_cache(maxsize=1)
def this_machine() -> Machine:
    import torch

    name, flags = _cpuinfo()
    cuda = ()
    if torch.cuda.is_available():
        cuda = tuple(f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
                     for i in range(torch.cuda.device_count()))
    return Machine(
        cpu=name, cores=os.cpu_count() or 1, features=tuple(f for f in FEATURES if f in flags),
        torch_kernels=torch.backends.cpu.get_cpu_capability(),
        onednn_isa=os.environ.get("ONEDNN_MAX_CPU_ISA", ""), torch=torch.__version__, cuda=cuda,
        hugepages=hugepages_state()[0])

