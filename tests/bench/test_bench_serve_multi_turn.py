"""`anydraft bench-serve --workload multi-turn` without servers: the conversations it builds
(a shared system prompt, the history growing with each answer, turn indices), the plan of
each level, what a server reports as cached, and the per-level math (warm-turn TTFT, hit rate)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from anydraft.bench import serve
from anydraft.bench.datasets import load_dataset
from anydraft.cli import main


def answered(text: str, error: str | None = None, **fields) -> dict:
    """A `stream_one` row: what the fakes below answer."""
    return {"sent": 0.0, "latency": 1.0, "ttft": 0.1, "itl": [], "tpot": None,
            "completion_tokens": 3, "prompt_tokens": 10, "cached_tokens": None, "chunks": 1,
            "finish_reason": "stop", "target_calls": None, "error": error, "text": text, **fields}


def test_each_turn_sends_the_whole_history_with_the_answers_streamed_back():
    sent = []

    async def send(messages, turn):
        sent.append((turn, messages))
        return answered(f"answer {turn}")

    rows = asyncio.run(serve.converse(send, ["first", "second", "third"], system="be brief"))
    assert [r["turn"] for r in rows] == [1, 2, 3] and all("text" not in r for r in rows)
    assert [turn for turn, _ in sent] == [1, 2, 3]
    assert sent[0][1] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"}]
    assert sent[2][1] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "second"},
        {"role": "assistant", "content": "answer 2"}, {"role": "user", "content": "third"}]
    # each turn's history starts with the last one's, and the turn's answer follows it
    for (_, before), (_, after) in zip(sent, sent[1:], strict=False):
        assert after[:len(before)] == before and len(after) == len(before) + 2


def test_a_failed_turn_ends_its_conversation():
    async def send(messages, turn):
        return answered("", error="HTTP 500: boom") if turn == 2 else answered("ok")

    rows = asyncio.run(serve.converse(send, ["a", "b", "c"]))
    assert [(r["turn"], r["error"]) for r in rows] == [(1, None), (2, "HTTP 500: boom")]


def test_clients_hold_their_own_conversations_and_share_the_system_prompt(monkeypatch):
    """Two clients, five conversations of three turns: client k holds conversations k, k + 2,
    ... one after another; every request starts with the same system prompt."""
    log = []

    async def fake_stream_one(client, url, body):
        user = body["messages"][-1]["content"]
        log.append(("sent", user, body))
        await asyncio.sleep(0)  # let the other client run between send and answer
        log.append(("answered", user))
        return answered(f"re: {user}", cached_tokens=len(body["messages"]), sent=time.perf_counter())

    monkeypatch.setattr(serve, "stream_one", fake_stream_one)
    conversations = [{"id": f"p{j}", "turns": [f"c{j} t{t}" for t in (1, 2, 3)]} for j in range(5)]
    done = []

    def body(messages, j, turn):
        return {"messages": messages, "conversation": j, "turn": turn}

    rows, wall = asyncio.run(serve.run_conversations("http://x", conversations, 2, body, done.append))
    assert len(rows) == len(done) == 15 and wall >= 1.0  # the fake's latency
    assert [(r["conversation"], r["turn"]) for r in rows] == [(j, t) for j in range(5) for t in (1, 2, 3)]
    assert all(r["client"] == r["conversation"] % 2 and r["prompt_id"] == f"p{r['conversation']}"
               for r in rows)
    bodies = [entry[2] for entry in log if entry[0] == "sent"]
    assert {json.dumps(b["messages"][0]) for b in bodies} == {
        json.dumps({"role": "system", "content": serve.SYSTEM_PROMPT})}
    for b in bodies:  # the body's numbers are the conversation's and turn's own
        assert b["messages"][-1]["content"] == f"c{b['conversation']} t{b['turn']}"
        assert len(b["messages"]) == 2 * b["turn"]
        assert [m["content"] for m in b["messages"][2::2]] == [
            f"re: c{b['conversation']} t{t}" for t in range(1, b["turn"])]
    # one client's conversations in turn: conversation 2 starts after conversation 0 ended
    order = [(kind, user) for kind, user, *_ in log]
    assert order.index(("sent", "c2 t1")) > order.index(("answered", "c0 t3"))
    assert order.index(("sent", "c1 t1")) < order.index(("answered", "c0 t1"))  # two at once
    assert all("text" not in r for r in rows) and all(r["cached_tokens"] == 2 * r["turn"] for r in rows)


def test_user_turns_take_the_rows_own_then_generic_follow_ups():
    own = {"id": "81", "prompt": "Write a post.", "turns": ["Write a post.", "Rewrite it."]}
    assert serve.user_turns(own, 4) == ["Write a post.", "Rewrite it.", *serve.FOLLOW_UPS[:2]]
    assert serve.user_turns(own, 1) == ["Write a post."]
    single = {"id": "q", "prompt": "What is 2 + 2?"}  # a row loaded without turns
    assert serve.user_turns(single, 6) == ["What is 2 + 2?", *serve.FOLLOW_UPS,
                                           serve.FOLLOW_UPS[0]]
    # rows with a second turn of their own are preferred; without any, every row is used
    rows = [single, own, {"id": "r", "prompt": "x", "turns": ["x"]}]
    assert serve.conversation_rows(rows) == [own]
    assert serve.conversation_rows([single]) == [single]


def test_each_level_gets_new_conversations_a_whole_number_per_client():
    rows = [{"id": f"r{i}", "prompt": f"q{i}", "turns": [f"q{i}", f"more {i}"]} for i in range(10)]
    plan = serve.plan_conversations(rows, {1: 16, 3: 16, 8: 32}, 4)
    # ceil(16 / 4) = 4 for one client; ceil(16 / 12) = 2 each for three; 32 / 32 = 1 each for 8
    assert {c: len(p) for c, p in plan.items()} == {1: 4, 3: 6, 8: 8}
    ids = [conv["id"] for c in (1, 3, 8) for conv in plan[c]]
    assert ids == [f"r{i % 10}" for i in range(18)]  # one after another, wrapping round
    assert not {conv["id"] for conv in plan[1]} & {conv["id"] for conv in plan[3]}
    assert plan[1][0]["turns"] == ["q0", "more 0", *serve.FOLLOW_UPS[:2]]
    assert serve.plan_conversations(rows, {4: 1}, 4)[4] == serve.plan_conversations(rows, {4: 16}, 4)[4]


def test_warm_turn_ttft_and_the_hit_rate_count_turns_from_the_second():
    def row(conv, turn, ttft, prompt, cached, error=None):
        return {"conversation": conv, "turn": turn, "ttft": ttft, "prompt_tokens": prompt,
                "cached_tokens": cached, "error": error}

    rows = [row(0, 1, 1.0, 400, 300), row(0, 2, 0.2, 600, 500), row(0, 3, 0.4, 800, 600),
            row(1, 1, 3.0, 450, 0), row(1, 2, 0.6, 700, 0),
            row(2, 1, 9.0, 400, None, error="HTTP 500")]  # failed: counted in no number
    stats = serve.turn_stats(rows)
    assert stats["conversations"] == 3 and stats["warm_requests"] == 3
    # turn 1's cached tokens (the shared system prompt) are left out of the hit rate
    assert (stats["warm_cached_tokens"], stats["warm_prompt_tokens"]) == (1100, 2100)
    assert stats["cache_hit_rate"] == pytest.approx(1100 / 2100)
    assert stats["warm_ttft_p50"] == pytest.approx(0.4)
    assert stats["warm_ttft_p90"] == pytest.approx(0.4 + 0.8 * 0.2)  # numpy's linear percentile
    assert stats["ttft_p90"] == pytest.approx(1.0 + 0.6 * 2.0)  # over all five turns
    # a server reporting nothing: no rate, not 0
    silent = serve.turn_stats([{**r, "cached_tokens": None} for r in rows])
    assert silent["cache_hit_rate"] is silent["warm_cached_tokens"] is None
    assert silent["warm_ttft_p50"] == pytest.approx(0.4)
    one_turn = serve.turn_stats([row(0, 1, 1.0, 400, 300)])
    assert one_turn["cache_hit_rate"] is one_turn["warm_ttft_p50"] is None


def test_rounds_sum_the_token_counts_and_take_the_median_rate():
    def level(round_, cached, prompt):
        return {"config": "a", "round": round_, "concurrency": 1, "requests": 8, "errors": 0,
                "conversations": 2, "warm_cached_tokens": cached, "warm_prompt_tokens": prompt,
                "cache_hit_rate": cached / prompt, "throughput_vs_baseline": 1.0}

    (lv,) = serve.medians([level(1, 10, 100), level(2, 50, 100), level(3, 80, 100)])
    assert (lv["conversations"], lv["warm_cached_tokens"], lv["warm_prompt_tokens"]) == (6, 140, 300)
    assert lv["cache_hit_rate"] == pytest.approx(0.5)


def test_cached_tokens_as_each_server_reports_them():
    openai = {"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 850}}
    assert serve.cached_tokens(openai, {"cache_n": 1}) == 850  # OpenAI's field first
    assert serve.cached_tokens({"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 0}},
                               None) == 0  # a miss is 0, not unknown
    assert serve.cached_tokens({"prompt_tokens": 900}, {"cache_n": 700, "prompt_n": 200}) == 700
    assert serve.cached_tokens({"prompt_tokens": 900}, {"prompt_n": 900}) is None
    assert serve.cached_tokens(None, None) is None


def test_multi_turn_requests_ask_for_the_cache_and_the_usage():
    from argparse import Namespace

    args = Namespace(max_tokens=16, temperature=0.0, completions=False)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    body = serve.request_body(messages, args, 7, cache_prompt=True)
    assert body["messages"] == messages and body["cache_prompt"] is True and body["seed"] == 7
    assert body["stream_options"] == {"include_usage": True}
    single = serve.request_body("hi", args, 7)
    assert single["cache_prompt"] is False and single["messages"] == [{"role": "user", "content": "hi"}]


def test_llama_server_keeps_its_prompt_cache_in_the_multi_turn_workload():
    from anydraft.bench import llama_server

    flavor = serve.with_prompt_cache(llama_server.LLAMA_SERVER)
    assert "--no-cache-prompt" in llama_server.LLAMA_SERVER.flags  # the single workload's
    assert flavor.flags == tuple(f for f in llama_server.LLAMA_SERVER.flags if f != "--no-cache-prompt")
    assert flavor.name == llama_server.LLAMA_SERVER.name  # the same binary
    assert serve.with_prompt_cache(llama_server.IK_SERVER) == llama_server.IK_SERVER


def test_dataset_rows_carry_their_later_turns(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        {"question_id": 81, "category": "writing", "turns": ["Write.", "Rewrite it."]},
        {"question_id": 1, "category": "qa", "turns": ["Why?"]},
        {"id": "p", "category": "code", "prompt": "def f():"})) + "\n\n")
    rows = load_dataset(str(path), turns=True)
    assert [r["turns"] for r in rows] == [["Write.", "Rewrite it."], ["Why?"], ["def f():"]]
    assert [r["turns"] for r in load_dataset(str(path), ["writing"], turns=True)] == [["Write.", "Rewrite it."]]
    assert "turns" not in load_dataset(str(path))[0]  # only when asked
    assert all(r["turns"] == [r["prompt"]] for r in load_dataset("builtin", turns=True))


def test_the_summary_gains_the_multi_turn_table(tmp_path):
    meta = {"settings": {"target": "t", "drafter": None, "dataset": "spec-bench", "prompts": 80,
                         "conversation_prompts": 80, "concurrency": [1], "rate": None,
                         "requests_per_level": None, "max_tokens": 8, "temperature": 0.0, "seed": 0,
                         "completions": False, "baseline": "llama-server", "warmup": True,
                         "repeats": 1, "workload": "multi-turn", "turns": 4},
            "machine": {"platform": "p", "processor": "x", "cpu_count": 2, "device": "cpu",
                        "versions": {"anydraft": "0", "torch": "0", "transformers": "0"},
                        "git_commit": None, "python": "3", "date": "d"},
            "command": "anydraft bench-serve", "configs": [{"label": "a", "args": []}], "servers": []}
    level = {"config": "a", "concurrency": 1, "requests": 16, "errors": 0, "throughput": 10.0,
             "throughput_vs_baseline": 1.0, "tokens_per_target_call": None,
             **{f"{k}_{p}": 0.1 for k in ("ttft", "itl", "tpot") for p in ("p50", "p99")},
             "conversations": 4, "warm_requests": 12, "ttft_p90": 0.9, "warm_ttft_p50": 0.05,
             "warm_ttft_p90": 0.08, "warm_cached_tokens": 900, "warm_prompt_tokens": 1000,
             "cache_hit_rate": 0.9}
    text = serve.write_summary(tmp_path, meta, [level], []).read_text()
    assert "## Multi-turn: TTFT by turn and the prefix cache" in text and "4 turns each" in text
    assert "| a | 1 | 4 | 16 | 0 | 10.0 | 100.0 | 900.0 | 50.0 | 80.0 | 900 / 1000 | 90.0% |" in text
    single = {**meta, "settings": {**meta["settings"], "workload": "single", "turns": None}}
    assert "Multi-turn" not in serve.write_summary(tmp_path, single, [level], []).read_text()


@pytest.mark.parametrize("extra, message", [
    (["--turns", "3"], "--turns is for --workload multi-turn"),
    (["--workload", "multi-turn", "--turns", "0"], "--turns must be >= 1"),
    (["--workload", "multi-turn", "--rate", "2"], "leave out --rate"),
    (["--workload", "multi-turn", "--completions"], "leave out --completions")])
def test_bad_multi_turn_settings(extra, message, capsys):
    assert main(["bench-serve", "--target", "no-such-model", *extra]) == 2
    assert message in capsys.readouterr().err


def test_the_command_runs_conversations_and_reports_them(tmp_path, monkeypatch):
    """The whole command with a fake server process and fake streams (no model, no process): a
    server whose cache holds every turn's history but its last 5 tokens."""
    import os

    from anydraft.bench import report

    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: os.SCHED_OTHER, raising=False)
    monkeypatch.setattr(report, "machine_info", lambda device: {
        "platform": "p", "processor": "x", "cpu_count": 2, "device": device, "python": "3",
        "versions": {"anydraft": "0", "torch": "0", "transformers": "0"}, "git_commit": None,
        "date": "d"})
    commands = []

    class FakeServer:
        def __init__(self, cmd, log_path, **env):
            commands.append(cmd)

        def wait_ready(self, base, timeout, label):
            return {"max_batch": 2, "cost_curve": None, "target_path": "fake"}

        def stop(self):
            pass

    bodies = []

    async def fake_stream_one(client, url, body):
        bodies.append(body)
        prompt = sum(len(m["content"]) for m in body["messages"]) // 4
        warm = len(body["messages"]) > 2
        return answered(f"answer to {body['messages'][-1]['content']}", sent=time.perf_counter(),
                        prompt_tokens=prompt, cached_tokens=prompt - 5 if warm else 0)

    monkeypatch.setattr(serve, "ServerProcess", FakeServer)
    monkeypatch.setattr(serve, "stream_one", fake_stream_one)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("\n".join(json.dumps(r) for r in (
        {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Make it rhyme."]},
        {"question_id": 2, "category": "qa", "turns": ["Why is the sky blue?"]})) + "\n")
    out = tmp_path / "out"
    assert main(["bench-serve", "--target", str(model), "--device", "cpu", "--dataset", str(dataset),
                 "--configs", "on=--max-batch 2;off=--max-batch 2 --prefix-cache-mb 0",
                 "--workload", "multi-turn", "--turns", "3", "--concurrency", "1,2",
                 "--requests-per-level", "4", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["settings"]["workload"] == "multi-turn" and data["meta"]["settings"]["turns"] == 3
    assert len(commands) == 2 and commands[1][-2:] == ["--prefix-cache-mb", "0"]
    # the warm-up: the system prompt and a message of its own; then every request asks for the cache
    assert [m["content"] for m in bodies[0]["messages"]] == [serve.SYSTEM_PROMPT, serve.WARMUP_MESSAGE]
    assert all(b["cache_prompt"] is True for b in bodies)
    # c=1: ceil(4 / 3) = 2 conversations; c=2: one each; both from the row with a turn of its own
    requests = [r for r in data["requests"] if r["config"] == "on"]
    assert [(r["concurrency"], r["conversation"], r["turn"]) for r in requests] == [
        (c, j, t) for c, n in ((1, 2), (2, 2)) for j in range(n) for t in (1, 2, 3)]
    assert {r["prompt_id"] for r in requests} == {"1"}
    first = bodies[1:4]  # the first conversation's turns
    assert [b["messages"][-1]["content"] for b in first] == ["Write a poem.", "Make it rhyme.",
                                                             serve.FOLLOW_UPS[0]]
    assert first[2]["messages"][3] == {"role": "user", "content": "Make it rhyme."}
    assert first[2]["messages"][4] == {"role": "assistant", "content": "answer to Make it rhyme."}
    for lv in data["levels"]:
        warm = [r for r in data["requests"] if r["config"] == lv["config"]
                and r["concurrency"] == lv["concurrency"] and r["turn"] >= 2]
        assert lv["conversations"] == 2 and lv["errors"] == 0
        assert lv["warm_prompt_tokens"] == sum(r["prompt_tokens"] for r in warm)
        assert lv["cache_hit_rate"] == pytest.approx(1 - 5 * len(warm) / lv["warm_prompt_tokens"])
        assert lv["warm_ttft_p50"] == pytest.approx(0.1)
    summary = (out / "summary.md").read_text()
    assert "## Multi-turn: TTFT by turn and the prefix cache" in summary
    assert {"warm_ttft_p50.png", "cache_hit_rate.png"} <= {p.name for p in out.iterdir()}
