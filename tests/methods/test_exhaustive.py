"""Sampling exactness by exhaustive enumeration: every random path of the real decoding loop,
weighted by its exact probability, gives the target's own distribution over outputs (1e-9)."""

import pytest

from anydraft.methods import (
    SpeculativeSampling,
    StringLevelExactMatch,
    StringLevelRejectionSampling,
    TokenLevelIntersection,
)
from anydraft.methods.ar import Autoregressive
from tests.methods.toys import params

PROMPT = [1]  # "a"
MAX_NEW = 3  # 2 draft tokens, then the target's own: up to 3 tokens per step


def max_new(settings):
    """Untruncated sampling branches on every token: one token fewer keeps it to seconds."""
    return MAX_NEW - 1 if settings == dict(temperature=1.0) else MAX_NEW


def assert_same_distribution(got: dict, want: dict):
    assert abs(sum(got.values()) - 1) < 1e-9
    for seq in set(got) | set(want):
        assert abs(got.get(seq, 0.0) - want.get(seq, 0.0)) < 1e-9, seq


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=4), dict(temperature=1.3, top_p=0.8),
            dict(temperature=1.0, min_p=0.1), dict(temperature=0.0)]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
@pytest.mark.parametrize("method", ["ar", "slem", "tli", "slrs"])
def test_cross_vocabulary_methods_are_exact(toys, method, settings):
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    pairing = toys.pairing(num_draft_tokens=2)
    make = {"ar": Autoregressive, "slem": lambda: StringLevelExactMatch(pairing),
            "tli": lambda: TokenLevelIntersection(pairing),
            "slrs": lambda: StringLevelRejectionSampling(pairing)}[method]
    got, paths = toys.method_distribution(make, PROMPT, p, max_new(settings))
    assert paths >= len(want)  # every outcome of the target was reached
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", SETTINGS[1:], ids=str)  # plain t=1: slow, same verifier as tli
def test_sd_is_exact_with_a_same_vocabulary_drafter(toys, settings):
    """Same vocabulary, different model: the drafter is a target-vocabulary toy, other salt."""
    import dataclasses

    from tests.methods.toys import TARGET_VOCAB, ToySession

    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    pairing = dataclasses.replace(
        toys.pairing(num_draft_tokens=2), drafter_table=toys.target_table,
        drafter_vocab_size=len(TARGET_VOCAB),
        new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    got, _ = toys.method_distribution(lambda: SpeculativeSampling(pairing), PROMPT, p, max_new(settings))
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", [SETTINGS[1], SETTINGS[4]], ids=str)
@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "sd"])
def test_a_drafter_reading_only_the_prompts_end_is_exact(toys, method, settings):
    """--drafter-context: the drafter reads the last token of the prompt "abc" and what follows."""
    import dataclasses
    import types

    from tests.methods.toys import TARGET_VOCAB, ToySession

    prompt = [1, 2, 3]  # "a", "b", "c"
    p = params(**settings)
    want = toys.exact_target_distribution(prompt, p, max_new(settings))
    pairing = dataclasses.replace(toys.pairing(num_draft_tokens=2), drafter_context=1)
    if method == "sd":
        pairing = dataclasses.replace(
            pairing, drafter_table=toys.target_table, drafter_vocab_size=len(TARGET_VOCAB),
            new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    state = types.SimpleNamespace(committed=prompt, stats=None, cancel=None)
    assert pairing.new_drafter(state, same_ids=method == "sd").behind == 1  # "c" in both vocabularies
    make = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
            "slrs": StringLevelRejectionSampling, "sd": SpeculativeSampling}[method]
    got, _ = toys.method_distribution(lambda: make(pairing), prompt, p, max_new(settings))
    assert_same_distribution(got, want)


def test_a_drafter_behind_by_more_than_its_context_reads_only_the_end():
    """After plain steps the drafter's backlog is cut to its last ``context`` tokens after the
    head (BOS); its cache restarts there. A short backlog is read whole, as before."""
    import torch

    from anydraft.decoding.stats import Stats
    from anydraft.methods.drafter import Drafter

    class Recorder:
        max_length, vocab_size, batch, exact = 100, 4, None, False

        def __init__(self):
            self.cache, self.fed = [], []

        def __len__(self):
            return len(self.cache)

        def feed(self, ids, rows=None):
            self.cache += ids
            self.fed.append(list(ids))
            return torch.zeros(len(ids), 4)

        def rollback(self, n):
            del self.cache[n:]

    session = Recorder()
    drafter = Drafter(session, None, [9, 1, 2, 3], Stats(), head=1, context=2)
    assert drafter.behind == 3  # BOS + the last 2
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[0] == [9, 2, 3]
    drafter.commit([1, 0], 1)  # a short backlog after the draft was kept
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [1, 0] and session.cache == [9, 2, 3, 1, 0]
    drafter.commit([3, 3, 2, 2, 1], 0)  # plain steps committed 5 tokens it did not draft
    assert drafter.behind == 2  # the head is still in the cache
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [2, 1] and session.cache == [9, 2, 1] and drafter.ids == [9, 2, 1]
    drafter.commit([3, 3, 2], 0)
    drafter.trim(1)  # a probe's shorter read
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [2] and session.cache == [9, 2] and drafter.ids == [9, 2]


