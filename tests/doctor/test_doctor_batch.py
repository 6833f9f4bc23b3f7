"""`anydraft doctor --batch` (doctor/batched.py): batched calls timed at a fixed context, the
ratio to the one-sequence curve, the `--max-batch auto` rule on either, the cache, the CLI."""

import dataclasses
import json

import pytest

from anydraft.cli import main
from anydraft.doctor import batched
from anydraft.errors import AnydraftError
from anydraft.hardware import profile
from anydraft.models.loaded import LoadedModel
from tests.hardware.test_machine import AVX512_BF16
from tests.helpers import byte_tokenizer, save_tiny_pair, tiny_llama

ZEN3 = {1: 0.252, 2: 0.292, 5: 0.340, 9: 0.463, 17: 0.665, 33: 1.005}  # Qwen-1.5B float32+onednn


class FakeBatch:
    """A `BatchSession` whose calls take ``cost(rows, tokens)`` seconds of a fake clock, and
    which checks that every timed call starts from the same context."""

    def __init__(self, cost, max_length=4096):
        self.cost, self.max_length, self.vocab_size = cost, max_length, 100
        self.lengths, self.now, self.starts = {}, 0.0, set()

    def clock(self):
        return self.now

    def add_row(self):
        row = len(self.lengths)
        self.lengths[row] = 0
        return row

    def remove_row(self, row):
        del self.lengths[row]

    def length(self, row):
        return self.lengths[row]

    def rollback(self, row, n):
        self.lengths[row] = n

    def feed_rows(self, feeds, rows):
        assert all(rows[r] <= len(ids) for r, ids in feeds.items())
        if any(self.lengths[r] for r in feeds):  # a timed call, not a fill
            self.starts.update(self.lengths[r] for r in feeds)
        tokens = {len(ids) for ids in feeds.values()}
        assert len(tokens) == 1 and all(0 <= i < self.vocab_size for ids in feeds.values() for i in ids)
        self.now += self.cost(len(feeds), tokens.pop())
        for r, ids in feeds.items():
            self.lengths[r] += len(ids)
        return {r: None for r in feeds}


def test_each_call_is_timed_after_the_same_context_and_rolled_back():
    batch = FakeBatch(lambda b, q: 0.1 * b * q)
    calls, context = batched.measure(batch, rows=(1, 2, 4), tokens=(1, 5), clock=batch.clock)
    assert context == batched.CONTEXT and batch.starts == {context}  # every call after the context
    assert calls == {(b, q): pytest.approx(0.1 * b * q) for b in (1, 2, 4) for q in (1, 5)}
    assert batch.lengths == {}  # the rows are given back
    short = FakeBatch(lambda b, q: 0.1, max_length=50)
    assert batched.measure(short, rows=(1, 2), tokens=(1, 5), clock=short.clock)[1] == 50 - 5 - 2


def test_a_real_tiny_batch_is_measured():
    tok = byte_tokenizer()
    loaded = LoadedModel("tiny", tiny_llama(len(tok), max_positions=64), tok, "float32")
    calls, context = batched.measure(loaded.new_batch(2), rows=(1, 2), tokens=(1, 3), repeats=1, context=20)
    assert context == 20 and sorted(calls) == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(s > 0 for s in calls.values())


