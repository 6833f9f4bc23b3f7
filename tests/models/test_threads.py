"""models/threads.py: one torch thread for anydraft's own work, the free cores for the models."""

import os

import torch

from anydraft.models import threads


def stat_file(path, busy_ticks: list[int]):
    """A /proc/stat whose cpuN lines have ``busy_ticks[N]`` user ticks and 1000 idle ones."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {t} 0 0 1000 0 0 0 0 0 0" for i, t in enumerate(busy_ticks)]
    path.write_text("\n".join(lines) + "\n")


def load_over(tmp_path, monkeypatch, cpus: int, other_ticks: list[int], own_seconds: float) -> int:
    """The free cores a `Load` reads when, over one second, the CPUs were busy for
    ``other_ticks`` (each) plus this process's ``own_seconds``."""
    ticks = os.sysconf("SC_CLK_TCK")
    clock, own = [100.0], [0.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads.os, "times", lambda: os.times_result((own[0], 0.0, 0.0, 0.0, 0.0)))
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    stat = tmp_path / "stat"
    stat_file(stat, [0] * cpus)
    load = threads.Load(str(stat))
    clock[0] += 1.0
    own[0] = own_seconds
    mine = [int(own_seconds * ticks / cpus)] * cpus  # our own time, spread over the CPUs
    stat_file(stat, [t + m for t, m in zip(other_ticks, mine, strict=True)])
    return load.free_cores()


def test_a_core_another_process_keeps_busy_is_not_free(tmp_path, monkeypatch):
    ticks = os.sysconf("SC_CLK_TCK")
    assert load_over(tmp_path, monkeypatch, 2, [0, 0], 1.5) == 2  # only we worked
    assert load_over(tmp_path, monkeypatch, 2, [ticks, 0], 1.0) == 1  # a spinner on one
    assert load_over(tmp_path, monkeypatch, 2, [ticks, ticks], 0.0) == 1  # never fewer than one
    assert load_over(tmp_path, monkeypatch, 4, [ticks // 10, 0, 0, 0], 2.0) == 4  # a daemon's crumbs


def test_the_load_is_read_at_most_every_interval(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat_file(stat, [0, 0])
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    load = threads.Load(str(stat))
    stat.unlink()  # a reading now would find no file and keep the last answer anyway
    assert load.free_cores() == 2
    assert threads.Load(str(tmp_path / "missing")).free_cores() == 2  # no /proc: all free


def test_own_work_is_single_threaded_and_model_calls_get_the_free_cores(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    try:
        torch.set_num_threads(2)
        inside = []

        @threads.on_model_threads
        def feed():
            inside.append(torch.get_num_threads())

        with threads.host_threads():
            assert torch.get_num_threads() == 1
            with threads.host_threads():  # nested: still one, and the outer one restores
                assert torch.get_num_threads() == 1
            feed()
            monkeypatch.setattr(threads, "free_cores", lambda: 8)
            feed()
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        # the free cores, never more than the process had before anydraft
        assert inside == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_llamacpp_threads_follow_the_free_cores_unless_set(monkeypatch):
    monkeypatch.setattr(threads, "free_cores", lambda: 1)
    monkeypatch.delenv("ANYDRAFT_LLAMACPP_THREADS", raising=False)
    assert threads.llamacpp_threads() == 1
    monkeypatch.setenv("ANYDRAFT_LLAMACPP_THREADS", "3")
    assert threads.llamacpp_threads() == 3
