"""Continuous batching in the server (issue 21): one worker runs up to ``--max-batch``
generations together, each exactly what plain decoding gives alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from anydraft.planning.settings import SETTINGS
from tests.server.conftest import MODEL_ID, wait_for

PROMPTS = ["the quick brown fox", "hello", "a much longer prompt than the others, " * 8,
           "count: 1 2 3", "zebra", "lorem ipsum dolor", "x", "why is the sky blue?"]


def stream(base: str, prompt: str, max_tokens: int, chunks: list | None = None) -> str:
    """A streamed greedy completion's text; each content chunk is appended to ``chunks``."""
    body = {"model": MODEL_ID, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "stream": True}
    text = []
    with httpx.Client(timeout=120) as http, http.stream("POST", base + "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                piece = json.loads(line[6:])["choices"][0]["text"]
                text.append(piece)
                if chunks is not None and piece:
                    chunks.append(piece)
    return "".join(text)


def test_health_reports_max_batch(batched_server, server):
    health = httpx.get(batched_server.base + "/health").json()
    assert health["max_batch"] == 4 and health["target_path"].startswith("torch ")
    # auto: two workers share the cores, so each runs one generation at a time
    assert httpx.get(server.base + "/health").json()["max_batch"] == 1


def test_rows_of_one_batch_equal_plain_decoding(batched_server, decoder):
    """8 concurrent requests (prompts of 1 to ~300 tokens, lengths 5 to 40, so rows join and
    leave at different steps) through 4 rows: each equals plain greedy decoding alone."""
    lengths = [5 + 5 * i for i in range(len(PROMPTS))]
    refs = [decoder.generate(p, max_new_tokens=n, temperature=0.0, chat=False).text
            for p, n in zip(PROMPTS, lengths, strict=True)]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        outs = list(pool.map(lambda i: stream(batched_server.base, PROMPTS[i], lengths[i]),
                             range(len(PROMPTS))))
    assert outs == refs


def test_generations_run_together_and_a_cancelled_row_leaves(batched_server, decoder):
    """One worker, 3 long streams: all three stream at once (not one after another); one
    client hangs up and its row is freed at the next step, while the other two go on to
    output equal to plain decoding alone."""
    n = 300
    refs = {p: decoder.generate(p, max_new_tokens=n, temperature=0.0, chat=False).text
            for p in PROMPTS[:2]}
    chunks = {p: [] for p in PROMPTS[:3]}
    outs = {}

    def full(prompt):
        outs[prompt] = stream(batched_server.base, prompt, n, chunks[prompt])

    threads = [threading.Thread(target=full, args=(p,)) for p in PROMPTS[:2]]
    for t in threads:
        t.start()
    body = {"model": MODEL_ID, "prompt": PROMPTS[2], "temperature": 0, "max_tokens": 4000,
            "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", batched_server.base + "/v1/completions",
                                                        json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                chunks[PROMPTS[2]].append(line)
            if all(chunks.values()):
                break
        # all three have streamed while the first two are still running: they run together
        # (one generation at a time would start this one only after both ended)
        assert all(chunks.values()) and all(t.is_alive() for t in threads)
    # the hung-up row leaves; the worker then holds only the two others
    wait_for(lambda: httpx.get(batched_server.base + "/health").json()["active"] <= 2,
             what="the cancelled row to leave")
    for t in threads:
        t.join(120)
    assert outs == refs


@pytest.mark.parametrize("curve, rows", [
    ({1: 1.0, 2: 1.0, 5: 1.0, 9: 1.0, 17: 1.1, 33: 2.0}, 16),  # flat: as many rows as allowed
    ({1: 1.0, 2: 1.9, 5: 4.5, 9: 8.0, 17: 15.0, 33: 29.0}, 1),  # steep: one at a time
    ({1: 0.252, 2: 0.292, 5: 0.340, 9: 0.463, 17: 0.665, 33: 1.005}, 15),  # the Zen 3, float32+onednn
])
def test_auto_max_batch_from_the_cost_curve(monkeypatch, curve, rows):
    """The fewest rows whose call gives within 5% of the most throughput (read between measured
    sizes); one where batching gains little."""
    from types import SimpleNamespace

    from anydraft.models import auto
    from anydraft.server.workers import choose_max_batch

    monkeypatch.setattr(auto, "curve_of", lambda *a, **k: curve)
    decoder = SimpleNamespace(target=SimpleNamespace(batches=True, backend="torch"))
    args = SimpleNamespace(max_batch="auto", max_concurrency=1, target="t")
    assert choose_max_batch(decoder, args) == rows
    assert choose_max_batch(decoder, SimpleNamespace(**{**vars(args), "max_concurrency": 2})) == 1
    assert choose_max_batch(decoder, SimpleNamespace(**{**vars(args), "max_batch": 3})) == 3
    decoder.target.batches = False  # rows one after another would only add waiting
    assert choose_max_batch(decoder, args) == 1


def test_the_target_path_is_chosen_for_the_rows_the_server_may_batch(monkeypatch):
    from types import SimpleNamespace

    import anydraft.decoder
    from anydraft.server import workers

    args = SimpleNamespace(max_batch="auto", max_concurrency=1)
    assert workers.target_rows(args) == SETTINGS.max_auto_batch
    assert workers.target_rows(SimpleNamespace(max_batch=4, max_concurrency=1)) == 4
    assert workers.target_rows(SimpleNamespace(max_batch="auto", max_concurrency=2)) == 1
    # as `choose_max_batch`: a --max-batch given is each worker's rows, however many workers
    assert workers.target_rows(SimpleNamespace(max_batch=4, max_concurrency=2)) == 4
    seen = []

    class Stop(Exception):
        pass

    def decoder(**kwargs):
        seen.append(kwargs["rows"])
        raise Stop

    monkeypatch.setattr(anydraft.decoder, "Decoder", decoder)
    monkeypatch.setattr("anydraft.options.decoder_options", lambda a: {})
    with pytest.raises(Stop):
        workers.build_decoders(args)
    assert seen == [SETTINGS.max_auto_batch]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_the_thread_that_loads_the_models_lets_its_openmp_threads_go():
    """`build_workers` ends with `release_openmp_threads`: the OpenMP threads that a model call
    made for the loading thread exit, so only the workers' spin (run in a fresh process, so
    no other test's threads come and go)."""
    script = """
import os, time, torch
from anydraft.server.workers import release_openmp_threads
torch.set_num_threads(2)
torch.ones(1 << 22).add_(1)  # a parallel region: this thread's OpenMP threads start
before = len(os.listdir("/proc/self/task"))
assert release_openmp_threads()
deadline = time.monotonic() + 10
while len(os.listdir("/proc/self/task")) >= before and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, len(os.listdir("/proc/self/task")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after < before


def test_each_worker_finds_its_caches_made():
    """`make_caches` makes every worker's target and drafter session before it hands any back,
    so the model's spare caches hold one per worker (a llama.cpp context: 0.1-1.3 s to make)."""
    from types import SimpleNamespace

    from anydraft.server import workers

    events = []

    class Model:
        def __init__(self, name):
            self.name = name

        def new_session(self):
            events.append(("made", self.name))
            return SimpleNamespace(close=lambda: events.append(("closed", self.name)))

    target, drafter = Model("target"), Model("drafter")
    no_close = SimpleNamespace(new_session=lambda: events.append(("made", "torch")) or object())
    decoders = [SimpleNamespace(target=target, drafter=drafter),
                SimpleNamespace(target=target, drafter=None), SimpleNamespace(target=no_close, drafter=None)]
    workers.make_caches(decoders)
    assert events == [("made", "target"), ("made", "drafter"), ("made", "target"), ("made", "torch"),
                      ("closed", "target"), ("closed", "drafter"), ("closed", "target")]


@pytest.mark.parametrize("exact", ["auto", True])
def test_exact_auto_is_decided_on_the_batch_that_will_run(monkeypatch, exact):
    """``--max-batch auto`` loads the target for the most rows it may take (16), then resolves
    to the batch its curve pays for: exact auto is decided on that one (issue 61: it was
    decided on 16 rows, where a llama.cpp target is always off), an explicit choice as given."""
    from types import SimpleNamespace

    import anydraft.decoder
    from anydraft.server import workers

    made, chosen = [], []

    class Loaded:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.target = SimpleNamespace(name="t", exact=kwargs["exact"] is True)
            self.drafter = None

        def choose_exact(self, spec, rows, progress=None):
            chosen.append(rows)

    monkeypatch.setattr(anydraft.decoder, "Decoder", Loaded)
    monkeypatch.setattr("anydraft.options.decoder_options", lambda a: {"exact": exact})
    monkeypatch.setattr(workers, "choose_max_batch", lambda decoder, args: 1)
    args = SimpleNamespace(max_batch="auto", max_concurrency=1, target="t", stats=None)
    decoders, max_batch = workers.build_decoders(args)
    assert max_batch == 1 and made[0]["rows"] == SETTINGS.max_auto_batch
    if exact == "auto":
        assert made[0]["exact"] is False and chosen == [1]
    else:
        assert made[0]["exact"] is True and chosen == []
