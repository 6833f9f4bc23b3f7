"""Issue 19: a soak test. 32 concurrent streaming clients for ANYDRAFT_SOAK_SECONDS (default
120) against a real server with a drafter (sd with a fixed k, reading whole prompts: the
chunked, cancellable prompt reads of target and drafter, rows batched), with random
disconnects, bad requests and poison requests (issue 42: temperatures so small that dividing by
them overflowed, failing the request and the others of its batch) mixed in. No response may
be 5xx, every completed answer must equal plain greedy decoding's (a tiny temperature's
too: its limit is greedy), the workers must be idle at the end and the server's memory stable.

`pytest -s` prints the figures; they are also attached to the report (``record_property``)."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

import httpx
import pytest

from tests.server.conftest import MODEL_ID, chat_body, scrape_total, wait_idle
from tests.server_process import Server

CLIENTS = 32
SECONDS = float(os.environ.get("ANYDRAFT_SOAK_SECONDS", "120"))
# memory: the baseline is the highest RSS seen in the warm-up (the allocator's pools and every
# request shape met once); the mean of the last 5 s may exceed it by a quarter. Allocator noise
# is ~1% here (423 -> 425 MB over 120 s); keeping every request's KV caches (target and
# drafter: ~160 KB a request on average here, ~2800 requests) would add hundreds of MB
WARMUP = min(20.0, SECONDS / 4)
RSS_GROWTH = 1.25
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
SEED = int(os.environ.get("ANYDRAFT_SOAK_SEED", "19"))
POISONS = (1e-38, 1e-46, 5e-324)  # temperatures whose division overflowed float32


@dataclass(frozen=True)
class Case:
    path: str
    prompt: str
    max_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float = 0.0

    def body(self) -> dict:
        body = {"model": MODEL_ID, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "stream": True}
        if self.stop:
            body["stop"] = list(self.stop)
        if self.path == CHAT:
            return {**body, "messages": [{"role": "user", "content": self.prompt}]}
        return {**body, "prompt": self.prompt}


CASES = [
    Case(CHAT, "hello there", 24),
    Case(COMPLETIONS, "the quick brown fox", 32),
    Case(CHAT, "def f(x):\n    return x + 1", 16),
    Case(COMPLETIONS, "speculative decoding is lossless", 40),
    Case(CHAT, "hello world, hello there " * 3, 20, stop=("o",)),
    Case(COMPLETIONS, "héllo wörld ✓ ünïcode", 16),
    Case(CHAT, "x", 8),
    Case(COMPLETIONS, "the lazy dog jumps", 24, stop=("the", "\n")),
    # several chunks of prompt for the target and the drafter (PREFILL_CHUNK = 256)
    Case(COMPLETIONS, "hello " * 600, 12),
    Case(CHAT, "the quick brown fox jumps over the lazy dog " * 40, 16),
]


def _bad_requests(base: str) -> list:
    """(name, callable returning the status) for requests the server must refuse with 4xx."""
    chat = base + CHAT

    def post(**kw):
        return lambda http: http.post(chat, **kw).status_code

    def json_post(body, path=CHAT):
        return lambda http: http.post(base + path, json=body).status_code

    return [
        ("malformed json", post(content=b'{"model": "tiny", "messages": [',
                                headers={"Content-Type": "application/json"})),
        ("empty body", post(content=b"", headers={"Content-Type": "application/json"})),
        ("text/plain", post(content=json.dumps(chat_body()).encode(),
                            headers={"Content-Type": "text/plain"})),
        ("messages not a list", json_post({**chat_body(), "messages": "hello"})),
        ("no messages", json_post({"model": MODEL_ID, "max_tokens": 4})),
        ("empty messages", json_post({**chat_body(), "messages": []})),
        ("unknown model", json_post({**chat_body(), "model": "no-such-model"})),
        ("negative temperature", json_post({**chat_body(), "temperature": -1})),
        ("temperature string", json_post({**chat_body(), "temperature": "hot"})),
        ("top_p 2", json_post({**chat_body(), "top_p": 2})),
        ("max_tokens 0", json_post({**chat_body(), "max_tokens": 0})),
        ("stop of ints", json_post({**chat_body(), "stop": [1, 2]})),
        ("n 17", json_post({**chat_body(), "n": 17, "stream": True})),
        ("stream_options without stream", json_post({**chat_body(),
                                                     "stream_options": {"include_usage": True}})),
        ("prompt beyond the context", json_post(
            {"model": MODEL_ID, "prompt": "word " * 5000, "max_tokens": 4}, COMPLETIONS)),
        ("batched prompts", json_post({"model": MODEL_ID, "prompt": ["a", "b"]}, COMPLETIONS)),
        ("body too large", post(content=b'{"model": "' + b"x" * (3 * 2**20) + b'"}',
                                headers={"Content-Type": "application/json"})),
        ("GET on chat", lambda http: http.get(chat).status_code),
        ("unknown path", lambda http: http.post(base + "/v1/nope", json={}).status_code),
    ]


def _upload_and_leave(port: int, rng: random.Random) -> None:
    """A client that announces a body and leaves halfway through sending it."""
    body = json.dumps(chat_body(stream=True)).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body[: rng.randrange(len(body))])
        time.sleep(rng.uniform(0, 0.2))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = Counter()
        self.failures: list[str] = []  # 5xx, wrong answers, errors where none may be
        self.drafted = 0

    def add(self, what: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[what] += 1
            if failure is not None:
                self.failures.append(failure)


def _stream(http, base: str, case: Case, leave_after: int | None, tally: Tally, ref: str) -> None:
    """One streaming request; ``leave_after``: hang up after that many data lines (None: read
    it all and compare with plain decoding's answer)."""
    chat = case.path == CHAT
    text, finish, lines = [], None, 0
    with http.stream("POST", base + case.path, json=case.body()) as r:
        if r.status_code >= 500:
            r.read()
            tally.add("5xx", f"{r.status_code} on {case}: {r.text[:300]}")
            return
        if r.status_code != 200:  # the queue holds every client: not even a 429
            r.read()
            tally.add("other", f"{r.status_code} on {case}: {r.text[:300]}")
            return
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            lines += 1
            if leave_after is not None and lines > leave_after:
                tally.add("disconnected")
                return  # leaving the block closes the connection mid-stream
            if line == "data: [DONE]":
                break
            payload = json.loads(line[6:])
            if "error" in payload:
                tally.add("stream error", f"error event on {case}: {payload}")
                return
            if not payload["choices"]:
                continue
            choice = payload["choices"][0]
            text.append((choice["delta"].get("content") or "") if chat else choice["text"])
            if choice["finish_reason"]:
                finish = choice["finish_reason"]
                with tally.lock:
                    tally.drafted += payload["anydraft"]["drafted"]
    if leave_after is not None:  # the answer ended before the client meant to leave
        tally.add("disconnected")
        return
    got = "".join(text)
    if finish is None or got != ref:
        tally.add("wrong", f"{case}: got {got!r} (finish {finish}), plain decoding {ref!r}")
    else:
        tally.add("completed")


def _client(i: int, server: Server, refs: dict, bad: list, stop_at: float, tally: Tally) -> None:
    rng = random.Random(SEED * 1000 + i)
    with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as http:
        while time.monotonic() < stop_at:
            roll = rng.random()
            try:
                if roll < 0.15:
                    name, send = rng.choice(bad)
                    status = send(http)
                    ok = 400 <= status < 500
                    tally.add("bad" if ok else ("5xx" if status >= 500 else "other"),
                              None if ok else f"{name}: {status}")
                elif roll < 0.20:
                    _upload_and_leave(server.port, rng)
                    tally.add("left mid-upload")
                elif roll < 0.25:  # gives up while queued or early in the answer
                    case = rng.choice(CASES)
                    try:
                        with httpx.Client(timeout=rng.uniform(0.01, 0.3)) as hasty:
                            _stream(hasty, server.base, case, None, tally, refs[case])
                    except httpx.TimeoutException:
                        tally.add("disconnected")
                elif roll < 0.32:  # poison: must come out as plain greedy decoding's answer
                    case = rng.choice(CASES)
                    poisoned = replace(case, temperature=rng.choice(POISONS))
                    _stream(http, server.base, poisoned, None, tally, refs[case])
                else:
                    case = rng.choice(CASES)
                    leave = rng.randrange(0, 6) if roll < 0.50 else None
                    _stream(http, server.base, case, leave, tally, refs[case])
            except httpx.HTTPError as exc:
                tally.add("transport error", f"{type(exc).__name__}: {exc}")


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _server_5xx(base: str) -> float:
    """5xx responses as the server's own metrics count them."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "anydraft_requests_total" and s.labels["status"].startswith("5"))


@pytest.mark.slow
def test_soak(model_dir, decoder, tmp_path, record_property):
    refs = {case: decoder.generate(case.prompt, max_new_tokens=case.max_tokens, temperature=0.0,
                                   chat=case.path == CHAT, stop=list(case.stop) or None).text
            for case in CASES}
    # one worker of 4 rows, so that poison requests meet others in batches (two workers of
    # batched rows sharing the weights fail target calls with shape errors: a bug of its own)
    server = Server(model_dir, tmp_path / "soak.log", "--max-concurrency", "1", "--max-batch", "4",
                    "--max-queue", "64", "--max-queued-per-client", "64",
                    "--drafter", str(model_dir), "--fixed-k", "--drafter-context", "0")
    try:
        server.wait_ready()
        tally, samples = Tally(), []  # (seconds into the soak, RSS MB)
        start = time.monotonic()
        stop_at = start + SECONDS
        threads = [threading.Thread(target=_client, daemon=True,
                                    args=(i, server, refs, _bad_requests(server.base), stop_at, tally))
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - start, _rss_mb(server.proc.pid)))
            time.sleep(1.0)
            assert time.monotonic() < stop_at + 180, "clients still running 3 min after the end"
        idle_after = wait_idle(server.base, timeout=10)
        active = scrape_total(server.base, "anydraft_active_generations")
        waiting = scrape_total(server.base, "anydraft_queue_waiting")
        server_5xx = _server_5xx(server.base)
        peak = _rss_mb(server.proc.pid, "VmHWM")
        assert server.alive()
    finally:
        server.stop()

    counts = tally.counts
    baseline = max(mb for t, mb in samples if t <= WARMUP)
    final = sum(mb for _, mb in samples[-5:]) / len(samples[-5:])  # the last 5 s
    figures = {
        "seconds": round(SECONDS), "clients": CLIENTS, "requests": sum(counts.values()),
        "completed": counts["completed"], "disconnects": counts["disconnected"],
        "left_mid_upload": counts["left mid-upload"], "bad_requests": counts["bad"],
        "5xx": counts["5xx"], "server_5xx": int(server_5xx), "wrong_answers": counts["wrong"],
        "drafted_tokens": tally.drafted, "rss_warmup_mb": round(baseline, 1),
        "rss_final_mb": round(final, 1), "max_rss_mb": round(peak, 1),
        "idle_after_s": round(idle_after, 2),
        "rss_mb_every_10s": [round(mb) for t, mb in samples[::10]],
    }
    print("\nsoak:", json.dumps(figures))
    for name, value in figures.items():
        record_property(f"soak_{name}", value)

    assert tally.failures == [], tally.failures[:10]
    assert counts["5xx"] == 0 and server_5xx == 0
    assert counts["completed"] > 0 and counts["disconnected"] > 0 and counts["bad"] > 0
    assert tally.drafted > 0  # the speculative path ran
    assert active == 0 and waiting == 0
    assert final <= RSS_GROWTH * baseline, figures
    log = server.log()
    assert "Traceback" not in log, log[-5000:]
