"""Files written whole or not at all: each writer its own scratch name, then one atomic
rename; a failed write leaves the old file and no scratch behind."""

import json
import pathlib

import pytest

from anydraft import atomic
from anydraft.hardware import profile
from tests.hardware.test_profile import AVX512_BF16


def test_writers_never_share_a_scratch_file(tmp_path):
    path = tmp_path / "sub" / "f.json"  # the folder is made
    with atomic.replacing(path) as first, atomic.replacing(path) as second:
        assert first != second and first.parent == path.parent and not first.exists()
        first.write_text("first")
        second.write_text("second")  # the other writer, meanwhile
    assert path.read_text() == "first"  # the last to finish wins, whole
    assert list(tmp_path.rglob("*.partial")) == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic.replacing(path) as scratch:
        scratch.write_text("half")
        raise RuntimeError("the disk is full")
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


def test_a_directory_replaces_a_broken_one_and_yields_to_a_finished_one(tmp_path, monkeypatch):
    path = tmp_path / "converted"
    path.mkdir()
    (path / "leftover").write_text("from a broken run")
    with atomic.replacing(path, directory=True) as scratch:
        (scratch / "config.json").write_text("{}")
    assert [p.name for p in path.iterdir()] == ["config.json"]
    replace = atomic.os.replace

    def another_writer_first(src, dst):  # finishes between this one's removal and rename
        pathlib.Path(dst).mkdir()
        (pathlib.Path(dst) / "config.json").write_text('{"other": 1}')
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", another_writer_first)
    with atomic.replacing(path, directory=True) as scratch:
        (scratch / "config.json").write_text('{"this": 1}')
    assert (path / "config.json").read_text() == '{"other": 1}'  # kept: the same source
    assert list(tmp_path.iterdir()) == [path]


def test_profiles_saved_at_once_by_two_processes_do_not_collide(monkeypatch):
    """`profile.save` wrote through one fixed `.partial` name: a second writer renamed it away
    between the first writer's write and its rename, which then failed."""
    written = pathlib.Path.write_text
    others = ["m2|torch|float32|cpu"]

    def write_text(self, text, *args, **kwargs):
        result = written(self, text, *args, **kwargs)
        if others:  # another process saves its curve right after this one wrote its scratch
            profile.save(others.pop(), {1: 0.2}, AVX512_BF16)
        return result

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    profile.save("m1|torch|float32|cpu", {1: 0.1}, AVX512_BF16)
    path = profile._path(AVX512_BF16)
    assert "m1|torch|float32|cpu" in json.loads(path.read_text())["curves"]
    assert list(path.parent.glob("*.partial")) == []
