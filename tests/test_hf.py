"""`anydraft.hf.generate` as transformers' `custom_generate`: the same output as the model's own
`generate` (greedy token for token, sampling in exact distribution), in batches of rows of
different lengths, with transformers' stopping rules, streamer and output types."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

import anydraft.hf
from anydraft import AnydraftError, DraftConfig
from tests.helpers import byte_tokenizer, tiny_llama
from tests.methods.toys import Enumerator

PROMPTS = ["hello world", "the", "def f(x):\n    return", "speculative decoding is lossless and"]


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def target(tok):
    return tiny_llama(len(tok))


@pytest.fixture(scope="module")
def drafter(tok):
    return tiny_llama(len(tok), seed=1)


def batch(tok, prompts=PROMPTS):
    return tok(prompts, return_tensors="pt", padding=True, padding_side="left")


def ours(model, inputs, **kw):
    return model.generate(**inputs, custom_generate=anydraft.hf.generate, **kw)


@pytest.mark.parametrize("method", [None, "slem", "tli", "ar"])
def test_greedy_batch_of_four_is_plain_generate(tok, target, drafter, method):
    inputs = batch(tok)
    assert len(set(inputs["attention_mask"].sum(1).tolist())) == 4  # four lengths, left-padded
    want = target.generate(**inputs, max_new_tokens=16, do_sample=False)
    got = ours(target, inputs, assistant_model=drafter, tokenizer=tok, assistant_tokenizer=tok,
               max_new_tokens=16, do_sample=False, method=method,
               draft=DraftConfig(num_draft_tokens=3, adaptive=False))
    assert torch.equal(got, want)


def test_the_drafter_is_used_and_learned_from_across_calls(tok, target, drafter):
    """The call's assistant_model reaches anydraft (transformers 5 keeps it from a callable),
    and one `Decoder` per pair lasts from call to call."""
    inputs = batch(tok, PROMPTS[:1])
    for _ in range(2):
        ours(target, inputs, assistant_model=drafter, tokenizer=tok, max_new_tokens=8,
             do_sample=False, draft=DraftConfig(adaptive=False))
    (decoder,) = [d for d in target._anydraft_decoders.values() if d.drafter is not None
                  and d.draft == DraftConfig(adaptive=False)]
    assert decoder.drafter.model is drafter


def test_no_drafter_single_row_and_return_dict(tok, target):
    inputs = batch(tok, PROMPTS[2:3])
    want = target.generate(**inputs, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    got = ours(target, inputs, tokenizer=tok, max_new_tokens=12, do_sample=False,
               return_dict_in_generate=True)
    assert type(got) is type(want) and torch.equal(got.sequences, want.sequences)


def test_eos_ends_a_row_and_pads_it_as_transformers_does(tok, target, drafter):
    inputs = batch(tok)
    plain = target.generate(**inputs, max_new_tokens=12, do_sample=False)
    eos = int(plain[0, inputs["input_ids"].shape[1] + 3])  # row 0's fourth new token
    want = target.generate(**inputs, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                           pad_token_id=7)
    got = ours(target, inputs, assistant_model=drafter, tokenizer=tok, max_new_tokens=12,
               do_sample=False, eos_token_id=eos, pad_token_id=7)
    assert (want == 7).any() and torch.equal(got, want)


def test_stopping_criteria_and_stop_strings(tok, target, drafter):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AfterToken(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    inputs = batch(tok)
    plain = target.generate(**inputs, max_new_tokens=12, do_sample=False)
    token = int(plain[1, -6])
    text = tok.decode(plain[2, -5:-3])
    for extra in [dict(stopping_criteria=StoppingCriteriaList([AfterToken(token)])),
                  dict(stop_strings=[text])]:
        want = target.generate(**inputs, max_new_tokens=12, do_sample=False, tokenizer=tok, **extra)
        got = ours(target, inputs, assistant_model=drafter, tokenizer=tok, max_new_tokens=12,
                   do_sample=False, draft=DraftConfig(num_draft_tokens=4, adaptive=False), **extra)
        assert want.shape[1] < plain.shape[1] or (want != plain).any(), extra  # it did stop
        assert torch.equal(got, want), extra


class Recorder:
    """A streamer (transformers' BaseStreamer protocol) that keeps every put."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["1 row", "4 rows"])
def test_streamer_sees_what_plain_generate_streams(tok, target, drafter, prompts):
    inputs = batch(tok, prompts)
    want, got = Recorder(), Recorder()
    target.generate(**inputs, max_new_tokens=10, do_sample=False, streamer=want)
    ours(target, inputs, assistant_model=drafter, tokenizer=tok, max_new_tokens=10,
         do_sample=False, streamer=got)
    assert got.puts == want.puts and got.ended == want.ended == 1


def test_text_streamer(tok, target, drafter, capsys):
    from transformers import TextStreamer

    inputs = batch(tok, PROMPTS[:1])
    out = ours(target, inputs, assistant_model=drafter, tokenizer=tok, max_new_tokens=10,
               do_sample=False, streamer=TextStreamer(tok, skip_prompt=True))
    new = out[0, inputs["input_ids"].shape[1]:]
    assert capsys.readouterr().out == tok.decode(new) + "\n"


def test_seeded_sampling_repeats(tok, target, drafter):
    inputs = batch(tok)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(ours(target, inputs, assistant_model=drafter, tokenizer=tok,
                         max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20))
    assert torch.equal(*runs)


def test_processors_map_to_sampling_params():
    from transformers import GenerationConfig
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    sample = GenerationConfig(do_sample=True)
    got = anydraft.hf.sampling_params([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5),
                                       TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)], sample)
    assert (got.temperature, got.top_k, got.top_p, got.min_p) == (0.7, 5, 0.9, 0.05)
    assert anydraft.hf.sampling_params([TopKLogitsWarper(50)], sample).temperature == 1.0
    with pytest.raises(AnydraftError, match="TemperatureLogitsWarper comes after TopPLogitsWarper"):
        anydraft.hf.sampling_params([TopPLogitsWarper(0.9), TemperatureLogitsWarper(0.7)], sample)
    with pytest.raises(AnydraftError, match="TopKLogitsWarper is not supported"):
        anydraft.hf.sampling_params([TopKLogitsWarper(5, min_tokens_to_keep=2)], sample)
    assert anydraft.hf.sampling_params([TopKLogitsWarper(5)], GenerationConfig()).greedy


