"""Requests that real OpenAI-compatible clients send, and what /v1/models shows them."""

from __future__ import annotations

import json

import httpx

from anydraft.server.workers import public_name
from tests.server.conftest import chat_body

CHAT = "/v1/chat/completions"


def test_fields_real_clients_send_are_accepted(server, decoder):
    ref = decoder.generate("hello there", max_new_tokens=12, temperature=0.0).text
    for extra in ({"stream": None}, {"tool_choice": "none"}, {"function_call": "none"},
                  {"tools": [], "tool_choice": "none"}, {"top_k": -1}, {"top_k": 0}):
        r = httpx.post(server.base + CHAT, json=chat_body(**extra), timeout=30)
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["choices"][0]["message"]["content"] == ref, extra


def test_assistant_turn_with_null_content(server):
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user", "content": "hello there"}]
    r = httpx.post(server.base + CHAT, json=chat_body(messages=messages), timeout=30)
    assert r.status_code == 200, r.text


def test_stream_options_need_stream(server):
    r = httpx.post(server.base + CHAT, json=chat_body(stream_options={"include_usage": True}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    r = httpx.post(server.base + CHAT, json=chat_body(stream=True,
                                                      stream_options={"include_usage": True}))
    assert r.status_code == 200 and '"usage"' in r.text


def test_head_health(server):
    r = httpx.head(server.base + "/health")
    assert r.status_code == 200 and r.content == b""


def test_models_show_no_filesystem_paths(server, model_dir):
    r = httpx.get(server.base + "/v1/models")
    text = json.dumps(r.json())
    assert str(model_dir) not in text and "/" not in json.dumps(r.json()["data"][0]["anydraft"])
    assert r.json()["data"][0]["anydraft"]["target"] == model_dir.name


def test_public_name():
    assert public_name("/home/me/models/qwen.gguf") == "qwen.gguf"
    assert public_name("./models/tiny/") == "tiny"
    assert public_name("~/m") == "m"
    assert public_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id stays
    assert public_name("smollm2-135m") == "smollm2-135m" and public_name(None) is None


def test_error_messages_show_no_filesystem_paths(server, model_dir):
    r = httpx.post(server.base + CHAT, json=chat_body("hello " * 5000), timeout=30)
    assert r.status_code == 400 and "context window" in r.json()["error"]["message"]
    assert str(model_dir) not in r.text and model_dir.name in r.text
