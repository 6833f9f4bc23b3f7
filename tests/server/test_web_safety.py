"""What a browser page or a broken client can do to a local server: Host names (DNS
rebinding), CORS, and a client that hangs up halfway through its upload."""

from __future__ import annotations

import logging
import socket
import time
from urllib.parse import urlparse

import httpx

from tests.server.conftest import chat_body, scrape_total, wait_for

CHAT = "/v1/chat/completions"


def test_only_loopback_host_names_by_default(make_decoder, serve):
    base = serve([make_decoder()])
    for host in ("evil.example", "evil.example:8000", "192.168.1.5", "127.0.0.1.evil.example"):
        for method, path in (("GET", "/v1/models"), ("POST", CHAT), ("GET", "/health")):
            r = httpx.request(method, base + path, headers={"Host": host}, json=chat_body())
            assert r.status_code == 400, (host, path, r.status_code)
            assert r.json()["error"]["code"] == "invalid_host"
    for host in ("localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.5:1", "[::1]:8000"):
        assert httpx.get(base + "/v1/models", headers={"Host": host}).status_code == 200, host
    assert scrape_total(base, "anydraft_errors_total", code="invalid_host") == 12


def test_allowed_hosts_replace_the_loopback_rule(make_decoder, serve):
    base = serve([make_decoder()], allowed_hosts=("api.example",))
    assert httpx.get(base + "/health", headers={"Host": "api.example:443"}).status_code == 200
    assert httpx.get(base + "/health", headers={"Host": "localhost"}).status_code == 400
    anyone = serve([make_decoder()], allowed_hosts=("*",))
    assert httpx.get(anyone + "/health", headers={"Host": "whatever.example"}).status_code == 200


PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_no_cors_unless_asked(make_decoder, serve):
    base = serve([make_decoder()])
    r = httpx.options(base + CHAT, headers=PREFLIGHT)
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(base + "/v1/models", headers={"Origin": "https://app.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_origins_are_allowed_and_only_they(make_decoder, serve):
    base = serve([make_decoder()], cors_origins=("https://app.example",), api_key="k")
    r = httpx.options(base + CHAT, headers=PREFLIGHT)  # a preflight carries no key
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = httpx.get(base + "/v1/models", headers={"Origin": "https://app.example",
                                                "Authorization": "Bearer k"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = httpx.get(base + "/v1/models", headers={"Origin": "https://evil.example",
                                                "Authorization": "Bearer k"})
    assert "access-control-allow-origin" not in r.headers


def _partial_upload(base: str, sent: bytes = b'{"model": "tiny", "messages": [', wait=0.3) -> bytes:
    """Announce a 100 kB JSON body, send a few bytes of it, wait ``wait`` s; what came back."""
    url = urlparse(base)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + sent)
        time.sleep(wait)
        s.setblocking(False)
        try:
            return s.recv(65536)
        except BlockingIOError:
            return b""


def test_client_leaving_mid_upload_is_a_499_and_one_log_line(make_decoder, serve, caplog):
    caplog.set_level(logging.INFO)
    base = serve([make_decoder()])
    _partial_upload(base)  # and hang up
    wait_for(lambda: scrape_total(base, "anydraft_requests_total", endpoint=CHAT) == 1,
             what="the request to be recorded")
    assert scrape_total(base, "anydraft_requests_total", endpoint=CHAT, status="499") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    gone = [r for r in caplog.records if "disconnected while sending" in r.getMessage()]
    assert len(gone) == 1 and "Traceback" not in caplog.text
    r = httpx.post(base + CHAT, json=chat_body(max_tokens=2), timeout=30)
    assert r.status_code == 200


def test_every_answer_says_nosniff(make_decoder, serve):
    """Issue 42: API answers lacked X-Content-Type-Options, so a browser could sniff one as HTML."""
    base = serve([make_decoder()], api_key="k")
    for r in (httpx.get(base + "/health"), httpx.get(base + "/v1/models"),
              httpx.get(base + "/v1/models", headers={"Authorization": "Bearer k"}),
              httpx.post(base + "/v1/completions", headers={"Authorization": "Bearer k"},
                         json={"model": "nope", "prompt": "<script>"})):
        assert r.headers["x-content-type-options"] == "nosniff", (r.request.url, r.status_code)
