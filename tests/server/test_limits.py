"""Limits in time and size: --request-timeout, --max-prompt-tokens, the body-read timeout,
the connection caps and head timeout (connections.py), and the uvicorn options the CLI passes
(no proxy headers of its own)."""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import MODEL_ID, chat_body, wait_for
from tests.server.test_web_safety import _partial_upload

CHAT = "/v1/chat/completions"


def test_request_timeout_cuts_a_generation_short_with_length(make_decoder, serve):
    base = serve([make_decoder(per_call=0.2)], request_timeout=1.0)
    # 200 s untimed: the client's own 30 s timeout fails the test if the limit does not hold
    r = httpx.post(base + CHAT, json=chat_body(max_tokens=1000), timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["anydraft"]["finish_reason"] == "timeout"
    assert body["usage"]["completion_tokens"] < 1000
    with httpx.stream("POST", base + CHAT, json=chat_body(max_tokens=1000, stream=True),
                      timeout=30) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_request_timeout_while_queued_is_a_503(make_decoder, serve):
    # the first request's first target call takes 3 s: it holds the worker past the deadline of
    # a second that arrives within 2 s of it
    base = serve([make_decoder(per_call=3.0)], request_timeout=1.0)
    scheduler = serve.apps[-1].state.server.scheduler
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, base + CHAT, json=chat_body(max_tokens=100), timeout=30)
        wait_for(lambda: scheduler.active == 1, what="the first request to run")
        second = httpx.post(base + CHAT, json=chat_body(max_tokens=100), timeout=30)
        assert first.result().status_code == 200
    assert second.status_code == 503, second.text
    assert second.json()["error"]["code"] == "timeout" and second.headers["retry-after"]


