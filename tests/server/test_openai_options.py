"""OpenAI options clients use (issue 42): ``n`` completions of one prompt, ``logit_bias``,
through the official `openai` client against real server processes, streaming and not."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL_ID, chat_body

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def batched_client(batched_server):
    from openai import OpenAI

    with OpenAI(base_url=f"{batched_server.base}/v1", api_key="unused", max_retries=0,
                timeout=120) as c:
        yield c


def streamed(chunks) -> tuple[dict, dict, list]:
    """Per choice index: the text and the finish reasons of a stream; its chunks."""
    chunks = list(chunks)
    texts, reasons = {}, {}
    for c in chunks:
        for choice in c.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
            if choice.finish_reason:
                reasons.setdefault(choice.index, []).append(choice.finish_reason)
    return texts, reasons, chunks


# -- n -----------------------------------------------------------------------------------
def test_n_sampled_chat_completions_are_distinct_reproducible_streams(batched_client):
    """n=3 as rows of one batch (the batched server drafts with sd): each choice its own
    seeded stream, the first the request's own seed's, a repeat gives the same three."""
    kw = dict(model=MODEL_ID, messages=MESSAGES, temperature=1.0, seed=7, max_tokens=16)
    resp = batched_client.chat.completions.create(n=3, **kw)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    texts = [c.message.content for c in resp.choices]
    assert len(set(texts)) == 3, texts
    assert [c.message.content for c in batched_client.chat.completions.create(n=3, **kw).choices] == texts
    assert batched_client.chat.completions.create(**kw).choices[0].message.content == texts[0]
    one = batched_client.chat.completions.create(**kw).usage
    assert resp.usage.prompt_tokens == one.prompt_tokens  # the prompt counts once
    assert resp.usage.completion_tokens == sum(s["new_tokens"] for s in resp.model_extra["anydraft"]["choices"])
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens

    texts_streamed, reasons, chunks = streamed(batched_client.chat.completions.create(
        n=3, stream=True, stream_options={"include_usage": True}, **kw))
    assert texts_streamed == dict(enumerate(texts))
    assert sorted(reasons) == [0, 1, 2] and all(len(r) == 1 for r in reasons.values())
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.role) == [0, 1, 2]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_n_greedy_completions_are_each_plain_greedy(client, decoder):
    ref = decoder.generate("def f(x):", max_new_tokens=12, temperature=0.0, chat=False)
    kw = dict(model=MODEL_ID, prompt="def f(x):", temperature=0, max_tokens=12, n=2)
    resp = client.completions.create(**kw)
    assert [(c.index, c.text) for c in resp.choices] == [(0, ref.text), (1, ref.text)]
    assert resp.usage.completion_tokens == 2 * ref.stats["new_tokens"]
    texts, reasons, _ = streamed(client.completions.create(stream=True, **kw))
    assert texts == {0: ref.text, 1: ref.text} and sorted(reasons) == [0, 1]


def test_n_beyond_what_the_server_holds_is_a_400(server, small_server):
    r = httpx.post(server.base + "/v1/chat/completions", json=chat_body(n=17), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    # one worker, one row, one waiting place: two completions never fit
    r = httpx.post(small_server.base + "/v1/chat/completions", json=chat_body(n=2), timeout=30,
                   headers=small_server.headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and "at most 1" in err["message"]


# -- logit_bias --------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["plain", "drafting"])
def test_greedy_with_a_logit_bias_is_plain_greedy_with_it(which, client, batched_client, decoder):
    c = client if which == "plain" else batched_client
    plain = decoder.generate(MESSAGES, max_new_tokens=12, temperature=0.0)
    bias = {plain.token_ids[0]: -100.0, plain.token_ids[2]: -100.0}
    ref = decoder.generate(MESSAGES, max_new_tokens=12, temperature=0.0, logit_bias=bias)
    assert ref.text != plain.text
    body = dict(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=12,
                logit_bias={str(t): b for t, b in bias.items()})
    assert c.chat.completions.create(**body).choices[0].message.content == ref.text
    texts, _, _ = streamed(c.chat.completions.create(stream=True, **body))
    assert texts == {0: ref.text}


@pytest.mark.parametrize("bias, fix", [
    ({"abc": 1}, "decimal strings"), ({"1": 101}, "[-100, 100]"), ({"1": "1"}, None),
    ({"99999999": 1}, "use ids of its tokenizer"), ({"-1": 1}, "decimal strings"),
])
def test_a_bad_logit_bias_is_a_400_naming_it(server, bias, fix):
    r = httpx.post(server.base + "/v1/chat/completions", json=chat_body(logit_bias=bias), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" or err["param"].startswith("logit_bias"), err
    assert fix is None or fix in err["message"], err


# -- logprobs ------------------------------------------------------------------------------
def test_chat_logprobs_are_plain_decodings(client, decoder):
    """Greedy: the model's own log-probabilities (with the bias), as plain decoding reports them."""
    ref = decoder.generate(MESSAGES, max_new_tokens=12, temperature=0.0, logprobs=3, method="ar")
    kw = dict(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=12, logprobs=True,
              top_logprobs=3)
    resp = client.chat.completions.create(**kw)
    content = resp.choices[0].logprobs.content
    assert len(content) == len(ref.token_ids) == resp.usage.completion_tokens
    table = decoder.table
    for got, want in zip(content, ref.logprobs, strict=True):
        assert bytes(got.bytes) == table.token_bytes[want.token]
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
        assert [bytes(t.bytes) for t in got.top_logprobs] == [table.token_bytes[t] for t, _ in want.top]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([v for _, v in want.top], abs=1e-5)
    _, _, chunks = streamed(client.chat.completions.create(stream=True, **kw))
    streamed_content = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [e.token for e in streamed_content] == [e.token for e in content]
    assert [e.logprob for e in streamed_content] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=4)
    assert plain.choices[0].logprobs is None  # not asked: none


