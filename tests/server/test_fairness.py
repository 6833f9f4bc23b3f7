"""One client cannot fill the waiting room, nor pose as many clients through X-Forwarded-For
unless the server was told to trust the proxy it came through. Two real HTTP clients each."""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from anydraft.server.gate import client_of
from anydraft.server.scheduler import fair_share
from tests.server.conftest import chat_body, wait_for

CHAT = "/v1/chat/completions"
BODY = chat_body("hello", max_tokens=3)  # 4 target calls: 2.4 s or more at 0.6 s a call


def _fill_then_try(base: str, scheduler, first: httpx.Client, second: httpx.Client,
                   first_headers: dict, second_headers: dict, posing_headers: dict):
    """``first`` takes the worker and its whole share of the queue (1 of 2 slots); then a third
    request of its own (posing as someone else) and one of ``second``'s."""
    def post(client, headers):
        return client.post(base + CHAT, json=BODY, headers=headers)

    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(post, first, first_headers)
        wait_for(lambda: scheduler.active == 1, what="the first request to run")
        queued = pool.submit(post, first, first_headers)
        wait_for(lambda: scheduler.waiting == 1, what="the second request to queue")
        refused = post(first, posing_headers)
        other = pool.submit(post, second, second_headers)
        results = [running.result(), queued.result(), other.result()]
    return refused, results


def test_one_client_cannot_fill_the_queue_nor_pose_as_another(make_decoder, serve):
    base = serve([make_decoder(per_call=0.6)], max_queue=2)  # a share of 1 per client
    a = httpx.Client(timeout=60)
    b = httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    with a, b:
        refused, results = _fill_then_try(base, serve.apps[-1].state.server.scheduler, a, b, {}, {},
                                          {"X-Forwarded-For": "203.0.113.7"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "client_queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    assert [r.status_code for r in results] == [200, 200, 200]  # b got the free slot


def test_trusted_proxy_forwards_client_addresses(make_decoder, serve):
    base = serve([make_decoder(per_call=0.6)], max_queue=2,
                 trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),))
    a, b = {"X-Forwarded-For": "203.0.113.1"}, {"X-Forwarded-For": "203.0.113.2"}
    with httpx.Client(timeout=60) as one, httpx.Client(timeout=60) as two:
        refused, results = _fill_then_try(base, serve.apps[-1].state.server.scheduler, one, two, a, b, a)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "client_queue_full"
    assert [r.status_code for r in results] == [200, 200, 200]


@pytest.mark.parametrize("peer,forwarded,client", [
    ("127.0.0.1", None, "127.0.0.1"),
    ("127.0.0.1", "203.0.113.5", "203.0.113.5"),
    ("127.0.0.1", "198.51.100.1, 203.0.113.5", "203.0.113.5"),  # the proxy appended the last
    ("127.0.0.1", "203.0.113.5, 10.0.0.2", "203.0.113.5"),  # 10.0.0.2: a proxy of ours too
    ("192.0.2.9", "203.0.113.5", "192.0.2.9"),  # not a trusted proxy: its header is ignored
])
def test_client_of_trusts_only_listed_proxies(peer, forwarded, client):
    trusted = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.0.0.0/8"))
    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
    scope = {"client": (peer, 1234), "headers": headers}
    assert client_of(scope, trusted) == client
    assert client_of(scope, ()) == peer


def test_fair_share_is_a_quarter_of_the_queue_and_at_least_one():
    assert [fair_share(n) for n in (0, 1, 2, 4, 64)] == [1, 1, 1, 1, 16]