def test_max_prompt_tokens(make_decoder, serve):
    base = serve([make_decoder()], max_prompt_tokens=40)
    r = httpx.post(base + CHAT, json=chat_body("hello " * 60), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "at most 40" in err["message"]
    r = httpx.post(base + "/v1/completions", json={"model": MODEL_ID, "prompt": "hello " * 60},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert httpx.post(base + CHAT, json=chat_body("hello", max_tokens=2), timeout=30).status_code == 200


def test_slow_upload_gets_408(make_decoder, serve):
    base = serve([make_decoder()], body_timeout=0.5)
    start = time.monotonic()
    answer = _partial_upload(base, wait=1.5)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request_timeout" in answer and time.monotonic() - start < 5


@pytest.fixture
def served(monkeypatch, make_decoder):
    """Run `anydraft serve ARGS` without loading anything or listening: what it would run."""
    from anydraft.server import shutdown, workers

    got = {}
    # `--max-batch auto` reads the target's cost curve (tests/server/test_batching.py)
    monkeypatch.setattr(workers, "build_decoders", lambda args: ([make_decoder()], 1))
    monkeypatch.setattr(shutdown, "run", lambda app, drain, **kw: got.update(app=app, **kw))

    def run(*args: str) -> dict:
        from anydraft.cli import main

        got.clear()
        assert main(["serve", "--target", "/models/secret/tiny-model", *args]) == 0
        return got
    return run


def test_cli_passes_limits_and_safety_options(served):
    got = served("--max-connections", "7", "--max-connections-per-client", "2", "--head-timeout",
                 "1.5", "--request-timeout", "30", "--max-prompt-tokens",
                 "100", "--body-timeout", "5", "--max-queued-per-client", "3",
                 "--trusted-proxies", "10.0.0.0/8,127.0.0.1", "--allowed-hosts", "API.example,[::1]",
                 "--cors-origins", "https://a.example", "--min-read", "4",
                 "--allow-special-in-content", "--shutdown-timeout", "7")
    connections = got["app"].state.server.connections
    assert (connections.max_total, connections.per_client, connections.head_timeout) == (7, 2, 1.5)
    assert got["http"].__name__ == "Bounded" and got["proxy_headers"] is False
    assert "limit_concurrency" not in got  # it would refuse /health too
    cfg = got["app"].state.server.config
    assert (cfg.request_timeout, cfg.max_prompt_tokens, cfg.body_timeout) == (30, 100, 5)
    assert got["app"].state.server.scheduler.max_per_client == 3
    assert cfg.min_read == got["app"].state.server.scheduler.min_read == 4
    assert cfg.trusted_proxies == (ipaddress.ip_network("10.0.0.0/8"),
                                   ipaddress.ip_network("127.0.0.1/32"))
    assert cfg.allowed_hosts == ("api.example", "::1") and cfg.cors_origins == ("https://a.example",)
    assert cfg.model_id == "tiny-model"  # a path is not shown to clients
    assert cfg.allow_special_in_content and cfg.shutdown_timeout == 7


def test_cli_defaults(served):
    got = served()
    cfg = got["app"].state.server.config
    assert cfg.allowed_hosts is None and cfg.cors_origins == () and cfg.trusted_proxies == ()
    assert cfg.request_timeout is None and got["proxy_headers"] is False
    assert not cfg.allow_special_in_content
    assert got["app"].state.server.scheduler.max_per_client == 16  # a quarter of --max-queue 64
    assert got["app"].state.server.connections.per_client == 64  # a quarter of --max-connections 256
    assert served("--host", "0.0.0.0")["app"].state.server.config.allowed_hosts == ("*",)


@pytest.mark.parametrize("flag,value", [("--max-connections", "0"), ("--request-timeout", "-1"),
                                        ("--max-connections-per-client", "0"),
                                        ("--head-timeout", "0"), ("--shutdown-timeout", "-1"),
                                        ("--body-timeout", "0"), ("--max-prompt-tokens", "0"),
                                        ("--max-queued-per-client", "0"), ("--min-read", "0"),
                                        ("--trusted-proxies", "not-an-ip")])
def test_cli_rejects_bad_limits(flag, value, capsys):
    from anydraft.cli import main

    assert main(["serve", "--target", "/no/such/model", flag, value]) == 2
    assert flag in capsys.readouterr().err


def _idle(base: str, source: str, send: bytes = b"") -> socket.socket:
    """A connection to ``base`` from the loopback address ``source`` that sends ``send`` only."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    if send:
        sock.sendall(send)
    return sock


def _answer(sock) -> bytes:
    """What the server sends before it closes ``sock``."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_idle_connections_cannot_lock_others_out(make_decoder, serve):
    """Issue 42: 32 connections that sent nothing (or a head one byte at a time) against
    --max-connections 32 had every other client, /health included, get 503 for a minute."""
    from anydraft.server.app import create_app
    from anydraft.server.config import ServerConfig
    from tests.server.conftest import serve_in_thread

    app = create_app([make_decoder()], ServerConfig(model_id=MODEL_ID, max_connections=8,
                                                    max_connections_per_client=4, head_timeout=1.0))
    with serve_in_thread(app, http=app.state.server.connections.protocol()) as base:
        start = time.monotonic()
        idle = [_idle(base, f"127.0.0.{n}") for n in (3, 4) for _ in range(4)]
        slow = _idle(base, "127.0.0.5", b"GET /health HTTP/1.1\r\nHo")  # a head, byte by byte
        # one address holds at most 4: the 5th is refused at once
        assert _answer(_idle(base, "127.0.0.3")).startswith(b"HTTP/1.1 503"), "per-client cap"
        wait_for(lambda: app.state.server.connections.total == 9, what="the idle connections")
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10)
        # past the total cap: /health answers, the API says so with 503
        assert other.get(base + "/health").status_code == 200
        r = other.post(base + CHAT, json=chat_body(max_tokens=2))
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        for _ in range(3):
            slow.sendall(b"s")
            time.sleep(0.2)
        # a head not complete within --head-timeout: 408, and the connection is closed
        for sock in [*idle, slow]:
            assert _answer(sock).startswith(b"HTTP/1.1 408"), "head timeout"
        assert time.monotonic() - start < 5
        wait_for(lambda: app.state.server.connections.total <= 1, what="the idle connections to close")
        assert other.post(base + CHAT, json=chat_body(max_tokens=2)).status_code == 200
        # a kept-alive connection that starts no new request is timed out too
        kept = _idle(base, "127.0.0.6", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = _answer(kept)
        assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in answer
        other.close()
