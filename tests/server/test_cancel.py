"""A client that leaves frees its worker within a second: while its prompt is read (prefill
in chunks) and while decoding, even when the steps show no text."""

from __future__ import annotations

import time

import httpx

from anydraft.decoding.loop import PREFILL_CHUNK
from tests.server.conftest import MODEL_ID, chat_body

CHAT = "/v1/chat/completions"
FREE_WITHIN = 1.0  # seconds from the disconnect to an idle worker (the goal)
PER_TOKEN = 0.001  # prompt reading speed of the slowed session: a 256-token chunk in 0.25 s


def long_prompt(decoder, tokens: int) -> str:
    text = "hello " * tokens  # one token per word in the test tokenizer
    assert tokens <= len(decoder.target.tokenizer.encode(text)) < tokens + 50
    return text


def test_prefill_is_chunked_feeds_the_same_tokens_and_gives_the_same_text(make_decoder):
    plain, chunked = make_decoder(per_call=0.0), make_decoder(per_call=0.0)
    prompt = long_prompt(plain, 600)
    ref = plain.generate(prompt, max_new_tokens=8, chat=False)
    stream = chunked.stream(prompt, max_new_tokens=8, chat=False, cancel=lambda: None)
    out = "".join(stream)
    fed = chunked.sessions[0].fed
    assert max(len(ids) for ids in fed[:-1]) <= PREFILL_CHUNK < stream.prompt_tokens
    assert sum(fed, []) == sum(plain.sessions[0].fed, [])  # same tokens, same order
    assert out == ref.text and stream.output.token_ids == ref.token_ids
    assert stream.output.stats["prompt_tokens"] == ref.stats["prompt_tokens"]


def test_cancel_answer_becomes_the_finish_reason(make_decoder):
    dec = make_decoder(per_call=0.0)
    calls = []

    def cancel():
        calls.append(1)
        return "timeout" if len(calls) > 3 else None

    stream = dec.stream("hello world", max_new_tokens=50, cancel=cancel)
    list(stream)
    assert stream.output.finish_reason == "timeout" and len(stream.output.token_ids) < 50


def _disconnect_and_time(base: str, scheduler, body: dict, stream: bool, after: float) -> float:
    """Send ``body``, hang up ``after`` s into its generation; seconds from the hang-up until
    the scheduler is idle (watched in-process: HTTP polls would add their own latency)."""
    with httpx.Client(timeout=30) as http:
        if stream:
            with http.stream("POST", base + CHAT, json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()  # kept: a dropped line iterator closes the connection
                next(lines)  # the role chunk: the generation has started
                time.sleep(after - 0.1)
                assert scheduler.active == 1
        else:
            try:
                r = http.post(base + CHAT, json=body, timeout=after)
                raise AssertionError(f"the generation should still be running: {r.text[:300]}")
            except httpx.ReadTimeout:
                pass
    hung_up = time.monotonic()
    while scheduler.active or scheduler.waiting:
        assert time.monotonic() - hung_up < 30, "the worker never came free"
        time.sleep(0.005)
    return time.monotonic() - hung_up


def test_disconnect_during_prefill_frees_the_worker(make_decoder, serve):
    dec = make_decoder(per_token=PER_TOKEN)
    base = serve([dec])
    prompt = long_prompt(dec, 3500)  # 3.5 s of prefill or more, read in chunks
    for stream in (False, True):
        body = chat_body(prompt, max_tokens=4, stream=stream)
        scheduler = serve.apps[-1].state.server.scheduler
        assert _disconnect_and_time(base, scheduler, body, stream, after=0.8) < FREE_WITHIN
        assert 0 < sum(map(len, dec.sessions[-1].fed)) < 3000  # left while reading the prompt


def test_disconnect_during_steps_that_show_no_text_frees_the_worker(make_decoder, serve):
    special = 1  # <|im_start|>: a special token, not an EOS, that adds no text
    dec = make_decoder(per_call=0.05, force=special)
    base = serve([dec])
    for stream in (True, False):
        body = chat_body("hello", max_tokens=2000, stream=stream)  # 100 s of silent steps
        scheduler = serve.apps[-1].state.server.scheduler
        assert _disconnect_and_time(base, scheduler, body, stream, after=2.0) < FREE_WITHIN
        assert 2 < dec.sessions[-1].calls < 200  # it was decoding, and stopped long before the end
    # the server is still right afterwards (this session always answers the special token)
    r = httpx.post(base + CHAT, json={**chat_body("hi"), "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert r.json()["model"] == MODEL_ID


def test_chunked_prefill_keeps_speculative_output(decoder):
    """With a drafter (sd, drafts always offered), a cancellable stream gives the tokens that
    plain `generate` gives, on a prompt several chunks long."""
    import copy

    from anydraft import Decoder

    model, tok = decoder.target.model, decoder.target.tokenizer
    dec = Decoder(target=model, tokenizer=copy.deepcopy(tok), drafter=model,
                  drafter_tokenizer=copy.deepcopy(tok), method="sd", adaptive=False)
    prompt = "the quick brown fox jumps over the lazy dog " * 70  # > 2 chunks
    ref = dec.generate(prompt, max_new_tokens=24, chat=False)
    stream = dec.stream(prompt, max_new_tokens=24, chat=False, cancel=lambda: None)
    text = "".join(stream)
    assert stream.prompt_tokens > 2 * PREFILL_CHUNK
    assert stream.output.token_ids == ref.token_ids and text == ref.text
    assert stream.output.stats["drafted"] > 0 and stream.output.stats["drafts"] > 0


def test_drafter_reads_a_long_prompt_in_chunks_and_stops_on_cancel(decoder, monkeypatch):
    """The drafter's first read of the prompt (all of it: drafter_context 0) is chunked and
    cancellable like the target's: a cancel while it reads stops it within one chunk."""
    import copy

    from anydraft import Decoder
    from anydraft.models.session import HFSession

    model, tok = decoder.target.model, decoder.target.tokenizer
    dec = Decoder(target=model, tokenizer=copy.deepcopy(tok), drafter=model,
                  drafter_tokenizer=copy.deepcopy(tok), method="sd", adaptive=False,
                  drafter_context=0, prefix_cache_mb=0)  # each run reads the whole prompt
    fed = []  # (session, tokens) per feed call; the first session fed is the target's
    feed = HFSession.feed

    def spy(self, ids, rows=None):
        fed.append((self, len(ids)))
        return feed(self, ids, rows)

    monkeypatch.setattr(HFSession, "feed", spy)

    def drafter_feeds() -> list[int]:
        return [n for session, n in fed if session is not fed[0][0]]

    prompt = long_prompt(dec, 900)
    ref = dec.generate(prompt, max_new_tokens=8, chat=False)  # not cancellable: one read
    assert max(drafter_feeds()) > PREFILL_CHUNK
    fed.clear()
    stream = dec.stream(prompt, max_new_tokens=8, chat=False, cancel=lambda: None)
    assert "".join(stream) == ref.text and stream.output.token_ids == ref.token_ids
    assert max(drafter_feeds()) <= PREFILL_CHUNK < stream.prompt_tokens
    assert stream.output.stats["drafted"] > 0
    fed.clear()
    stream = dec.stream(prompt, max_new_tokens=8, chat=False,
                        cancel=lambda: "cancelled" if drafter_feeds() else None)
    list(stream)
    assert stream.output.finish_reason == "cancelled"
    assert drafter_feeds() == [PREFILL_CHUNK]  # one chunk read, then it stopped
