"""Structured outputs on real models (issue 63): constrained greedy output of every method that
takes a grammar is token-identical to plain constrained greedy decoding (the target in float32,
as tests/methods/test_greedy_real.py), and every output parses and validates against its
schema (the jsonschema package). The exhaustive proof over a toy vocabulary is
tests/methods/test_exhaustive_grammar.py."""

import json

import jsonschema
import pytest

from anydraft import Decoder
from anydraft.constraints import Grammar
from anydraft.errors import AnydraftError
from anydraft.models.loading import load_tokenizer
from tests.methods.test_greedy_real import drafter_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "born": {"type": "integer"},
        "fields": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "born", "fields"],
    "additionalProperties": False,
}
PROMPTS = ["Describe Marie Curie as a JSON object.", "Give me Alan Turing's record in JSON."]
MAX_NEW = 64  # room for the whole object: an output cut short would not parse


@pytest.fixture(scope="module")
def decoder(real_model):
    target = "qwen2.5-coder-0.5b"
    return Decoder(target=real_model(target, "float32"), tokenizer=load_tokenizer(target),
                   drafter=drafter_model(real_model, "smollm2-135m", "llamacpp", "cpu"),
                   drafter_tokenizer=load_tokenizer("smollm2-135m"), adaptive=False)


@pytest.mark.real
@pytest.mark.slow
def test_every_method_gives_plain_constrained_greedy_output_that_validates(decoder):
    grammar = Grammar("json_schema", SCHEMA)
    accepted = forced = 0
    for prompt in PROMPTS:
        want = decoder.generate(prompt, MAX_NEW, method="ar", grammar=grammar)
        jsonschema.validate(json.loads(want.text), SCHEMA)
        assert want.stats["forced"] == 0  # plain decoding offers nothing
        if prompt == PROMPTS[0]:  # the grammar changes the output: the test can fail
            assert decoder.generate(prompt, MAX_NEW, method="ar").token_ids != want.token_ids
        for method in ("slem", "tli", "auto"):  # auto: slem with prompt lookup
            out = decoder.generate(prompt, MAX_NEW, method=method, grammar=grammar)
            assert out.token_ids == want.token_ids, (method, prompt, out.text, want.text)
            s = out.stats
            assert s["new_tokens"] == s["accepted"] + s["forced"] + s["target_tokens"], s
            accepted, forced = accepted + s["accepted"], forced + s["forced"]
    assert accepted > 0  # drafts were verified under the grammar, not only plain steps
    assert forced > 0  # and what the grammar forced (decoding/step.py `_with_forced`)


@pytest.mark.real
@pytest.mark.slow
def test_regex_and_json_object_and_bad_grammars(decoder):
    out = decoder.generate("Pick a number between 1 and 100.", 8, method="slem", grammar=Grammar("regex", "[0-9]{1,3}"))
    assert out.text.isdigit() and out.finish_reason == "eos"  # the grammar was complete: it ended
    out = decoder.generate("Any JSON object, please.", 48, grammar=Grammar("json_object"))
    assert isinstance(json.loads(out.text), dict)
    with pytest.raises(AnydraftError, match="cannot be compiled"):
        decoder.generate("x", 4, grammar=Grammar("json_schema", {"type": "objectx"}))
    with pytest.raises(AnydraftError, match="cannot be compiled"):
        decoder.generate("x", 4, grammar=Grammar("lark", "start: ("))
    with pytest.raises(AnydraftError, match="not valid JSON"):
        Grammar("json_schema", "{nope")
    with pytest.raises(AnydraftError, match="slrs"):
        decoder.generate("x", 4, method="slrs", grammar=Grammar("json_object"))


@pytest.mark.real
@pytest.mark.slow
def test_sampled_constrained_tli_matches_plain_constrained_sampling(real_model):
    """Chi-square (level 0.01), as tests/methods/test_statistical.py's end-to-end test: 300
    seeded two-token generations of tli under a regex, on SmolLM2 (float32) drafted by Gemma-3
    on llama.cpp (another vocabulary), against the exact constrained distribution over those two tokens."""
    from anydraft.models.session import HFSession
    from anydraft.sampling import SamplingParams
    from tests.methods.test_statistical import exact_two_tokens, two_tokens_pvalue

    target, drafter = "smollm2-135m", "gemma3-270m"
    tmodel, tok = real_model(target), load_tokenizer(target)
    dec = Decoder(target=tmodel, tokenizer=tok, drafter=drafter_model(real_model, drafter, "llamacpp", "cpu"),
                  drafter_tokenizer=load_tokenizer(drafter), num_draft_tokens=3, adaptive=False)
    grammar = Grammar("regex", "(red|green|blue|yellow|purple|orange|pink|black|white)( and [a-z]+)?")
    prompt, runs = "Name one colour:", 300
    seqs = [tuple(dec.generate(prompt, max_new_tokens=2, temperature=1.0, seed=s, chat=True,
                               method="tli", grammar=grammar).token_ids) for s in range(runs)]
    params = SamplingParams(temperature=1.0)

    def constrained(logits, new):  # plain constrained sampling after the new tokens ``new``
        state = dec.grammars.constraint(grammar)
        state.commit(list(new))
        return params.probs(logits.masked_fill(~state.allowed(), float("-inf"))).double()

    exact = exact_two_tokens(seqs, HFSession(tmodel), dec.prompt_ids(prompt), dec.eos_ids, constrained)
    assert all(exact[s] > 0 for s in set(seqs))  # nothing the grammar refuses came out
    assert two_tokens_pvalue(seqs, exact) > 0.01
