"""Huge pages for the models' weights (hardware/hugepages.py): when `anydraft` starts itself again
with glibc's tunable, and that what it added is taken out again for the programs it compares
with."""

import os
import sys

import pytest

from anydraft.hardware import hugepages as hp

NEW_GLIBC = (2, 36)


@pytest.mark.parametrize("text, mode", [
    ("always [madvise] never\n", "madvise"),
    ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"),
])
def test_thp_mode_reads_the_chosen_word(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert hp.thp_mode(str(path)) == mode
    assert hp.thp_mode(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("env, mode, glibc, want", [
    ({}, "madvise", NEW_GLIBC, True),
    ({"GLIBC_TUNABLES": hp.SETTING}, "madvise", NEW_GLIBC, False),  # already asked
    ({"GLIBC_TUNABLES": "glibc.malloc.check=0"}, "madvise", NEW_GLIBC, True),
    ({hp.OFF: "0"}, "madvise", NEW_GLIBC, False),
    ({}, "always", NEW_GLIBC, False),  # every allocation has them already
    ({}, "never", NEW_GLIBC, False),
    ({}, None, NEW_GLIBC, False),
    ({}, "madvise", (2, 31), False),  # glibc without the tunable
    ({}, "madvise", None, False),  # not glibc
])
def test_wanted_only_where_starting_again_gives_huge_pages(monkeypatch, env, mode, glibc, want):
    monkeypatch.setattr(sys, "platform", "linux")
    assert hp.wanted(env, mode, glibc) is want


def test_state_says_why():
    assert hp.state({}, "always", NEW_GLIBC)[0]
    assert hp.state({"GLIBC_TUNABLES": hp.SETTING}, "madvise", NEW_GLIBC)[0]
    on, why = hp.state({}, "madvise", NEW_GLIBC)
    assert not on and f"GLIBC_TUNABLES={hp.SETTING}" in why  # names the fix
    assert not hp.state({"GLIBC_TUNABLES": hp.SETTING}, "madvise", (2, 31))[0]
    assert not hp.state({}, "never", NEW_GLIBC)[0]


@pytest.mark.parametrize("before", [None, "glibc.malloc.check=0"])
def test_the_users_environment_comes_back(before):
    env = {"HOME": "/root"} | ({"GLIBC_TUNABLES": before} if before else {})
    added = hp.with_tunable(env)
    assert hp.tunable_set(added) and added["GLIBC_TUNABLES"].endswith(hp.SETTING)
    assert hp.as_users_run(added) == env
    assert hp.as_users_run(env) == env  # nothing added: nothing taken out


def test_reexec_starts_the_same_command_once_with_the_tunable(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "anydraft", "serve"])
    monkeypatch.setattr(sys, "argv", ["/x/anydraft/__main__.py", "serve"])
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(hp, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(hp, "glibc_version", lambda: NEW_GLIBC)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(hp.OFF, raising=False)
    hp.reexec()
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == ["python", "-m", "anydraft", "serve"]
    assert env["GLIBC_TUNABLES"] == hp.SETTING
    monkeypatch.setenv("GLIBC_TUNABLES", hp.SETTING)  # the command started again
    hp.reexec()
    assert len(calls) == 1


def test_only_the_anydraft_command_starts_again():
    assert hp.started_as_anydraft(["/venv/bin/anydraft", "serve"])
    assert hp.started_as_anydraft([os.path.join("/src", "anydraft", "__main__.py"), "bench"])
    assert not hp.started_as_anydraft(["/venv/bin/pytest", "-q"])  # a program running entry()
    assert not hp.started_as_anydraft([])
