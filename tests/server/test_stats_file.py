"""`anydraft serve --stats FILE`: a server writes what it learned at shutdown, and the next one
starts from it."""

from __future__ import annotations

import json

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