def test_sampled_completion_logprobs_of_n_choices_streamed_and_not(batched_client):
    """On the drafting, batching server: each choice's tokens with their log-probabilities
    (drafted ones from the verifying call), the same streamed as not."""
    kw = dict(model=MODEL_ID, prompt="hello world", temperature=0.8, top_k=20, seed=3,
              max_tokens=16, n=2, logprobs=2, extra_body={"top_k": 20})
    kw.pop("top_k")
    resp = batched_client.completions.create(**kw)
    stats = resp.model_extra["anydraft"]["choices"]
    assert sum(s["accepted"] for s in stats) > 0  # drafted tokens were reported
    for choice, s in zip(resp.choices, stats, strict=True):
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == s["new_tokens"]
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert value <= 0 and 1 <= len(top) <= 2
            if token in top and "\ufffd" not in token:  # a part of a character: not one key
                assert top[token] == pytest.approx(value, abs=1e-6)
    chunks = list(batched_client.completions.create(stream=True, **kw))
    for index, choice in enumerate(resp.choices):
        got = [v for c in chunks for ch in c.choices if ch.index == index and ch.logprobs
               for v in ch.logprobs.token_logprobs]
        assert got == pytest.approx(choice.logprobs.token_logprobs, abs=1e-5)


@pytest.mark.parametrize("body", [dict(top_logprobs=2), dict(logprobs=True, top_logprobs=21),
                                  dict(logprobs=True, top_logprobs=-1), dict(logprobs=3)])
def test_bad_chat_logprobs_are_400s(server, body):
    r = httpx.post(server.base + "/v1/chat/completions", json=chat_body(**body), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in ("logprobs", "top_logprobs")


def test_completion_logprobs_above_5_are_a_400(server):
    r = httpx.post(server.base + "/v1/completions", timeout=30,
                   json={"model": MODEL_ID, "prompt": "a", "logprobs": 6})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
