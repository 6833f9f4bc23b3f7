"""models/threads.py: one torch thread for anydraft's own work, the free cores for the models."""

import os

import torch

from anydraft.models import threads


def load_over(monkeypatch, cpus: int, other_ticks: list[int], own_seconds: float) -> int:
    """The free cores a `Load` reads when, over one second, the CPUs were busy for
    ``other_ticks`` (each) beside this process's ``own_seconds``."""
    ticks = os.sysconf("SC_CLK_TCK")
    clock, counters = [100.0], [(0, 0, 0)]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads, "cpu_ticks", lambda cpus, stat, niced: counters[0])
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    load = threads.Load()
    clock[0] += 1.0
    own = int(own_seconds * ticks)
    counters[0] = (cpus * ticks, sum(other_ticks) + own, own)
    return load.free_cores()


def test_a_core_another_process_keeps_busy_is_not_free(monkeypatch):
    ticks = os.sysconf("SC_CLK_TCK")
    assert load_over(monkeypatch, 2, [0, 0], 1.5) == 2  # only we worked
    assert load_over(monkeypatch, 2, [ticks, 0], 1.0) == 1  # a spinner on one
    assert load_over(monkeypatch, 2, [ticks, ticks], 0.0) == 1  # never fewer than one
    assert load_over(monkeypatch, 4, [ticks // 20, 0, 0, 0], 2.0) == 4  # a daemon's crumbs
    assert load_over(monkeypatch, 4, [ticks // 5, 0, 0, 0], 2.0) == 4  # a fifth of one: still ours
    assert load_over(monkeypatch, 4, [ticks * 3 // 5, 0, 0, 0], 2.0) == 3  # most of one


def test_a_load_seen_only_over_a_long_idle_span_does_not_take_cores(monkeypatch):
    """Another program busy while this process waited (llama-server answering the bench) says
    nothing of now: that span is dropped, and the next recent one counts again."""
    ticks = os.sysconf("SC_CLK_TCK")
    clock, counters = [100.0], [(0, 0, 0)]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads, "cpu_ticks", lambda cpus, stat, niced: counters[0])
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    load = threads.Load()
    clock[0] += 3 * threads.STALE_AFTER  # both cores busy with another program all along
    counters[0] = (2 * 3 * ticks, 2 * 3 * ticks, 0)
    assert load.free_cores() == 2
    clock[0] += threads.STALE_AFTER  # a recent span as busy: now it counts
    counters[0] = tuple(c + 2 * ticks for c in counters[0][:2]) + (0,)
    assert load.free_cores() == 1


def test_the_load_is_read_at_most_every_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    assert threads.Load(str(tmp_path / "missing")).free_cores() == 2  # no /proc: all free
    load = threads.Load()
    monkeypatch.setattr(threads, "cpu_ticks", lambda cpus, stat, niced: 1 / 0)  # not read so soon
    assert load.free_cores() == 2


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


def test_niced_work_counts_where_we_are_niced_or_sessions_share_first(tmp_path, monkeypatch):
    on, off = tmp_path / "on", tmp_path / "off"
    on.write_text("1\n")
    off.write_text("0\n")
    monkeypatch.setattr(threads.os, "getpriority", lambda which, who: 0)
    assert threads.niced_compete(str(on)) is True  # autogroup: nice orders a session's own only
    assert threads.niced_compete(str(off)) is False
    assert threads.niced_compete(str(tmp_path / "missing")) is False
    monkeypatch.setattr(threads.os, "getpriority", lambda which, who: 19)
    assert threads.niced_compete(str(off)) is True  # our own time is counted as nice
