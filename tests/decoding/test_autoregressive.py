"""Plain decoding through the one loop equals transformers' own generate, token for token."""

import pytest
import torch

from anydraft import Decoder
from tests.helpers import byte_tokenizer, tiny_llama


def hf_greedy(model, ids, max_new_tokens, eos_ids):
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=sorted(eos_ids), pad_token_id=0)
    return out[0, len(ids):].tolist()


def tiny_decoder(**kw):
    tok = byte_tokenizer()
    return Decoder(target=tiny_llama(len(tok)), tokenizer=tok, **{"method": "ar", **kw})


@pytest.mark.parametrize("prompt", ["hello world", "def f(x):", "the quick brown fox"])
def test_tiny_greedy_equals_hf_generate(prompt):
    dec = tiny_decoder()
    ids = dec.prompt_ids(prompt, chat=True)
    out = dec.generate(prompt, max_new_tokens=40)
    expected = hf_greedy(dec.target.model, ids, 40, dec.eos_ids)
    assert out.token_ids == expected
    assert out.stats["new_tokens"] == len(expected)
    assert out.stats["target_calls"] == len(expected)


def test_stream_equals_generate_and_text_matches_tokens():
    dec = tiny_decoder()
    out = dec.generate("hello", max_new_tokens=30, temperature=0.9, seed=5, chat=False)
    streamed = "".join(dec.stream("hello", max_new_tokens=30, temperature=0.9, seed=5, chat=False))
    assert streamed == out.text
    tok = byte_tokenizer()
    assert out.text == tok.decode([t for t in out.token_ids if t not in dec.eos_ids])


def test_seeded_sampling_is_reproducible_and_seed_matters():
    dec = tiny_decoder()
    runs = [dec.generate("hello", max_new_tokens=20, temperature=1.0, seed=s, chat=False).token_ids
            for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_string_cuts_text_before_it():
    dec = tiny_decoder()
    full = dec.generate("hello", max_new_tokens=30, chat=False).text
    assert len(full) > 6
    stop = full[3:5]
    out = dec.generate("hello", max_new_tokens=30, chat=False, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == full[: full.find(stop)]
    streamed = "".join(dec.stream("hello", max_new_tokens=30, chat=False, stop=[stop]))
    assert streamed == out.text


@pytest.mark.real
@pytest.mark.parametrize("prompt", ["Write a Python function that reverses a string.",
                                    "What is the capital of France? Answer in one sentence."])
def test_smollm2_greedy_equals_hf_generate(real_model, prompt):
    from anydraft.models.loading import load_tokenizer

    model = real_model("smollm2-135m")
    dec = Decoder(target=model, tokenizer=load_tokenizer("smollm2-135m"), method="ar")
    ids = dec.prompt_ids(prompt)
    out = dec.generate(prompt, max_new_tokens=48)
    assert out.token_ids == hf_greedy(model, ids, 48, dec.eos_ids)
    assert len(out.token_ids) > 5