def test_the_ratio_is_the_batched_call_over_the_curve_at_the_same_total_tokens():
    curve = {1: 0.1, 2: 0.2, 5: 0.5, 9: 0.9, 17: 1.7, 33: 3.3}  # T(M) = 0.1 M
    calls = {(1, 1): 0.1, (2, 1): 0.3, (4, 1): 0.2, (8, 1): 1.6, (1, 5): 0.5, (8, 5): 2.0}
    rows = batched.summarize(calls, curve)["calls"]
    assert [(c["rows"], c["tokens_per_row"]) for c in rows] == [(1, 1), (2, 1), (4, 1), (8, 1), (1, 5), (8, 5)]
    by = {(c["rows"], c["tokens_per_row"]): c for c in rows}
    assert by[(2, 1)]["curve_ms"] == pytest.approx(200) and by[(2, 1)]["ratio"] == pytest.approx(1.5)
    assert by[(4, 1)]["total_tokens"] == 4 and by[(4, 1)]["ratio"] == pytest.approx(0.5)
    assert by[(8, 1)]["ratio"] == pytest.approx(2.0) and by[(8, 1)]["batch_ms"] == pytest.approx(1600)
    # 40 tokens: past the curve's 33, along its last two sizes (bench/bound.py cost_at)
    assert by[(8, 5)]["extrapolated"] and not by[(1, 5)]["extrapolated"]
    assert by[(8, 5)]["curve_ms"] == pytest.approx(4000) and by[(8, 5)]["ratio"] == pytest.approx(0.5)


@pytest.mark.parametrize("name, cost, from_batch", [
    ("flat", lambda b: 0.25, 8),  # as many rows as were measured
    ("linear", lambda b: 0.25 * b, 1),  # B rows cost B calls: one at a time
    ("Zen 3 shape", {1: 0.25, 2: 0.30, 4: 0.36, 8: 0.5}.get, 8),  # 16 tokens/s: the most
])
def test_max_batch_auto_from_the_batched_calls(name, cost, from_batch):
    calls = {(b, 1): cost(b) for b in (1, 2, 4, 8)}
    auto = batched.summarize(calls, ZEN3)["max_batch_auto"]
    assert auto["from_batch"] == from_batch and auto["batch_limit"] == 8
    assert auto["from_curve"] == 15 and auto["curve_limit"] == 16  # what serve chooses (test_batching.py)
    assert auto["curve_slowdown"] == pytest.approx(0.6145 / 0.252, abs=0.01)  # T(15) / T(1)
    assert batched.summarize(calls, ZEN3, batches=False)["max_batch_auto"]["from_curve"] == 1


@pytest.mark.parametrize("curve, rows", [
    ({1: 1.0, 2: 1.0, 5: 1.0, 9: 1.0, 17: 1.1, 33: 2.0}, 16),  # flat
    ({1: 1.0, 2: 1.9, 5: 4.5, 9: 8.0, 17: 15.0, 33: 29.0}, 1),  # linear: 13% more at most
    ({1: 1.0, 2: 1.0, 3: 3.0, 9: 9.0}, 2),  # 2 rows for one's price, then linear: no more
    (ZEN3, 15),  # 24.4 tokens/s, within 5% of 16 rows' 25.4
    # Qwen-1.5B on llama.cpp, Intel Xeon (AVX-512): 15 rows at 45.6 tokens/s against one's 13.1
    ({1: 0.0765, 2: 0.1275, 5: 0.1592, 9: 0.2656, 17: 0.3499, 33: 0.7929}, 15),
    # llama.cpp on the Zen 3: 5 rows (29.6 tokens/s) beat 9 (18.7) and 16 (27.5)
    ({1: 0.056, 2: 0.098, 5: 0.169, 9: 0.482, 17: 0.595, 33: 1.143}, 5),
])
def test_the_rule_on_the_curve_is_the_servers(curve, rows):
    assert profile.max_batch(curve, 16) == rows
    assert profile.max_batch(curve, 4) == min(rows, 4)


@pytest.mark.parametrize("text", ["0", "1,0,4", "a,b", "", "2,-1", "1.5", ","])
def test_bad_sizes_are_refused_naming_the_form(text):
    with pytest.raises(AnydraftError, match="whole numbers >= 1 separated by commas"):
        batched.parse_sizes(text, "--batch-sizes")


def test_sizes_are_sorted_with_the_reference_call():
    assert batched.parse_sizes("8, 2,4", "--batch-sizes") == (1, 2, 4, 8)
    assert batched.parse_sizes("5", "--batch-tokens") == (1, 5)


