"""`anydraft bench --busy-cores N` (bench/busy.py): spinning processes beside the measured runs."""

import json
import os

from anydraft.bench import busy, runner
from anydraft.cli import main
from tests.helpers import save_tiny_pair


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose; stop_process waits for it, so none should remain
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_busy_processes_run_inside_and_end_after():
    with busy.busy_cores(2) as pids:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        # the ordinary policy, even under `chrt`: a load the scheduler shares the cores with
        assert all(os.sched_getscheduler(p) == os.SCHED_OTHER for p in pids)
    assert not any(alive(p) for p in pids)
    with busy.busy_cores(0) as none:
        assert none == []


def test_bench_runs_its_measured_rows_beside_busy_processes(tmp_path, monkeypatch):
    save_tiny_pair(tmp_path)
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"id": "a", "category": "text", "prompt": "the quick brown fox"}) + "\n")
    entered, real = [], runner.busy_cores

    def recording(n):
        entered.append(n)
        return real(n)

    monkeypatch.setattr(runner, "busy_cores", recording)
    out = tmp_path / "out"
    rc = main(["bench", "--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"),
               "--methods", "ar,slem", "--target-backend", "torch", "--drafter-backend", "torch",
               "--fixed-k", "--dataset", str(data), "--max-new-tokens", "4", "--busy-cores", "1",
               "--no-plots", "--out", str(out)])
    assert rc == 0 and entered == [1]
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["settings"]["busy_cores"] == 1
    summary = (out / "summary.md").read_text()
    assert "busy cores 1" in summary and "busy-spinning process ran beside every measured run" in summary


def test_busy_cores_must_not_be_negative(tmp_path, capsys):
    rc = main(["bench", "--target", "x", "--busy-cores", "-1", "--out", str(tmp_path / "o")])
    assert rc != 0 and "--busy-cores must be >= 0" in capsys.readouterr().err
