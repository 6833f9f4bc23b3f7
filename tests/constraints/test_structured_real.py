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
    accepted = 0
    for prompt in PROMPTS:
        want = decoder.generate(prompt, MAX_NEW, method="ar", grammar=grammar)
        jsonschema.validate(json.loads(want.text), SCHEMA)
        free = decoder.generate(prompt, MAX_NEW, method="ar")
        assert free.token_ids != want.token_ids  # the grammar changed the output: the test can fail
        for method in ("slem", "tli", "lookup", "auto"):
            out = decoder.generate(prompt, MAX_NEW, method=method, grammar=grammar)
            assert out.token_ids == want.token_ids, (method, prompt, out.text, want.text)
            accepted += out.stats["accepted"]
    assert accepted > 0  # drafts were verified under the grammar, not only plain steps


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
