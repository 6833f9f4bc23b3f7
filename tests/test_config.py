"""`DraftConfig` validation, the command line options built from it and `SamplingParams`, the
Decoder's keyword shortcuts, and a command line that starts without torch."""

import argparse
import subprocess
import sys

import pytest

from anydraft import AnydraftError, DraftConfig, SamplingParams
from anydraft.options import (
    add_draft_options,
    add_sampling_options,
    draft_config,
    sampling_params,
)


@pytest.mark.parametrize("field,value", [
    ("method", "magic"), ("method", None), ("num_draft_tokens", 0), ("num_draft_tokens", 65),
    ("num_draft_tokens", 2.0), ("num_draft_tokens", True), ("draft_confidence", 1.0),
    ("draft_confidence", -0.1), ("draft_confidence", float("nan")), ("draft_confidence", "0.5"),
    ("adaptive", 1), ("adaptive", None), ("drafter_context", -5), ("drafter_context", 1.5),
])
def test_each_bad_draft_setting_is_an_error_naming_it(field, value):
    with pytest.raises(AnydraftError) as err:
        DraftConfig(**{field: value})
    assert (field if field != "method" else "unknown method") in str(err.value)


def test_draft_config_is_frozen_and_checked_again_when_replaced():
    import dataclasses

    draft = DraftConfig(num_draft_tokens=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        draft.num_draft_tokens = 4
    with pytest.raises(AnydraftError, match="num_draft_tokens"):
        dataclasses.replace(draft, num_draft_tokens=0)


def _parser(draft=None, sampling=None, skip=()):
    parser = argparse.ArgumentParser()
    add_draft_options(parser, draft, skip)
    add_sampling_options(parser, sampling)
    return parser


def test_defaults_round_trip():
    args = _parser().parse_args([])
    assert draft_config(args) == DraftConfig()
    assert sampling_params(args) == SamplingParams()


def test_every_option_round_trips():
    args = _parser().parse_args([
        "--method", "slem", "--num-draft-tokens", "7", "--draft-confidence", "0.25", "--fixed-k",
        "--drafter-context", "0", "--temperature", "0.7", "--top-k", "40", "--top-p", "0.9",
        "--min-p", "0.05", "--seed", "3"])
    assert draft_config(args) == DraftConfig("slem", 7, 0.25, False, 0)
    assert sampling_params(args) == SamplingParams(0.7, 40, 0.9, 0.05, 3)


def test_other_defaults_and_skipped_fields():
    parser = _parser(DraftConfig(adaptive=False), SamplingParams(seed=0), skip=("method",))
    args = parser.parse_args([])
    assert not hasattr(args, "method")
    assert draft_config(args) == DraftConfig(adaptive=False)  # a skipped field: its default
    assert sampling_params(args).seed == 0
    with pytest.raises(SystemExit):  # --method is not there (bench has --methods)
        parser.parse_args(["--method", "ar"])


def test_invalid_option_values_fail_in_the_dataclass():
    args = _parser().parse_args(["--num-draft-tokens", "99", "--temperature", "-1"])
    with pytest.raises(AnydraftError, match="num_draft_tokens"):
        draft_config(args)
    with pytest.raises(AnydraftError, match="temperature"):
        sampling_params(args)


def test_decoder_shortcuts_override_the_draft_config():
    from anydraft import Decoder
    from tests.helpers import byte_tokenizer, tiny_llama

    tok = byte_tokenizer()
    model = tiny_llama(len(tok), max_positions=64)
    draft = DraftConfig(method="lookup", num_draft_tokens=3, adaptive=False)
    dec = Decoder(target=model, tokenizer=tok, draft=draft)
    assert dec.draft is draft and dec.draft.method == "lookup" and dec.draft.num_draft_tokens == 3
    dec = Decoder(target=model, tokenizer=tok, draft=draft, num_draft_tokens=9, method="ar")
    assert dec.draft == DraftConfig(method="ar", num_draft_tokens=9, adaptive=False)
    assert Decoder(target=model, tokenizer=tok).draft == DraftConfig()
    with pytest.raises(AnydraftError, match="needs a drafter"):
        Decoder(target=model, tokenizer=tok, draft=DraftConfig(method="slem"))


def test_generate_shortcuts_override_the_sampling_params():
    from anydraft import Decoder
    from tests.helpers import byte_tokenizer, tiny_llama

    tok = byte_tokenizer()
    dec = Decoder(target=tiny_llama(len(tok), max_positions=64), tokenizer=tok, method="ar")
    hot = SamplingParams(temperature=1.0, seed=1)
    a = dec.generate("hello", 12, sampling=hot, chat=False)
    b = dec.generate("hello", 12, sampling=SamplingParams(temperature=1.0), seed=1, chat=False)
    c = dec.generate("hello", 12, temperature=1.0, seed=1, chat=False)
    assert a.token_ids == b.token_ids == c.token_ids
    greedy = dec.generate("hello", 12, chat=False)
    assert dec.generate("hello", 12, sampling=hot, temperature=0, chat=False).token_ids == \
        greedy.token_ids
    with pytest.raises(AnydraftError, match="top_p"):
        dec.generate("hello", sampling=hot, top_p=0)


HEAVY = ("torch", "transformers", "fastapi", "uvicorn", "numpy")


@pytest.mark.parametrize("argv", [
    ["--help"], ["bench", "--help"], ["serve", "--help"], ["generate", "--help"],
    ["models", "list"],
])
def test_command_line_starts_without_torch(argv):
    code = (f"import sys\nfrom anydraft.cli import main\ntry:\n    main({argv!r})\n"
            "except SystemExit:\n    pass\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "assert not heavy, heavy")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout  # the help or the list was printed


@pytest.mark.parametrize("argv,exact", [([], "auto"), (["--exact"], True), (["--exact", "on"], True),
                                        (["--exact", "off"], False), (["--exact", "auto"], "auto")])
def test_exact_option_maps_to_the_decoder(argv, exact):
    from anydraft.options import add_model_options, decoder_options

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    add_draft_options(parser)
    assert decoder_options(parser.parse_args(["--target", "t", *argv]))["exact"] == exact
    with pytest.raises(SystemExit):
        parser.parse_args(["--target", "t", "--exact", "yes"])
