"""A corpus of bad requests: each gets a 4xx with an OpenAI error object, never a 5xx,
and the server keeps serving correct output afterwards."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import CONTEXT, MODEL_ID, chat_body

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def _json(path, body, method="POST"):
    return (method, path, {"content": json.dumps(body).encode(),
                           "headers": {"content-type": "application/json"}})


def _raw(path, data: bytes, method="POST"):
    return (method, path, {"content": data, "headers": {"content-type": "application/json"}})


def _chat(**changes):
    body = chat_body()
    for key, value in changes.items():
        if value is _DROP:
            body.pop(key)
        else:
            body[key] = value
    return _json(CHAT, body)


_DROP = object()
USER = {"role": "user", "content": "hi"}

# (name, expected status, request)
CORPUS = [
    # -- transport: encoding, JSON, size
    ("invalid utf-8", 400, _raw(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}')),
    ("truncated utf-8", 400, _raw(CHAT, '{"model": "tiny", "x": "é'.encode()[:-1])),
    ("invalid json", 400, _raw(CHAT, b'{"model": "tiny", "messages": [')),
    ("empty body", 400, _raw(CHAT, b"")),
    ("json array body", 400, _raw(CHAT, b"[1, 2, 3]")),
    ("json string body", 400, _raw(CHAT, b'"hello"')),
    ("NaN literal", 400, _raw(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}')),
    ("infinite float", 400, _raw(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}')),
    ("huge integer literal", 400, _raw(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}")),
    ("deeply nested json", 400, _raw(CHAT, b"[" * 200_000 + b"]" * 200_000)),
    ("lone surrogate", 400, _raw(CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}')),
    ("text/plain body", 415, (("POST", CHAT, {"content": json.dumps(chat_body()).encode(),
                                                "headers": {"content-type": "text/plain"}}))),
    ("form body", 415, (("POST", CHAT, {"data": {"model": MODEL_ID}}))),
    ("no content-type", 415, (("POST", CHAT, {"content": json.dumps(chat_body()).encode()}))),
    ("oversize body", 413, _raw(CHAT, b'{"model": "tiny", "pad": "' + b"x" * (3 * 2**20) + b'"}')),
    # -- shape and types
    ("missing messages", 400, _chat(messages=_DROP)),
    ("empty messages", 400, _chat(messages=[])),
    ("messages not a list", 400, _chat(messages="hi")),
    ("message not an object", 400, _chat(messages=["hi"])),
    ("unknown role", 400, _chat(messages=[{"role": "wizard", "content": "hi"}])),
    ("tool role without tool_call_id", 400, _chat(messages=[{"role": "tool", "content": "hi"}])),
    ("missing role", 400, _chat(messages=[{"content": "hi"}])),
    ("missing content", 400, _chat(messages=[{"role": "user"}])),
    ("null content", 400, _chat(messages=[{"role": "user", "content": None}])),
    ("content is a number", 400, _chat(messages=[{"role": "user", "content": 42}])),
    ("image content part", 400, _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
    ("missing model", 400, _chat(model=_DROP)),
    ("unknown model", 404, _chat(model="gpt-17")),
    ("model not a string", 400, _chat(model=7)),
    # -- numbers
    ("max_tokens as string", 400, _chat(max_tokens="12")),
    ("max_tokens bool", 400, _chat(max_tokens=True)),
    ("max_tokens float", 400, _chat(max_tokens=1.5)),
    ("negative max_tokens", 400, _chat(max_tokens=-1)),
    ("zero max_tokens", 400, _chat(max_tokens=0)),
    ("huge max_tokens", 400, _chat(max_tokens=10**12)),
    ("max_tokens beyond context", 400, _chat(max_tokens=CONTEXT + 1)),
    ("negative temperature", 400, _chat(temperature=-0.5)),
    ("temperature too high", 400, _chat(temperature=2.5)),
    ("temperature as string", 400, _chat(temperature="hot")),
    ("top_p zero", 400, _chat(top_p=0)),
    ("top_p above one", 400, _chat(top_p=1.5)),
    ("negative seed", 400, _chat(seed=-3)),
    ("seed float", 400, _chat(seed=1.5)),
    ("seed beyond int64", 400, _chat(seed=2**64)),
    ("negative top_k", 400, _chat(top_k=-2)),  # -1 means off, as in vLLM
    ("min_p one", 400, _chat(min_p=1.0)),
    ("n above 16", 400, _chat(n=17)),
    ("n zero", 400, _chat(n=0)),
    ("stream not bool", 400, _chat(stream="yes")),
    ("stream_options without stream", 400, _chat(stream_options={"include_usage": True})),
    ("tool_choice auto", 400, _chat(tool_choice="auto")),
    ("null system content", 400, _chat(messages=[{"role": "system", "content": None}, USER])),
    ("stop wrong type", 400, _chat(stop=5)),
    ("too many stops", 400, _chat(stop=["a", "b", "c", "d", "e"])),
    ("empty stop string", 400, _chat(stop=[""])),
    ("presence penalty", 400, _chat(presence_penalty=1.0)),
    ("tools on a template without tools", 400, _chat(tools=[{"type": "function", "function": {"name": "f"}}])),
    ("tool without a name", 400, _chat(tools=[{"type": "function", "function": {"description": "f"}}])),
    ("tool with a bad schema", 400, _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "objectx"}}}])),
    ("tool_choice names no tool", 400, _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                             tool_choice={"type": "function", "function": {"name": "g"}})),
    ("top_logprobs without logprobs", 400, _chat(top_logprobs=2)),
    # -- prompts the model cannot take
    ("prompt longer than context", 400, _chat(messages=[{"role": "user", "content": "hello " * (CONTEXT + 50)}])),
    ("completion prompt too long", 400, _json(COMP, {"model": MODEL_ID, "prompt": "hello " * (CONTEXT + 50)})),
    ("completion empty prompt", 400, _json(COMP, {"model": MODEL_ID, "prompt": "   "})),
    ("completion token prompt", 400, _json(COMP, {"model": MODEL_ID, "prompt": [1, 2, 3]})),
    ("completion batch prompt", 400, _json(COMP, {"model": MODEL_ID, "prompt": ["a", "b"]})),
    ("completion missing prompt", 400, _json(COMP, {"model": MODEL_ID})),
    ("completion echo", 400, _json(COMP, {"model": MODEL_ID, "prompt": "a", "echo": True})),
    ("streamed too-long prompt", 400, _chat(stream=True, messages=[{"role": "user", "content": "hello " * (CONTEXT + 50)}])),
    # -- routing
    ("unknown path", 404, _json("/v1/engines", {})),
    ("wrong method", 405, ("GET", CHAT, {})),
]


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 25
    assert len({name for name, _, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("name,status,request_", CORPUS, ids=[c[0] for c in CORPUS])
def test_bad_request_gets_4xx_error_object(server, name, status, request_):
    method, path, kw = request_
    r = httpx.request(method, server.base + path, timeout=30, **kw)
    assert r.status_code == status, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"


def test_error_params_name_the_field(server):
    r = httpx.post(server.base + CHAT, json=chat_body(max_tokens=-1))
    assert r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(server.base + CHAT, json=chat_body(top_p=0))  # checked by SamplingParams
    assert r.json()["error"]["param"] == "top_p"
    r = httpx.post(server.base + CHAT, json=chat_body(messages=[{"role": "bot", "content": "x"}]))
    assert r.json()["error"]["param"] == "messages.0.role"
    r = httpx.post(server.base + CHAT, json=chat_body(content="hello " * (CONTEXT + 50)))
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_server_still_correct_after_the_corpus(server, decoder):
    for _, _, (method, path, kw) in CORPUS:  # the whole corpus once more, back to back
        assert httpx.request(method, server.base + path, timeout=30, **kw).status_code < 500
    r = httpx.post(server.base + CHAT, json=chat_body("speculative decoding", max_tokens=16),
                   timeout=30)
    assert r.status_code == 200
    ref = decoder.generate("speculative decoding", max_new_tokens=16, temperature=0.0)
    assert r.json()["choices"][0]["message"]["content"] == ref.text
    assert server.alive() and "Traceback" not in server.log()
