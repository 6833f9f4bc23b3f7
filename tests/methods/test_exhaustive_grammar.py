"""Constrained decoding (issue 63) by exhaustive enumeration: every method that takes a grammar
gives exactly plain constrained sampling's distribution over outputs (the target's logits with
the tokens the grammar refuses at -inf, then the sampling settings), a real llguidance grammar
over the toy target's own tokenizer."""

import pytest

from anydraft.constraints import Grammar
from anydraft.errors import AnydraftError
from tests.methods.test_exhaustive import MAX_NEW, SETTINGS, assert_same_distribution
from tests.methods.toys import params

PROMPT = [1]  # "a"
# toy target tokens: a b c ab abc bc (and EOS). Each grammar refuses some token at some
# position, so drafts the grammar refuses are made and must be rejected exactly
GRAMMARS = {
    "regex: b and c, then EOS": Grammar("regex", "[bc]{1,4}"),
    "regex: an a-b text ending in c": Grammar("regex", "(a|b)*c"),
    "lark: ab or bc pairs": Grammar("lark", 'start: ("ab" | "bc")+'),
    # after the first token the text is forced, in tokens that may or may not be the target's
    # tokenization of it (after "a": "bc" "ab"; the target may say "b" "c" ...)
    "regex: a choice, then forced text": Grammar("regex", "(a|c)bcab"),
}


@pytest.mark.parametrize("grammar", GRAMMARS, ids=str)
@pytest.mark.parametrize("settings", [SETTINGS[1], SETTINGS[4]], ids=str)  # top-k, greedy: the rest alike
@pytest.mark.parametrize("method", ["ar", "lookup", "sd", "slem", "tli"])
def test_every_method_samples_the_constrained_distribution(toys, method, settings, grammar):
    p, g = params(**settings), GRAMMARS[grammar]
    want = toys.exact_target_distribution(PROMPT, p, MAX_NEW, grammar=g)
    unconstrained = toys.exact_target_distribution(PROMPT, p, MAX_NEW)
    assert want != unconstrained  # the grammar changes what comes out: the test can fail
    got, paths = toys.method_distribution(toys.make(method), PROMPT, p, MAX_NEW, grammar=g)
    assert paths >= len(want)
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", [SETTINGS[1], SETTINGS[4]], ids=str)
@pytest.mark.parametrize("method", ["ar", "lookup", "sd", "tli"])
@pytest.mark.parametrize("guess", [None, (2, 3), (6, 1)], ids=["forced", "guess b c", "guess bc a"])
def test_what_the_grammar_forces_is_offered_and_verified(toys, method, settings, guess, monkeypatch):
    """Tokens the grammar forces are offered after each proposal (decoding/step.py
    `_with_forced`) by every method but plain decoding, and the distribution stays exact. The
    toy's grammars allow only the forced tokens where they force some, so ``guess`` offers
    other tokens in their place, which the target may or may not choose: verification keeps
    the distribution whatever is offered."""
    from anydraft.constraints.matcher import Constraint

    offered, forced = [], Constraint.forced

    def spy(self, *args):
        kept, tokens = forced(self, *args)
        if guess is not None:
            tokens = list(guess[: args[2]])
        offered.extend(tokens)
        return kept, tokens

    monkeypatch.setattr(Constraint, "forced", spy)
    name = "regex: a choice, then forced text" if guess is None else "regex: an a-b text ending in c"
    p, g = params(**settings), GRAMMARS[name]
    want = toys.exact_target_distribution(PROMPT, p, MAX_NEW, grammar=g)
    # one draft token: room for forced ones within the few tokens enumerated
    got, _ = toys.method_distribution(toys.make(method, num_draft_tokens=1), PROMPT, p, MAX_NEW, grammar=g)
    assert_same_distribution(got, want)
    assert bool(offered) == (method != "ar"), offered


def test_every_output_matches_the_grammar(toys):
    import re

    p = params(**SETTINGS[2])
    got, _ = toys.method_distribution(toys.make("tli"), PROMPT, p, MAX_NEW, grammar=GRAMMARS["regex: b and c, then EOS"])
    for seq in got:
        text = toys.target_tok.decode([t for t in seq if t != 0])
        assert re.fullmatch("[bc]{1,4}", text) or len(seq) == MAX_NEW, (seq, text)


def test_slrs_refuses_a_grammar():
    from anydraft.request import RequestOptions

    with pytest.raises(AnydraftError, match="slrs"):
        RequestOptions(method="slrs", grammar=Grammar("regex", "a+"))
