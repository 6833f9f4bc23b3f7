"""The scheduler a benchmark runs under: bench-serve refuses a real-time one, bench notes the
kernel's throttling of it."""

import os

import pytest

from anydraft.bench.realtime import throttle_note

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX scheduler")


def limits(tmp_path, runtime, period):
    (tmp_path / "sched_rt_runtime_us").write_text(f"{runtime}\n")
    (tmp_path / "sched_rt_period_us").write_text(f"{period}\n")
    return str(tmp_path)


@pytest.mark.parametrize("runtime, period, throttled", [
    (950000, 1000000, True),  # Linux's default: 950 ms of every second
    (-1, 1000000, False),  # throttling off
    (1000000, 1000000, False),
])
def test_throttle_note_under_a_real_time_policy(tmp_path, monkeypatch, runtime, period, throttled):
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_FIFO)
    note = throttle_note(limits(tmp_path, runtime, period))
    assert (note is not None) == throttled
    if throttled:
        assert "run 950 ms of every 1000 ms" in note


def test_no_note_at_normal_priority_or_without_the_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)
    assert throttle_note(limits(tmp_path, 950000, 1000000)) is None
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_RR)
    assert throttle_note(str(tmp_path / "missing")) is None
