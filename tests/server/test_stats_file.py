"""`anydraft serve --stats FILE`: a server writes what it learned at shutdown, and the next one
starts from it."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import httpx
import pytest

from anydraft.cli import main
from tests.server.conftest import chat_body
from tests.server_process import Server


def test_a_restarted_server_starts_from_what_the_last_one_learned(model_dir, tmp_path):
    stats = tmp_path / "stats.json"
    options = ("--drafter", str(model_dir), "--max-batch", "1", "--stats", str(stats))
    first = Server(model_dir, tmp_path / "first.log", *options)
    try:
        first.wait_ready()
        for prompt in ("hello there", "the quick brown fox"):
            httpx.post(f"{first.base}/v1/chat/completions", json=chat_body(prompt, max_tokens=16),
                       timeout=60).raise_for_status()
    finally:
        first.stop()
    log = first.log()
    assert f"stats: {stats} not found, starting cold" in log and f"stats: wrote {stats}" in log
    assert json.loads(stats.read_text())["acceptance"][0]["steps"] > 0

    second = Server(model_dir, tmp_path / "second.log", *options)
    try:
        second.wait_ready()
    finally:
        second.stop()
    assert f"stats: seeded from {stats} (" in second.log()


def test_a_stats_file_in_a_missing_folder_is_refused_before_loading(tmp_path, capsys):
    assert main(["serve", "--target", "m", "--stats", str(tmp_path / "none" / "stats.json")]) == 2
    assert "--stats: folder" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["stats.json", "./a/../stats.json"])
def test_the_stats_path_is_made_absolute_for_replicas_elsewhere(path, tmp_path, monkeypatch):
    from anydraft.cli import build_parser

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["serve", "--target", "m", "--stats", path])
    assert args.stats == str(tmp_path / "stats.json")


def _decoder_learning():
    """Enough of a decoder for learned.py: one model, and the estimates it learns."""
    import torch

    from anydraft.planning.estimates import Estimates

    model = SimpleNamespace(name="t", backend="torch", dtype="float32", device=torch.device("cpu"))
    return SimpleNamespace(target=model, drafter=None, estimates=Estimates())


def test_the_stats_saved_are_whole_while_a_worker_stuck_in_a_step_still_changes_them(tmp_path):
    """Issue 61: the statistics were saved after a `close` whose join may time out, from
    estimates its worker was still changing: "dictionary changed size during iteration", and
    nothing was written. Now they are saved from what the worker handed over between steps."""
    from anydraft import learned
    from anydraft.server.scheduler import Scheduler
    from anydraft.server.workers import save_stats
    from tests.server.test_scheduler import job, outcome

    dec, keys, path = _decoder_learning(), 300, tmp_path / "stats.json"
    stuck, go_on = threading.Event(), threading.Event()

    def learn(job):  # a step in which every key learns once
        for n in range(keys):
            dec.estimates.of("copy", True, n).steps += 1

    def keep_learning(job):  # a step that outlives `close`, learning all along
        stuck.set()
        n = keys
        while not go_on.is_set():
            dec.estimates.of("copy", True, n).steps += 1
            dec.estimates.of("copy", True, n % keys).steps += 1
            n += 1

    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler([dec], max_queue=4, snapshot=lambda d: learned.snapshot(d.estimates))
        sched.start()
        sched.submit(first := job(learn, loop))
        await outcome(first)
        sched.submit(job(keep_learning, loop))
        while not stuck.is_set():
            await asyncio.sleep(0.01)
        await asyncio.to_thread(sched.close, 0.1)  # its join times out
        try:
            await asyncio.to_thread(save_stats, [dec], sched.snapshots, str(path))
        finally:
            go_on.set()

    asyncio.run(main())
    assert [entry["steps"] for entry in json.loads(path.read_text())["acceptance"]] == [1] * keys


def test_a_failure_to_save_the_stats_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    from anydraft import learned
    from anydraft.server.workers import save_stats

    def broken(decoder, path, snapshot=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(learned, "save", broken)
    dec = _decoder_learning()
    save_stats([dec], [learned.snapshot(dec.estimates)], str(tmp_path / "stats.json"))
    assert "stats: could not write" in caplog.text and "a bug" in caplog.text
