"""Catalog: install assembles and verifies; failures are clear (simulated, nothing downloaded)."""

import dataclasses
import hashlib
import json
import subprocess

import pytest

from anydraft import AnydraftError
from anydraft.cli import main
from anydraft.models import catalog


@pytest.fixture
def fake_entry(tmp_path, monkeypatch):
    """A two-chunk catalog entry whose chunks live in a fake importable package."""
    pkg = tmp_path / "site" / "fakemodel_part1"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    pkg2 = tmp_path / "site" / "fakemodel_part2"
    (pkg2 / "data").mkdir(parents=True)
    (pkg2 / "__init__.py").write_text("")
    (pkg / "data" / "a.bin").write_bytes(b"hello ")
    (pkg2 / "data" / "b.bin").write_bytes(b"world")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path / "cache"))
    entry = catalog.CatalogEntry(
        name="fake", description="fake", packages=("fakemodel-part1==1", "fakemodel-part2==1"),
        parts=(("fakemodel_part1", "data/a.bin"), ("fakemodel_part2", "data/b.bin")),
        filename="fake.gguf", size_bytes=11, sha256=hashlib.sha256(b"hello world").hexdigest(),
        chat_template=False)
    monkeypatch.setitem(catalog.CATALOG, "fake", entry)
    return entry


def test_install_assembles_and_verifies(fake_entry, tmp_path):
    path = catalog.install("fake", progress=lambda m: None)
    assert path.read_bytes() == b"hello world"
    assert path.parent == tmp_path / "cache" / "models"
    assert fake_entry.installed
    # the chunks the user installed are still there
    assert (tmp_path / "site" / "fakemodel_part1" / "data" / "a.bin").is_file()


def test_sha256_mismatch_is_a_clear_error(fake_entry, monkeypatch):
    bad = dataclasses.replace(fake_entry, sha256="0" * 64)
    monkeypatch.setitem(catalog.CATALOG, "fake", bad)
    with pytest.raises(AnydraftError, match="sha256 mismatch.*anydraft models install fake"):
        catalog.install("fake", progress=lambda m: None)


def test_missing_package_gives_clear_error(fake_entry, monkeypatch):
    missing = dataclasses.replace(fake_entry, parts=(("no_such_module_xyz", "data/a.bin"),),
                                  packages=("no-such-package-xyz==1",))
    monkeypatch.setitem(catalog.CATALOG, "fake", missing)

    def fake_run(cmd, **kw):
        assert "--no-deps" in cmd and "no-such-package-xyz==1" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(catalog.subprocess, "run", fake_run)
    with pytest.raises(AnydraftError, match="(?s)could not install no-such-package-xyz==1.*No matching"):
        catalog.install("fake", progress=lambda m: None)


def test_unknown_name_lists_known_ones():
    with pytest.raises(AnydraftError, match="smollm2-135m"):
        catalog.get_entry("gpt-17")


def test_models_list_json(capsys):
    assert main(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(catalog.CATALOG)
    for r in rows:
        assert {"name", "installed", "path", "size_bytes"} <= set(r)
        assert (r["path"] is None) == (not r["installed"])


def test_cli_install_unknown_model_exits_nonzero(capsys):
    assert main(["models", "install", "gpt-17"]) == 2
    assert "unknown catalog model" in capsys.readouterr().err