def test_the_cache_is_per_machine_and_per_model_and_keeps_the_context(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path))
    batched.save("m|torch|float32|cpu", {(1, 1): 0.1, (2, 1): 0.15}, 200, AVX512_BF16)
    batched.save("m|torch|float32|cpu", {(2, 1): 0.12, (4, 5): 0.4}, 200, AVX512_BF16)
    assert batched.cached("m|torch|float32|cpu", AVX512_BF16) == (
        {(1, 1): 0.1, (2, 1): 0.12, (4, 5): 0.4}, 200)
    assert batched.cached("other|torch|float32|cpu", AVX512_BF16) is None
    batched.save("m|torch|float32|cpu", {(1, 1): 0.2}, 100, AVX512_BF16)  # another context: replaced
    assert batched.cached("m|torch|float32|cpu", AVX512_BF16) == ({(1, 1): 0.2}, 100)
    names = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    assert names == [f"{AVX512_BF16.key}.batched.json"]  # beside the curves' file, not in it


def test_batched_calls_measured_with_huge_pages_are_found_without(tmp_path, monkeypatch):
    """Found whichever way the process was started (the huge-page state is not in the machine's
    key, issue 61); an entry holds calls measured one way only."""
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path))
    with_pages = dataclasses.replace(AVX512_BF16, hugepages=True)
    batched.save("m|torch|float32|cpu", {(1, 1): 0.1, (2, 1): 0.15}, 200, with_pages)
    assert batched.cached("m|torch|float32|cpu", AVX512_BF16) == ({(1, 1): 0.1, (2, 1): 0.15}, 200)
    batched.save("m|torch|float32|cpu", {(1, 1): 0.11}, 200, AVX512_BF16)  # the other way: replaced
    assert batched.cached("m|torch|float32|cpu", with_pages) == ({(1, 1): 0.11}, 200)
    entry = json.loads(batched._path(AVX512_BF16).read_text())["batched"]["m|torch|float32|cpu"]
    assert entry["hugepages"] is False


def test_doctor_batch_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANYDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(profile, "busy", lambda seconds=0.5: False)
    target, _ = save_tiny_pair(tmp_path)
    out = tmp_path / "batch.json"
    argv = ["doctor", "--batch", "--target", str(target), "--target-backend", "torch", "--dtype",
            "float32", "--batch-sizes", "2,4", "--json", str(out)]
    assert main(argv) == 0
    printed, progress = capsys.readouterr()
    assert "cpu: " in printed and "| rows B | tokens per row q | B x q |" in printed
    assert "--max-batch auto" in printed and "batch: filling row 4/4" in progress
    data = json.loads(out.read_text())
    assert (data["backend"], data["dtype"], data["batches"], data["measured_now"]) == ("torch", "float32", True, True)
    assert [(c["rows"], c["tokens_per_row"]) for c in data["calls"]] == [
        (1, 1), (2, 1), (4, 1), (1, 5), (2, 5), (4, 5)]
    for c in data["calls"]:
        assert c["ratio"] == pytest.approx(c["batch_ms"] / c["curve_ms"], rel=0.02)
    assert set(data["max_batch_auto"]) >= {"from_batch", "from_curve"}
    assert sorted(map(int, data["curve_ms"])) == list(profile.SIZES)
    # a second run reads what the first cached
    assert main([*argv[:-2], "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert not again["measured_now"] and again["calls"] == data["calls"]


@pytest.mark.parametrize("argv, message", [
    (["--batch", "--target", "t", "--batch-sizes", "0,2"], "--batch-sizes takes whole numbers"),
    (["--batch", "--target", "t", "--batch-tokens", "one"], "--batch-tokens takes whole numbers"),
    (["--batch", "--target", "t", "--batch-context", "0"], "--batch-context takes a number"),
    (["--batch"], "pass --target NAME"),
    (["--batch", "--target", "t", "--drafter", "d"], "drop --drafter"),
    (["--target", "t", "--dtype", "float32"], "add --batch"),
])
def test_bad_doctor_batch_input_is_a_clear_error(argv, message, capsys):
    assert main(["doctor", *argv]) == 2  # refused before any model is looked up
    assert message in capsys.readouterr().err
