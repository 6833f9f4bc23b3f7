"""Queueing, cancellation and isolation under concurrent load, on real server processes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, MODEL_ID, chat_body

CHAT = "/v1/chat/completions"


def metric(server, name: str, **labels) -> float:
    text = httpx.get(server.base + "/metrics", headers=server.headers).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_idle(server, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        h = httpx.get(server.base + "/health", headers=server.headers).json()  # details: the key
        if h["active"] == 0 and h["waiting"] == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"server still busy after {timeout} s: {h}")


def _statuses(server) -> tuple[float, float]:
    return (metric(server, "anydraft_requests_total", endpoint=CHAT, status="200"),
            metric(server, "anydraft_requests_total", endpoint=CHAT, status="499"))


def _wait_recorded(server, before: tuple[float, float]) -> tuple[float, float]:
    deadline = time.monotonic() + 5
    while sum(_statuses(server)) == sum(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _statuses(server)


def test_disconnect_mid_stream_frees_the_worker(server, decoder):
    cancelled = metric(server, "anydraft_generations_total", finish_reason="cancelled")
    statuses = _statuses(server)
    body = chat_body("the quick brown fox", max_tokens=4000, stream=True)
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base + CHAT, json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert len(got) >= 3
    # the client is gone: the generation (4000 tokens, several seconds) must stop promptly
    wait_idle(server, timeout=2)
    assert metric(server, "anydraft_generations_total", finish_reason="cancelled") == cancelled + 1
    ok, gone = _wait_recorded(server, statuses)  # a stream its client left is a 499, not a 200
    assert (ok, gone) == (statuses[0], statuses[1] + 1)
    r = httpx.post(server.base + CHAT, json=chat_body("hello world", max_tokens=10), timeout=30)
    ref = decoder.generate("hello world", max_new_tokens=10, temperature=0.0)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ref.text


def test_disconnect_while_waiting_non_streaming(server):
    """A non-streaming client that gives up also frees its slot (4000 tokens of the tiny model
    take over a second: 1.2 s on a quiet Zen 5, so the client gives up well before that)."""
    cancelled = metric(server, "anydraft_generations_total", finish_reason="cancelled")
    statuses = _statuses(server)
    with httpx.Client(timeout=0.4) as http:
        try:
            http.post(server.base + CHAT, json=chat_body("abc", max_tokens=4000))
        except httpx.ReadTimeout:
            pass
    wait_idle(server, timeout=2)
    assert metric(server, "anydraft_generations_total", finish_reason="cancelled") == cancelled + 1
    assert _wait_recorded(server, statuses) == (statuses[0], statuses[1] + 1)


def test_sixteen_concurrent_requests_all_correct(server, decoder):
    prompts = [f"request {i}: the lazy dog" for i in range(16)]
    refs = [decoder.generate(p, max_new_tokens=12, temperature=0.0, chat=i % 2 == 0).text
            for i, p in enumerate(prompts)]

    def one(i: int) -> str:
        chat = i % 2 == 0
        path = CHAT if chat else "/v1/completions"
        body = {"model": MODEL_ID, "temperature": 0, "max_tokens": 12, "stream": i % 4 < 2}
        body.update({"messages": [{"role": "user", "content": prompts[i]}]} if chat
                    else {"prompt": prompts[i]})
        with httpx.Client(timeout=120) as http:
            if not body["stream"]:
                r = http.post(server.base + path, json=body)
                assert r.status_code == 200, r.text
                choice = r.json()["choices"][0]
                return choice["message"]["content"] if chat else choice["text"]
            import json

            text = []
            with http.stream("POST", server.base + path, json=body) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        choice = json.loads(line[6:])["choices"][0]
                        text.append((choice["delta"].get("content") or "") if chat else choice["text"])
            return "".join(text)

    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(one, range(16)))
    assert outs == refs


def test_queue_overflow_gives_429_with_retry_after(small_server):
    """One worker and one waiting slot: of 6 simultaneous long requests, the overflow gets 429."""
    barrier = threading.Barrier(6)
    body = chat_body("the quick brown fox", max_tokens=1000)

    def one(_):
        barrier.wait()
        r = httpx.post(small_server.base + CHAT, json=body, headers=small_server.headers, timeout=120)
        return r.status_code, r.headers.get("retry-after"), r.json()

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    codes = sorted(code for code, _, _ in results)
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
    assert codes.count(200) <= 2
    for code, retry_after, payload in results:
        if code == 429:
            assert retry_after is not None and int(retry_after) >= 1
            assert payload["error"]["type"] == "rate_limit_error"
            # one client here: its share (1) and the whole queue (1) fill together
            assert payload["error"]["code"] in ("queue_full", "client_queue_full")
        else:
            assert payload["choices"][0]["message"]["content"]
    assert metric(small_server, "anydraft_errors_total", type="rate_limit_error") >= 1
    wait_idle(small_server, timeout=30)
    r = httpx.post(small_server.base + CHAT, json=chat_body(max_tokens=4),
                   headers=small_server.headers, timeout=30)
    assert r.status_code == 200


def test_api_key_guards_everything_but_health(small_server):
    base = small_server.base
    # without the key /health says only that the server is up; its details need the key
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    detailed = httpx.get(base + "/health", headers=small_server.headers).json()
    assert detailed["status"] == "ok" and "cost_curve" in detailed and "target_path" in detailed
    # --exact auto (the default) says what it chose: the test cache measured no exact cost
    assert not detailed["exact"] and detailed["exact_auto"].startswith("exact auto: off (its cost on ")
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", CHAT),
                         ("POST", "/v1/completions"), ("GET", "/nope")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            r = httpx.request(method, base + path, headers=headers, json=chat_body())
            assert r.status_code == 401, (path, headers, r.status_code)
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(base + "/v1/models", headers=small_server.headers).status_code == 200


def test_openai_client_with_api_key_and_drafter_is_lossless(small_server, decoder):
    from openai import OpenAI

    with OpenAI(base_url=small_server.base + "/v1", api_key=API_KEY, max_retries=0) as client:
        resp = client.chat.completions.create(model=MODEL_ID, temperature=0, max_tokens=20,
                                              messages=[{"role": "user", "content": "def f(x):"}])
    ref = decoder.generate("def f(x):", max_new_tokens=20, temperature=0.0)
    assert resp.choices[0].message.content == ref.text
    stats = resp.model_extra["anydraft"]
    assert stats["method"] == "sd" and stats["drafted"] > 0
    assert stats["mean_accepted"] > 1  # several tokens per target call