@pytest.mark.parametrize("settings, message", [
    (dict(do_sample=True, repetition_penalty=1.3), "RepetitionPenaltyLogitsProcessor"),
    (dict(do_sample=False, no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
    (dict(num_beams=2), "num_beams=2"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
])
def test_what_anydraft_cannot_do_exactly_is_refused_by_name(tok, target, settings, message):
    with pytest.raises(AnydraftError, match=message):
        ours(target, batch(tok), tokenizer=tok, max_new_tokens=4, **settings)


def test_right_padding_and_a_missing_tokenizer_are_refused(tok, target):
    right = tok(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(AnydraftError, match="padding_side='left'"):
        ours(target, right, tokenizer=tok, max_new_tokens=4, do_sample=False)
    with pytest.raises(AnydraftError, match="pass tokenizer="):
        ours(target, batch(tok), max_new_tokens=4, do_sample=False)


def test_other_custom_generate_callables_get_what_transformers_hands_them(tok, target):
    seen = {}

    def loop(model, input_ids, logits_processor, stopping_criteria, generation_config,
             tokenizer=None, **model_kwargs):
        seen.update(tokenizer=tokenizer, extra=set(model_kwargs) - anydraft.hf.PREPARED)
        return input_ids

    target.generate(**batch(tok), custom_generate=loop, tokenizer=tok, max_new_tokens=2)
    assert seen == {"tokenizer": None, "extra": set()}  # transformers 5's own behaviour


# -- sampling: the exact distribution, by enumerating every random path ------------------------
SAMPLING = dict(do_sample=True, temperature=0.7, top_k=3)
MAX_NEW = 2


@pytest.fixture(scope="module")
def cross_pair():
    """Tiny llamas over the toy tokenizers of tests/methods/toys.py: two vocabularies, each
    spelling some strings in two ways. (target, its tokenizer, drafter, its tokenizer)"""
    from tests.methods.toys import (
        DRAFTER_MERGES,
        DRAFTER_VOCAB,
        TARGET_MERGES,
        TARGET_VOCAB,
        toy_tokenizer,
    )

    target_tok = toy_tokenizer(TARGET_VOCAB, TARGET_MERGES)
    drafter_tok = toy_tokenizer(DRAFTER_VOCAB, DRAFTER_MERGES)
    return (tiny_llama(len(TARGET_VOCAB)), target_tok, tiny_llama(len(DRAFTER_VOCAB), seed=1),
            drafter_tok)


def plain_distribution(model, prompt: list[int], processors, eos: int) -> dict:
    """What transformers' own sampling gives: its processors over the model's logits, by
    recursion over every sequence of MAX_NEW tokens (or fewer, ending in ``eos``)."""
    dist = {}

    def walk(seq, prob):
        if len(seq) == MAX_NEW or (seq and seq[-1] == eos):
            dist[tuple(seq)] = prob
            return
        ids = torch.tensor([prompt + seq])
        logits = model(ids).logits[:, -1].float()
        probs = torch.softmax(processors(ids, logits), dim=-1)[0]
        for t in torch.nonzero(probs).flatten().tolist():
            walk(seq + [t], prob * float(probs[t]))

    walk([], 1.0)
    return dist


@pytest.mark.parametrize("pair, method", [("same", "sd"), ("same", "tli"), ("same", "slrs"),
                                          ("cross", "slem"), ("cross", "tli"), ("cross", "slrs")])
def test_sampling_is_exactly_distributed(tok, target, drafter, cross_pair, pair, method,
                                         monkeypatch):
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    model, model_tok, assistant, assistant_tok = (
        (target, tok, drafter, tok) if pair == "same" else cross_pair)
    text = PROMPTS[0] if pair == "same" else "ab"
    inputs = model_tok([text], return_tensors="pt")
    prompt = inputs["input_ids"][0].tolist()
    eos = model_tok.eos_token_id
    with torch.no_grad():
        want = plain_distribution(model, prompt, LogitsProcessorList(
            [TemperatureLogitsWarper(SAMPLING["temperature"]), TopKLogitsWarper(SAMPLING["top_k"])]),
            eos)
    got, todo, paths = defaultdict(float), [[]], 0
    while todo:
        generator = Enumerator(todo.pop())
        monkeypatch.setattr(anydraft.hf, "row_generator", lambda g=generator: g)
        out = ours(model, inputs, assistant_model=assistant, tokenizer=model_tok,
                   assistant_tokenizer=assistant_tok, max_new_tokens=MAX_NEW, method=method,
                   eos_token_id=eos, pad_token_id=eos,
                   draft=DraftConfig(num_draft_tokens=2, adaptive=False), **SAMPLING)
        new = out[0, len(prompt):].tolist()
        got[tuple(new[: new.index(eos) + 1] if eos in new else new)] += generator.prob
        todo.extend(generator.alternatives)
        paths += 1
    assert paths > len(want) > 1
    assert abs(sum(got.values()) - 1) < 1e-6  # float32 probabilities
    for seq in set(got) | set(want):  # float32 logits, scored in other groupings: 1e-5
        assert got.get(seq, 0.0) == pytest.approx(want.get(seq, 0.0), abs=1e-5), seq


def test_greedy_across_vocabularies(cross_pair):
    model, model_tok, assistant, assistant_tok = cross_pair
    inputs = model_tok(["ab"], return_tensors="pt")
    eos = model_tok.eos_token_id
    want = model.generate(**inputs, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                          pad_token_id=eos)
    for method in ("slem", "tli", "slrs"):
        got = ours(model, inputs, assistant_model=assistant, tokenizer=model_tok,
                   assistant_tokenizer=assistant_tok, max_new_tokens=12, do_sample=False,
                   eos_token_id=eos, pad_token_id=eos, method=method,
                   draft=DraftConfig(num_draft_tokens=3, adaptive=False))
        assert torch.equal(got, want), method


# -- real models -------------------------------------------------------------------------------
REAL_PROMPTS = ["def reverse(s):", "The capital of France is",
                "Write a short poem about the sea.\n\n", "1, 2, 3, 4,"]


@pytest.mark.real
@pytest.mark.parametrize("drafter_name", ["gemma3-270m", "smollm2-135m"])
def test_real_greedy_batch_is_plain_generate(real_model, drafter_name):
    from anydraft.models.loading import load_tokenizer

    target, tok = real_model("smollm2-135m"), load_tokenizer("smollm2-135m")
    drafter, drafter_tok = real_model(drafter_name, "bfloat16"), load_tokenizer(drafter_name)
    tok.padding_side = "left"
    inputs = tok(REAL_PROMPTS, return_tensors="pt", padding=True)
    want = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    got = ours(target, inputs, assistant_model=drafter, tokenizer=tok,
               assistant_tokenizer=drafter_tok, max_new_tokens=24, do_sample=False)
    assert torch.equal(got, want)
