"""Bad input gets a clear AnydraftError (a ValueError) and a non-zero CLI exit."""

import pytest

from anydraft import AnydraftError, Decoder
from anydraft.cli import main
from tests.helpers import byte_tokenizer, tiny_llama


@pytest.fixture(scope="module")
def dec():
    tok = byte_tokenizer()
    return Decoder(target=tiny_llama(len(tok), max_positions=64), tokenizer=tok)


@pytest.mark.parametrize("prompt", ["", "   ", None, 42, []])
def test_empty_or_wrong_prompt(dec, prompt):
    with pytest.raises(AnydraftError, match="prompt"):
        dec.generate(prompt)


def test_prompt_longer_than_context(dec):
    with pytest.raises(AnydraftError, match="context window is 64: shorten the prompt"):
        dec.generate("word " * 200, chat=False)


def test_prompt_ids_beyond_the_models_vocabulary():
    """A tokenizer longer than the model's logits (tokens added, embeddings not resized): a
    prompt that spells such an id fails clearly before generation, not with an IndexError."""
    tok = byte_tokenizer()
    width = 300  # the merges past id 300 have no embedding
    small = Decoder(target=tiny_llama(width), tokenizer=tok, dtype="float32")
    assert max(small.prompt_ids("%%", chat=False)) < width < len(tok)
    assert small.generate("%%", max_new_tokens=3, chat=False).token_ids  # in range: fine
    with pytest.raises(AnydraftError, match=r"\(id 3\d\d\), but .* has only 300 token embeddings"):
        small.generate("the quick brown fox", chat=False)
    with pytest.raises(AnydraftError, match="tokenizer .* is longer than the model's vocabulary"):
        small.stream("the quick brown fox", chat=False)  # before iteration: a server's 400


def test_a_drafters_tokenizer_longer_than_its_vocabulary():
    """The drafter's side (issue 19): the prompt re-encoded for a drafter whose tokenizer is
    longer than its logits spelt ids it has no embedding for: an IndexError mid-generation (a
    server's 500). It reads such a token as its bytes now; greedy output stays the target's."""
    from anydraft.bridge import token_table
    from anydraft.decoding import Stats
    from anydraft.methods.drafter import Drafter
    from tests.bridge.bridge_synthetic import make_byte_bpe

    tok, dtok, width = make_byte_bpe(), byte_tokenizer(), 300
    prompt = "the quick brown fox"
    assert max(dtok.encode(prompt)) >= width
    short = tiny_llama(width, seed=1)
    for target_tok, methods in ((tok, ("slem", "tli", "slrs")), (dtok, ("sd",))):
        dec = Decoder(target=tiny_llama(len(target_tok)), tokenizer=target_tok, drafter=short,
                      drafter_tokenizer=dtok, dtype="float32", adaptive=False, num_draft_tokens=3)
        want = dec.generate(prompt, max_new_tokens=12, chat=False, method="ar").token_ids
        for method in methods:
            out = dec.generate(prompt, max_new_tokens=12, chat=False, method=method)
            assert out.token_ids == want and out.stats["drafted"] > 0, method
            dec.generate(prompt, max_new_tokens=12, chat=False, method=method, temperature=1.0, seed=0)
    # text the target commits later is read the same way
    ttable, dtable = token_table(tok), token_table(dtok)
    drafter = Drafter(dec.drafter.new_session(), dtable, [], Stats(), ttable, width=width)
    drafter.commit(ttable.encode(prompt), 0)
    assert max(drafter.ids) < width and dtable.decode_bytes(drafter.ids) == prompt.encode()
    assert len(drafter.propose(2, lambda logits: logits.softmax(-1), True, None, 0.0)[0]) == 2


def test_generation_stops_at_context_window(dec):
    out = dec.generate("hello " * 8, max_new_tokens=500, chat=False)
    assert out.finish_reason in ("context", "eos")
    assert len(dec.prompt_ids("hello " * 8, chat=False)) + len(out.token_ids) <= 64


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": "ten"}, "max_new_tokens"), ({"stop": [3]}, "stop"), ({"method": "magic"}, "unknown method"),
    ({"method": "slem"}, "needs a drafter"),
])
def test_invalid_generation_settings(dec, kwargs, match):
    with pytest.raises(AnydraftError, match=match):
        dec.generate("hello", **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_draft_tokens": 0}, "num_draft_tokens"), ({"draft_confidence": 1.0}, "draft_confidence"),
    ({"drafter_context": -5}, "drafter_context must be a non-negative integer"),
    ({"drafter_context": 1.5}, "drafter_context"),
])
def test_invalid_draft_settings(kwargs, match):
    tok = byte_tokenizer()
    with pytest.raises(AnydraftError, match=match):
        Decoder(target=tiny_llama(len(tok), max_positions=64), tokenizer=tok, **kwargs)


def test_model_object_without_tokenizer():
    with pytest.raises(AnydraftError, match="tokenizer"):
        Decoder(target=tiny_llama(300))


@pytest.mark.parametrize("spec,match", [
    ("no-such-model", "unknown model"), ("/nonexistent/model.gguf", "does not exist"),
    ("", "empty"),
])
def test_unknown_model_specs(spec, match):
    with pytest.raises(AnydraftError, match=match):
        Decoder(target=spec)


def test_cli_errors_exit_nonzero_without_traceback(capsys):
    assert main(["generate", "--target", "no-such-model", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("anydraft: error: unknown model") and "Traceback" not in err
    assert main(["generate", "--target", "x", "--prompt", "hi", "--temperature", "-1"]) == 2


def test_backend_errors_name_the_fix(tmp_path):
    with pytest.raises(AnydraftError, match="unknown backend 'cuda': choose one of auto, torch, llamacpp"):
        Decoder(target="no-such-model", backend="cuda")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(AnydraftError, match="llamacpp backend reads GGUF files"):
        Decoder(target=str(tmp_path), backend="llamacpp")
    with pytest.raises(AnydraftError, match="unknown backend"):
        Decoder(target="no-such-model", drafter="x", drafter_backend="onnx")


def test_structured_output_options_fail_before_any_model_loads(capsys, tmp_path):
    """``generate --json-schema/--regex/--grammar``: a missing file, a schema that is not JSON,
    or two at once exit 2 naming the option, before the target loads ("x" is no model)."""
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    for flags, message in ((["--json-schema", str(tmp_path / "missing.json")], "cannot read --json-schema"),
                           (["--json-schema", str(bad)], "not valid JSON"),
                           (["--regex", "a+", "--grammar", str(bad)], "at most one of")):
        assert main(["generate", "--target", "x", "--prompt", "hi", *flags]) == 2
        assert message in capsys.readouterr().err
