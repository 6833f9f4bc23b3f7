"""Log-probabilities as OpenAI writes them (anydraft/server/logprobs.py), spelt on the event loop
without a tokenizer that a worker uses."""

from __future__ import annotations

import threading

import httpx

from tests.server.conftest import chat_body


def test_the_event_loop_spells_special_tokens_without_a_workers_tokenizer(make_decoder, serve):
    """Issue 61: the event loop spelt a special token with worker 0's tokenizer while that
    worker decoded with it (a Hugging Face tokenizer is not thread-safe). Only the thread
    that builds the app (before the workers start) and the worker itself may call it."""
    dec = make_decoder()
    tokenizer, callers = dec.target.tokenizer, []
    spell = tokenizer.convert_ids_to_tokens

    def recorded(*args, **kwargs):
        callers.append(threading.current_thread().name)
        return spell(*args, **kwargs)

    tokenizer.convert_ids_to_tokens = recorded
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    base = serve([dec])
    body = chat_body(max_tokens=4, logprobs=True, top_logprobs=2, logit_bias={str(end): 100})
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    [entry] = r.json()["choices"][0]["logprobs"]["content"]  # the end of the turn, at once
    assert (entry["token"], entry["bytes"]) == ("<|im_end|>", list(b"<|im_end|>"))
    here = threading.current_thread().name
    assert callers and {name for name in callers if name != here} <= {"anydraft-worker-0"}, callers
