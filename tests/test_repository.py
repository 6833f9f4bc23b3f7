"""The repository as people meet it: the docs' links into benchmark runs resolve, every run
kept is in the index, and both ways people run the tests work."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")  # [text](target) or [text](target#anchor)


def _local_links(doc: Path) -> list[str]:
    return [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_into_the_repository_resolves(doc):
    """A run removed from benchmarks/results/ is named with its commit, not linked."""
    broken = [t for t in _local_links(doc) if not (doc.parent / t).exists()]
    assert broken == [], f"{doc.relative_to(ROOT)} links to what is not there: {broken}"


def test_every_run_kept_is_in_the_index():
    index = ROOT / "benchmarks" / "README.md"
    linked = {Path(os.path.normpath(index.parent / t)).relative_to(ROOT / "benchmarks" / "results").parts[0]
              for t in _local_links(index) if t.startswith("results/")}
    kept = {p.name for p in (ROOT / "benchmarks" / "results").iterdir() if p.is_dir()}
    assert kept - linked == set(), "runs without a row in benchmarks/README.md"


def test_the_pytest_script_imports_the_tests_package_as_python_m_pytest_does(tmp_path):
    """`pytest` puts no directory on sys.path by itself; pyproject's pythonpath puts the root."""
    script = Path(sys.executable).with_name("pytest")
    if not script.is_file():
        pytest.skip(f"no pytest script beside {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(script), "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/test_atomic.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
