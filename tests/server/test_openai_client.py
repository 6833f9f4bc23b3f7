"""The official `openai` client against a real server process."""

from __future__ import annotations

import pytest

from tests.server.conftest import MODEL_ID

MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "the quick brown fox"}]


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]


def test_chat_completion_greedy_equals_decoder(client, decoder):
    resp = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=0,
                                          max_tokens=24)
    ref = decoder.generate(MESSAGES, max_new_tokens=24, temperature=0.0, chat=True)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.text
    assert choice.finish_reason == {"eos": "stop", "stop": "stop"}.get(ref.finish_reason, "length")
    assert resp.usage.prompt_tokens == len(decoder.prompt_ids(MESSAGES, chat=True))
    assert resp.usage.completion_tokens == ref.stats["new_tokens"]
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    stats = resp.model_extra["anydraft"]
    assert stats["new_tokens"] == ref.stats["new_tokens"]
    assert stats["method"] == "lookup" and stats["target_calls"] >= 1  # auto without a drafter


def test_completion_greedy_equals_decoder(client, decoder):
    resp = client.completions.create(model=MODEL_ID, prompt="def f(x):", temperature=0,
                                     max_tokens=16)
    ref = decoder.generate("def f(x):", max_new_tokens=16, temperature=0.0, chat=False)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == ref.text
    assert resp.usage.completion_tokens == ref.stats["new_tokens"]


def test_streaming_chat_equals_non_streaming(client):
    kw = dict(model=MODEL_ID, messages=MESSAGES, temperature=0.9, top_p=0.95, seed=1234,
              max_tokens=32)
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert len([c for c in chunks if c.choices]) > 2  # really streamed, not one blob


def test_streaming_completion_equals_non_streaming(client):
    kw = dict(model=MODEL_ID, prompt="hello world", temperature=0.7, seed=99, max_tokens=20)
    full = client.completions.create(**kw).choices[0].text
    text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert text == full


def test_same_seed_same_text_different_seed_may_differ(client):
    kw = dict(model=MODEL_ID, messages=MESSAGES, temperature=1.0, max_tokens=24)
    a = client.chat.completions.create(seed=5, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=5, **kw).choices[0].message.content
    assert a == b


def test_stop_string_is_honoured(client, decoder):
    ref = decoder.generate("the lazy dog", max_new_tokens=24, temperature=0.0, chat=False).text
    assert len(ref) > 4
    stop = ref[2:4]
    resp = client.completions.create(model=MODEL_ID, prompt="the lazy dog", temperature=0,
                                     max_tokens=24, stop=[stop])
    out = resp.choices[0].text
    assert stop not in out and ref.startswith(out)
    assert resp.choices[0].finish_reason == "stop"


def test_client_sees_openai_errors(client):
    import openai

    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=3)
    assert exc.value.param == "temperature"