def test_a_wrong_verifier_is_caught(toys):
    """The harness must be able to fail: accepting every draft gives the drafter's law."""
    import anydraft.methods.tli as tli

    p = params(temperature=1.0)
    want = toys.exact_target_distribution(PROMPT, p, 2)
    pairing = toys.pairing(num_draft_tokens=2)
    original = tli.verify_rejection

    def accept_all(p_, q_, candidates, generator):
        return len(candidates), original(p_[len(candidates):], q_[:0], [], generator)[1]

    tli.verify_rejection = accept_all
    try:
        got, _ = toys.method_distribution(lambda: TokenLevelIntersection(pairing), PROMPT, p, 2)
    finally:
        tli.verify_rejection = original
    with pytest.raises(AssertionError):
        assert_same_distribution(got, want)


# -- pairs that once crashed (issue 19): each must still give the target's exact law -------
METHODS = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
           "slrs": StringLevelRejectionSampling}
EDGE_SETTINGS = [SETTINGS[1], SETTINGS[4]]  # sampling (top-k) and greedy


def assert_exact(toys, method, settings, max_new_tokens=MAX_NEW):
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new_tokens)
    pairing = toys.pairing(num_draft_tokens=2)
    got, paths = toys.method_distribution(lambda: METHODS[method](pairing), PROMPT, p,
                                          max_new_tokens)
    assert paths >= len(want)
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", EDGE_SETTINGS, ids=str)
@pytest.mark.parametrize("method", ["slem", "slrs"])  # tli never proposes either
def test_a_drafted_byte_the_target_cannot_spell_ends_the_draft(method, settings):
    """The drafter has "d", which no target token spells (as Gemma-3's <0x04> for SmolLM2):
    slem (greedy slrs too) re-encoded it and crashed; now the draft is cut before it."""
    from tests.methods.toys import DRAFTER_MERGES, DRAFTER_VOCAB, Toys

    toys = Toys(drafter_vocab=DRAFTER_VOCAB + ["d", "cd"], drafter_merges=DRAFTER_MERGES + [("c", "d")])
    assert toys.target_table.byte_ids[ord("d")] is None
    assert_exact(toys, method, settings)


@pytest.mark.parametrize("settings", EDGE_SETTINGS, ids=str)
@pytest.mark.parametrize("method", ["slem", "slrs"])  # tli never proposes either
def test_a_target_without_eos_and_a_drafter_that_drafts_its_own(method, settings):
    """The target's tokenizer has no EOS id: a drafted EOS was translated to None."""
    from tests.methods.toys import Toys

    assert_exact(Toys(target_eos=False), method, settings)


@pytest.mark.parametrize("widths", [(3, 5), (9, 8)], ids=["narrower", "padded"])
@pytest.mark.parametrize("settings", EDGE_SETTINGS, ids=str)
@pytest.mark.parametrize("method", list(METHODS))
def test_logits_narrower_or_wider_than_the_tokenizer(method, settings, widths):
    """(3, 5): both tokenizers are longer than their models' logits (the target cannot emit
    "c", "ab", ...; the drafter cannot draft "bb"): tli's mask and map were longer than the
    logits. (9, 8): padded logits; the target samples ids that spell nothing (slrs: its
    SPECIAL outcome, the drafter's NOMATCH)."""
    from tests.methods.toys import Toys

    target_width, drafter_width = widths
    assert_exact(Toys(target_width=target_width, drafter_width=drafter_width), method, settings)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # 0/0 in numpy warns before the NaN
@pytest.mark.parametrize("settings", [dict(temperature=1.0)], ids=str)
def test_slrs_with_drafter_probabilities_far_below_rounding(toys, settings):
    """A drafter so sure of itself that its other tokens have probability ~1e-50: the mass of
    the tokens longer than a drafted prefix, read as a difference of prefix sums, was 0, and
    0/0 made the walk draw from NaN. Drawn anyway (the enumeration takes every path), such a
    token must still leave the target's law exact."""
    import dataclasses

    from tests.methods.toys import DRAFTER_VOCAB, ToySession

    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, 2)
    pairing = dataclasses.replace(
        toys.pairing(num_draft_tokens=2),
        new_drafter_session=lambda: ToySession(len(DRAFTER_VOCAB), "drafter", scale=40.0))
    got, _ = toys.method_distribution(lambda: StringLevelRejectionSampling(pairing), PROMPT, p, 2)
    assert_same_distribution(got, want)


