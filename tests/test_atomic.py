"""Files written whole or not at all: each writer its own scratch name, then one atomic
rename; a failed write leaves the old file and no scratch behind."""

import json
import pathlib
import sys
import threading

import pytest

from anydraft import atomic
from anydraft.hardware import profile
from tests.hardware.test_machine import AVX512_BF16


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


def test_a_directory_keeps_the_one_another_writer_finished(tmp_path):
    """A writer of a directory removed the one another writer had finished before renaming its
    own over it; that one now stays, whole, and the later copy is dropped."""
    path = tmp_path / "converted"
    with atomic.replacing(path, directory=True) as later:
        (later / "config.json").write_text('{"later": 1}')
        with atomic.replacing(path, directory=True) as sooner:
            (sooner / "config.json").write_text('{"sooner": 1}')
    assert (path / "config.json").read_text() == '{"sooner": 1}'
    assert list(tmp_path.iterdir()) == [path]


WEIGHTS = 200  # files in the fake converted model: removing them takes long enough to be seen


def test_two_converters_at_once_both_load_a_whole_model(tmp_path):
    """Two converters of one GGUF at once (threads for two servers started together, issue 61)
    and loaders polling meanwhile: whoever finds config.json finds every weight beside it, and
    both converters then load the model. Removing the first copy to rename the second over it
    left a window in which loaders found config.json and no weights (nearly every run here)."""
    path = tmp_path / "converted"
    both_converting = threading.Barrier(2)
    first_in_place = threading.Event()
    stop = threading.Event()
    loads = []

    def whole() -> bool:
        return all((path / f"w{i}.safetensors").is_file() for i in range(WEIGHTS))

    def convert(first: bool):
        with atomic.replacing(path, directory=True) as scratch:
            both_converting.wait()
            (scratch / "config.json").write_text("{}")
            for i in range(WEIGHTS):
                (scratch / f"w{i}.safetensors").write_text("weights")
            if not first:  # the other finishes first, with loaders reading its copy
                first_in_place.wait()
        if first:
            first_in_place.set()
        loads.append(whole())

    def load():
        while not stop.is_set():
            if (path / "config.json").is_file():
                loads.append(whole())

    loaders = [threading.Thread(target=load) for _ in range(2)]
    converters = [threading.Thread(target=convert, args=(first,)) for first in (True, False)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often, as processes would run at once
    try:
        for thread in loaders + converters:
            thread.start()
        for thread in converters:
            thread.join()
    finally:
        stop.set()
        sys.setswitchinterval(switch)
        for thread in loaders:
            thread.join()
    halves = loads.count(False)
    assert len(loads) >= 2 and halves == 0, f"{halves} of {len(loads)} loads found half a model"
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
