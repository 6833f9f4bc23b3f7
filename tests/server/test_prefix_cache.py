"""The prefix cache through the server (issue 57, docs/prefix-cache.md): a conversation's next
turn reads only its new tokens, on a worker's batch rows and on its own sessions, says so in
OpenAI's usage field and in the metrics, and answers as a cold request does (float32 torch)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.server.conftest import chat_body


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.base + "/metrics", headers=srv.headers).text
    return float(re.search(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M).group(1))


@pytest.mark.parametrize("which", ["batched_server", "small_server"])
def test_the_next_turn_reads_only_its_new_tokens(which, request, decoder):
    srv = request.getfixturevalue(which)  # rows of a batch of 4; sessions of its own
    first = chat_body("tell me a long story about a fox who " + "ran and " * 40, max_tokens=8)
    hits = _metric(srv, "anydraft_prefix_cache_hits_total")
    a = httpx.post(srv.base + "/v1/chat/completions", json=first, headers=srv.headers, timeout=120).json()
    messages = [*first["messages"], {"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                {"role": "user", "content": "and then?"}]
    for stream in (False, True):
        body = {**first, "messages": messages, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
            with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, headers=srv.headers,
                              timeout=120) as r:
                chunks = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
            usage = httpx.Response(200, content=chunks[-1]).json()["usage"]
        else:
            usage = httpx.post(srv.base + "/v1/chat/completions", json=body, headers=srv.headers,
                               timeout=120).json()["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        # the first turn's prompt at least (its answer too, re-tokenized alike or not)
        assert a["usage"]["prompt_tokens"] <= cached < usage["prompt_tokens"], (a["usage"], usage)
    assert _metric(srv, "anydraft_prefix_cache_hits_total") >= hits + 2 * a["usage"]["prompt_tokens"]
    assert _metric(srv, "vllm:prefix_cache_hits_total") >= 2 * a["usage"]["prompt_tokens"]
    # the same request cold, in-process, without a cache: the same greedy answer
    from anydraft import Decoder

    cold = Decoder(target=decoder.target.model, tokenizer=decoder.target.tokenizer, dtype="float32",
                   prefix_cache_mb=0)
    want = cold.generate(messages, 8, temperature=0.0)
    got = httpx.post(srv.base + "/v1/chat/completions", json={**first, "messages": messages},
                     headers=srv.headers, timeout=120).json()
    assert got["choices"][0]["message"]["content"] == want.text