def test_slrs_range_masses_survive_cancellation(toys):
    """The masses slrs reads off its prefix sums: a positive mass never reads as 0."""
    import torch

    from anydraft.methods.slrs import Masses, _trie

    trie = _trie(toys.drafter_table)  # trie order: a, b, bb, c, ca
    q = torch.tensor([0.0, 0.0, 0.0, 1.0, 1e-30, 0.0], dtype=torch.float64)
    m = Masses(trie, q)
    lo, hi = trie.span(b"ca")
    assert m.range(lo, hi) == 1e-30
    assert m.range(trie.exact(b"c")[1], trie.span(b"c")[1]) == 1e-30  # longer than "c"
    assert m.children(b"c")[ord("a")] == 1e-30 and m.children(b"")[ord("c")] == 1.0


# -- the richer pair: multi-byte characters, specials, BOS, duplicate spellings, padding ------
RICH_PROMPT = [1, 3]  # <bos> "a"
RICH_CASES = [  # (settings, max new tokens, stop strings, context window)
    (dict(temperature=0.7, top_k=4), 3, (), 64),
    (dict(temperature=1.0), 2, (), 64),  # untruncated: specials, padding, every branch
    (dict(temperature=1.3, top_p=0.9), 2, ("éa", "\xa9"), 64),  # stops across tokens
    (dict(temperature=0.8, min_p=0.05), 3, (), 4),  # the window ends after 2 new tokens
    (dict(temperature=0.0), 3, ("aa",), 4),
]


@pytest.fixture(scope="module")
def rich():
    from tests.methods.toys import rich_tokenizers

    return rich_tokenizers()


@pytest.mark.parametrize("case", RICH_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
@pytest.mark.parametrize("method", ["ar", "sd", "slem", "tli", "slrs"])
def test_the_richer_pair_is_exact(rich, method, case):
    """Every method on a pair with UTF-8 split across tokens, special and BOS tokens, ids that
    spell the same bytes (the target's "é" twice: slrs draws between them), a drafter token
    that starts mid-character, padded logits on both sides (ids that spell nothing: slrs's
    SPECIAL and NOMATCH outcomes), stop strings and a context window that ends the output."""
    from tests.methods.toys import Toys

    settings, max_new_tokens, stop, context = case
    target, drafter = rich
    if method == "sd":  # the drafter: another model with the target's own vocabulary
        toys = Toys(target=target, drafter=target, target_width=10, drafter_width=10,
                    context=context)
    else:
        toys = Toys(target=target, drafter=drafter, target_width=10, drafter_width=9,
                    context=context)
    table = toys.target_table
    assert table.token_bytes[6] == table.token_bytes[8] == "é".encode()
    p = params(**settings)
    want = toys.exact_target_distribution(RICH_PROMPT, p, max_new_tokens, stop)
    pairing = toys.pairing(num_draft_tokens=2)
    make = {"ar": Autoregressive, "sd": SpeculativeSampling, **METHODS}[method]
    got, paths = toys.method_distribution(
        (lambda: make()) if method == "ar" else (lambda: make(pairing)), RICH_PROMPT, p,
        max_new_tokens, stop)
    assert paths >= len(want)
    assert_same_distribution(got, want)


# -- logit_bias: one more part of the sampling transform, on the target's ids ---------------
# "b" (2) and "c" (3) are spelt alike by the drafter, so its drafts carry the bias (`Pairing.drafter_params`);
# "ab" (4) and "abc" (5) are the target's alone: drafts of them go unbiased
BIAS = {2: -3.0, 3: -6.0, 4: 2.5, 5: -1.0}


@pytest.mark.parametrize("settings", [SETTINGS[1], SETTINGS[3], SETTINGS[4]], ids=str)
@pytest.mark.parametrize("method", ["ar", "lookup", "sd", "slem", "tli", "slrs"])
def test_a_logit_bias_keeps_every_method_exact(toys, method, settings):
    """The target's law with the bias is what every method gives with it: the verifiers form
    p through the one transform, whatever the drafter's distribution carried."""
    p = params(**settings, logit_bias=BIAS)
    want = toys.exact_target_distribution(PROMPT, p, MAX_NEW)
    assert want != toys.exact_target_distribution(PROMPT, params(**settings), MAX_NEW)
    got, paths = toys.method_distribution(toys.make(method), PROMPT, p, MAX_NEW)
    assert paths >= len(want)
    assert_same_distribution(got, want)


def test_a_drafter_of_another_vocabulary_drafts_with_the_bias_of_its_own_ids(toys):
    pairing = toys.pairing()
    p = params(temperature=1.0, logit_bias=BIAS)
    drafting = pairing.drafter_params(p)
    byte_ids = toys.drafter_table.byte_ids
    assert drafting.logit_bias == ((byte_ids[ord("b")], -3.0), (byte_ids[ord("c")], -6.0))
    assert pairing.drafter_params(p) is drafting  # asked every step: kept
    assert pairing.drafter_params(params(temperature=1.0)).logit_bias == ()
