"""Structured outputs through the server (issue 63): OpenAI's ``response_format`` (json_object,
json_schema) and the ``anydraft_grammar`` extension (regex, Lark), through the official `openai`
client against real server processes (the tiny random model: what it writes is noise, so only
the grammar makes it valid), streamed and not, beside a drafter and in a batch; bad formats are
400s naming the field, and the server serves on."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from tests.server.conftest import MODEL_ID, chat_body

SCHEMA = {"type": "object",
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tag": {"type": "string", "enum": ["red", "green"]}},
          "required": ["ok", "n", "tag"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "probe", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module", params=["main", "batched"])
def openai_client(request, server, batched_server):
    from openai import OpenAI

    srv = {"main": server, "batched": batched_server}[request.param]
    with OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_answer_always_validates(openai_client, stream):
    for seed in range(3):
        kwargs = dict(model=MODEL_ID, messages=[{"role": "user", "content": "the quick brown fox"}],
                      max_tokens=60, temperature=1.0, seed=seed, response_format=FORMAT)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           openai_client.chat.completions.create(stream=True, **kwargs) if c.choices)
        else:
            answer = openai_client.chat.completions.create(**kwargs)
            text = answer.choices[0].message.content
            assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_the_grammar_extension(server):
    ended = 0
    for seed in range(4):  # any object: a random model's string can outrun max_tokens
        choice = httpx.post(f"{server.base}/v1/chat/completions", timeout=120,
                            json=chat_body(max_tokens=80, temperature=1.0, seed=seed,
                                           response_format={"type": "json_object"})).json()["choices"][0]
        if choice["finish_reason"] == "stop":
            ended += 1
            assert isinstance(json.loads(choice["message"]["content"]), dict)
    assert ended
    for grammar, pattern in (({"regex": "(yes|no)!"}, "(yes|no)!"),
                             ({"lark": 'start: "ab" ("c" | "d")+'}, "ab[cd]+")):
        answer = httpx.post(f"{server.base}/v1/completions", timeout=120,
                            json={"model": MODEL_ID, "prompt": "x", "max_tokens": 12, "temperature": 1.0,
                                  "seed": 3, "anydraft_grammar": grammar}).json()
        text = answer["choices"][0]["text"]
        assert re.fullmatch(pattern, text) or answer["choices"][0]["finish_reason"] == "length", text


@pytest.mark.parametrize("body,field", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{no"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "cannot be compiled"),
    ({"anydraft_grammar": {"lark": "start: ("}}, "cannot be compiled"),
    ({"anydraft_grammar": {"ebnf": "x"}}, "anydraft_grammar"),
    ({"anydraft_grammar": {"regex": "a"}, "response_format": {"type": "json_object"}}, "not both"),
])
def test_a_bad_format_is_a_400_naming_it_and_the_server_serves_on(server, body, field):
    bad = httpx.post(f"{server.base}/v1/chat/completions", json=chat_body(**body), timeout=120)
    assert bad.status_code == 400, bad.text
    assert field in bad.json()["error"]["message"]
    good = httpx.post(f"{server.base}/v1/chat/completions", json=chat_body(), timeout=120)
    assert good.status_code == 200


def test_the_openai_clients_parse_with_a_pydantic_model(server):
    """docs/server.md's example: `client.chat.completions.parse` sends a strict schema made
    from a pydantic model and parses the answer into it."""
    from openai import OpenAI
    from pydantic import BaseModel

    class Probe(BaseModel):
        ok: bool
        n: int

    with OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        for seed in range(3):
            answer = client.chat.completions.parse(
                model=MODEL_ID, response_format=Probe, max_tokens=40, temperature=1.0, seed=seed,
                messages=[{"role": "user", "content": "the quick brown fox"}])
            if answer.choices[0].finish_reason == "stop":
                assert isinstance(answer.choices[0].message.parsed, Probe)
                return
    raise AssertionError("no answer ended within max_tokens")
