"""`anydraft bench-serve` end to end: real server processes over the tiny random model that
the server tests use (no download, no skip), two configurations at concurrency 1 and 2."""

from __future__ import annotations

import json
import re

import pytest

from anydraft.cli import main
from tests.helpers import byte_tokenizer, tiny_llama

PROMPTS = ["hello there", "the quick brown fox", "def f(x):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tok = byte_tokenizer()
    tiny_llama(len(tok), max_positions=1024).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def normal_priority(monkeypatch):
    """The suite may run under `chrt`, which bench-serve refuses (one test asks it)."""
    import os

    if hasattr(os, "sched_getscheduler"):
        monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "category": "tiny", "prompt": p}) + "\n"
                            for i, p in enumerate(PROMPTS)), encoding="utf-8")
    return path


def test_bench_serve_end_to_end(model_dir, dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the servers share the test machine's cores
    out = tmp_path / "out"
    # explicit configurations: plain decoding without a drafter, and sd with the model as its
    # own drafter (--fixed-k: every greedy draft is accepted, several tokens per step)
    rc = main(["bench-serve", "--target", str(model_dir), "--drafter", str(model_dir),
               "--dtype", "float32", "--device", "cpu", "--dataset", str(dataset),
               "--configs", "plain=--method ar;sd=--method sd --fixed-k",
               "--concurrency", "2,1", "--requests-per-level", "3", "--max-tokens", "8",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    configs = {c["label"]: c for c in data["meta"]["configs"]}
    assert list(configs) == ["plain", "sd"]
    assert "--drafter" not in configs["plain"]["server_command"]  # plain decoding needs none
    assert "--drafter" in configs["sd"]["server_command"]
    assert data["meta"]["machine"]["hardware"]

    assert [(lv["config"], lv["concurrency"]) for lv in data["levels"]] == [
        ("plain", 1), ("plain", 2), ("sd", 1), ("sd", 2)]
    for lv in data["levels"]:
        assert lv["requests"] == 3 and lv["errors"] == 0
        assert lv["completion_tokens"] > 0 and lv["throughput"] > 0
        for name in ("ttft", "itl", "tpot"):
            assert lv[f"{name}_p99"] >= lv[f"{name}_p50"] > 0, (name, lv)
        assert lv["throughput_vs_baseline"] > 0
    assert all(lv["throughput_vs_baseline"] == 1 for lv in data["levels"] if lv["config"] == "plain")
    assert all(lv["vs_c1"] == 1 for lv in data["levels"] if lv["concurrency"] == 1)
    # one client: the rate while its one request decodes (none idle between them)
    assert all(lv["full_batch"] > 0 and lv["full_batch_seconds"] > 0 and lv["full_batch_vs_c1"] == 1
               for lv in data["levels"] if lv["concurrency"] == 1)
    assert all(isinstance(c["max_batch"], int) and isinstance(c["cost_curve"], dict) for c in configs.values())
    assert all(c["target_path"] == "torch float32" for c in configs.values())
    by_config = {lv["config"]: lv for lv in data["levels"] if lv["concurrency"] == 1}
    assert by_config["plain"]["tokens_per_target_call"] == pytest.approx(1.0)
    assert by_config["sd"]["tokens_per_target_call"] > 1  # speculative steps did happen

    assert len(data["requests"]) == 12
    for r in data["requests"]:
        assert r["error"] is None and 0 < r["completion_tokens"] <= 8
        assert 0 < r["ttft"] <= r["latency"] and r["chunks"] == len(r["itl"]) + 1
        assert r["prompt_id"] in {"p0", "p1", "p2"}

    summary = (out / "summary.md").read_text()
    assert summary.startswith("# anydraft bench-serve:")
    assert "- cpu: " in summary  # the machine, from the hardware description
    table = [line for line in summary.splitlines()
             if line.startswith(("| plain", "| sd")) and line.count("|") > 5]
    assert len(table) == 4 and table[0].split(" | ")[5] == "1.00x"
    assert "## The servers" in summary
    assert {"throughput.png", "itl_p99.png"} <= {p.name for p in out.iterdir()}
    assert (out / "server-sd.log").exists()


def test_repeats_run_the_configurations_in_turn(model_dir, dataset, tmp_path, monkeypatch, capsys):
    """--repeats 2: each configuration's server twice, A B A B; a level's numbers are the
    medians of its rounds', its ratio the median of each round's own ratio."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "out"
    rc = main(["bench-serve", "--target", str(model_dir), "--dtype", "float32", "--device", "cpu",
               "--dataset", str(dataset), "--configs", "a=--method ar;b=--method ar --max-batch 1",
               "--concurrency", "1", "--requests-per-level", "2", "--max-tokens", "4",
               "--repeats", "2", "--no-plots", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    assert [(s["label"], s["round"]) for s in data["meta"]["servers"]] == [
        ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert [c["label"] for c in data["meta"]["configs"]] == ["a", "b"]
    assert {f"server-{x}.log" for x in ("a-1", "b-1", "a-2", "b-2")} <= {p.name for p in out.iterdir()}
    assert [(lv["config"], lv["round"]) for lv in data["rounds"]] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert len(data["requests"]) == 8
    for lv in data["levels"]:
        rounds = [r for r in data["rounds"] if r["config"] == lv["config"]]
        assert lv["rounds"] == 2 and lv["requests"] == 4 and lv["errors"] == 0
        assert lv["completion_tokens"] == sum(r["completion_tokens"] for r in rounds)
        assert lv["throughput"] == pytest.approx(sum(r["throughput"] for r in rounds) / 2)
        ratios = [r["throughput_vs_baseline"] for r in rounds]
        assert lv["throughput_vs_baseline"] == pytest.approx(sum(ratios) / 2)
        assert lv["vs_baseline_range"] == [min(ratios), max(ratios)]
    summary = (out / "summary.md").read_text()
    assert "- rounds: 2" in summary and "## Each round" in summary
    assert sum(line.startswith(("| a | 1 | ", "| b | 1 | ")) for line in summary.splitlines()) == 6
    servers = summary.split("## The servers")[1].split("\n## ")[0]
    listed = re.findall(r"^\| (\w+) \(rounds? ([\d, ]+)\) \|", servers, re.M)
    # each server once, the rounds whose servers had the same path, max batch and curve on one row
    assert sorted((label, r) for label, rs in listed for r in rs.split(", ")) == [
        ("a", "1"), ("a", "2"), ("b", "1"), ("b", "2")]


def test_servers_table_lists_rounds_with_the_same_server_once():
    from anydraft.bench.serve import servers_table

    curve = {"1": 0.1, "2": 0.15}
    # round 2's server chose another max batch
    servers = [{"label": "a", "round": r, "max_batch": b, "cost_curve": curve, "target_path": "torch bfloat16"}
               for r, b in ((1, 4), (2, 5), (3, 4))]
    rows = [line for line in servers_table(servers, repeats=3) if line.startswith("| a")]
    assert rows == ["| a (rounds 1, 3) | torch bfloat16 | 4 | M=1: 100, M=2: 150 |",
                    "| a (round 2) | torch bfloat16 | 5 | M=1: 100, M=2: 150 |"]
    assert servers_table(servers[:1], repeats=1)[-1] == "| a | torch bfloat16 | 4 | M=1: 100, M=2: 150 |"


def test_medians_sum_counts_and_take_the_median_of_each_rounds_ratio():
    from anydraft.bench.serve import medians

    def level(config, round_, tput, ratio, errors=0):
        return {"config": config, "round": round_, "concurrency": 8, "requests": 16, "errors": errors,
                "completion_tokens": 1000, "throughput": tput, "throughput_vs_baseline": ratio,
                "itl_p99": None}

    rounds = [level("x", 1, 10.0, 1.10), level("x", 2, 20.0, 0.90, errors=1), level("x", 3, 12.0, 1.00),
              level("y", 1, 5.0, None)]
    x, y = medians(rounds)
    assert (x["config"], x["rounds"], x["requests"], x["errors"], x["completion_tokens"]) == ("x", 3, 48, 1, 3000)
    # each number the middle of its rounds': 12 tok/s from round 3, the ratio 1.00 likewise
    assert x["throughput"] == 12.0 and x["throughput_vs_baseline"] == 1.0
    assert x["vs_baseline_range"] == [0.9, 1.1] and x["itl_p99"] is None
    assert y["rounds"] == 1 and y["throughput_vs_baseline"] is None and y["vs_baseline_range"] is None


def test_bad_concurrency(capsys):
    assert main(["bench-serve", "--target", "smollm2-135m", "--concurrency", "1,zero"]) == 2
    assert "--concurrency must be a comma list of integers >= 1" in capsys.readouterr().err


def test_a_real_time_scheduler_is_refused(capsys, tmp_path, monkeypatch):
    """Under `chrt -f` the servers' spinning threads hold every stream back to its end."""
    import os

    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_FIFO)
    assert main(["bench-serve", "--target", "smollm2-135m", "--out", str(tmp_path)]) == 2
    assert "run it at normal priority (without chrt)" in capsys.readouterr().err
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)
    assert main(["bench-serve", "--target", "no-such-model", "--out", str(tmp_path)]) == 2  # got past it


def test_unknown_model(capsys, tmp_path):
    assert main(["bench-serve", "--target", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_server_that_fails_to_start(model_dir, dataset, tmp_path, capsys):
    rc = main(["bench-serve", "--target", str(model_dir), "--dataset", str(dataset),
               "--configs", "broken=--max-concurrency 0", "--concurrency", "1",
               "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "the server for configuration 'broken' exited with status 2" in err
    assert "--max-concurrency must be at least 1" in err and "last lines of" in err


def test_configurations():
    from anydraft.bench.serve import default_configs, parse_configs, plain_ar
    from anydraft.errors import AnydraftError

    assert [(c.label, c.args) for c in default_configs(8)] == [
        ("plain-b1", ("--method", "ar", "--max-batch", "1")),
        ("plain-b8", ("--method", "ar", "--max-batch", "8")),
        ("anydraft-b1", ("--max-batch", "1")), ("anydraft-b8", ("--max-batch", "8"))]
    assert [c.label for c in default_configs(1)] == ["plain-b1", "anydraft-b1"]
    configs = parse_configs(["a=--method ar --max-batch 4; b=--method=sd", "c="])
    assert [(c.label, c.args) for c in configs] == [
        ("a", ("--method", "ar", "--max-batch", "4")), ("b", ("--method=sd",)), ("c", ())]
    assert [plain_ar(c.args) for c in configs] == [True, False, False]
    assert plain_ar(("--method=ar",))
    for bad in (["a=x;a=y"], ["no label here"], ["=--method ar"], [";"]):
        with pytest.raises(AnydraftError, match="--configs"):
            parse_configs(bad)


def test_batch_gain_reads_the_cost_curve():
    """The bound bench-serve reports beside each level: B / v(B), B = min(c, max_batch)."""
    from anydraft.bench.serve import batch_gain

    flat = {"1": 0.1, "2": 0.1, "5": 0.1, "9": 0.1}
    steep = {"1": 0.1, "2": 0.2, "5": 0.5, "9": 0.9}
    assert batch_gain(flat, 4, 8) == pytest.approx(4.0)  # 4 rows for the price of one
    assert batch_gain(flat, 8, 4) == pytest.approx(4.0)  # no more rows than max_batch
    assert batch_gain(steep, 8, 8) == pytest.approx(1.0)  # B tokens cost B calls: no gain
    assert batch_gain({"1": 0.1, "5": 0.2}, 3, 4) == pytest.approx(3 / 1.5)  # interpolated
    assert batch_gain({}, 4, 4) is None and batch_gain(flat, 4, None) is None


def test_full_batch_counts_only_the_time_the_batch_was_full():
    """Three requests, two rows at most: A decodes 1-11 s (21 tokens: 2/s after its first),
    B 2-6 s (9: 2/s), C, queued behind B, 6-8 s (5: 2/s). Two decode at once during 2-8 s,
    4 tokens/s, where the whole level, with its prompt reads and drain, has 35 tokens in 11 s;
    a failed request and one that ended at its first token count in neither."""
    from anydraft.bench.serve import full_batch

    def row(start, ttft, end, tokens, error=None):
        return {"start": start, "ttft": ttft, "latency": end - start, "completion_tokens": tokens,
                "error": error}

    rows = [row(0, 1, 11, 21), row(0, 2, 6, 9), row(1, 5, 8, 5), row(0, 1, 9, 30, "HTTP 500"),
            row(0, 3, 3, 1)]
    assert full_batch(rows, 2) == pytest.approx((4.0, 6.0))
    assert full_batch(rows, 1) == pytest.approx((32 / 10, 10.0))  # 1-11 s, after each first token
    assert full_batch(rows, 3) == (None, 0.0)  # never three at once
    assert full_batch([], 1) == (None, 0.0)


def test_a_request_on_a_connection_the_server_had_closed_is_sent_again():
    """llama-server closes idle keep-alive connections: a request on one reads nothing and is
    sent once more; any other failure is the request's result."""
    import asyncio
    import contextlib
    import json as jsonlib

    import httpx

    from anydraft.bench.serve import stream_one

    class Response:
        status_code = 200

        async def aiter_lines(self):
            for obj in ({"choices": [{"delta": {"content": "hi"}}]},
                        {"choices": [{"delta": {}, "finish_reason": "stop"}],
                         "usage": {"completion_tokens": 1, "prompt_tokens": 3}}):
                yield "data: " + jsonlib.dumps(obj)
            yield "data: [DONE]"

    class Client:
        def __init__(self, failures):
            self.failures, self.sent = failures, 0

        @contextlib.asynccontextmanager
        async def stream(self, method, url, json):
            self.sent += 1
            if self.sent <= len(self.failures):
                raise self.failures[self.sent - 1]
            yield Response()

    body = {"messages": [{"role": "user", "content": "x"}]}
    stale = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    client = Client([stale])
    row = asyncio.run(stream_one(client, "http://x", body))
    assert client.sent == 2 and row["error"] is None and row["completion_tokens"] == 1
    assert row["ttft"] <= row["latency"]
    client = Client([stale, stale])  # once only
    assert asyncio.run(stream_one(client, "http://x", body))["error"].startswith("RemoteProtocolError")
    client = Client([httpx.ReadTimeout("slow")])  # not a closed connection: not sent again
    assert asyncio.run(stream_one(client, "http://x", body))["error"].startswith("ReadTimeout") and client.sent == 1
