"""scripts/gpu_check.sh --cpu-dry-run: the GPU check's every section, proven on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anydraft.doctor.device_check import SECTIONS
from tests.models.test_synthetic import require_tokenizers

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
MAX_FILES = 8  # what the GPU machine sends back


@pytest.mark.slow
def test_the_dry_run_reports_every_section(tmp_path):
    require_tokenizers("synthetic:qwen2.5-7b", "synthetic:smollm2-135m", "synthetic:gemma3-270m")
    out = tmp_path / "out"
    proc = subprocess.run([str(SCRIPT), "--cpu-dry-run", str(out)], capture_output=True, text=True,
                          timeout=600, env=os.environ | {"PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    sections = json.loads((out / "results.json").read_text())["sections"]
    assert list(sections) == [name for name, _ in SECTIONS]
    for name, entry in sections.items():
        want = "skipped" if name == "compiled cost curves" else "ok"
        assert entry["status"].startswith(want), (name, entry["status"])
    assert sections["exactness"]["identical"].split("/")[0] == sections["exactness"]["identical"].split("/")[1]
    assert sections["host overhead"]["runs"]["slem"]["host_ms_per_call"] > 0
    assert len(sections["cost curves"]["ms"]["qwen2.5-7b"]) == 33
    assert all(r["identical"] for r in sections["replay speed"]["runs"].values() if "identical" in r)
    assert set(sections["batched throughput"]["tokens_per_s_by_rows"]) == {"1", "8", "32"}
    assert " passed" in (out / "exhaustive.log").read_text()
    summary = (out / "summary.md").read_text()
    assert all(f"## {name}:" in summary for name, _ in SECTIONS)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, files
