"""Prompt lookup: the n-gram index finds what a brute-force search finds, and copying (alone,
or mixed step by step with a drafter method) keeps every sampling distribution exact."""

import random

import pytest

from anydraft.methods import StringLevelExactMatch, TokenLevelIntersection
from anydraft.methods.lookup import MAX_NGRAM, MIN_NGRAM, NgramIndex, PromptLookup
from anydraft.methods.policy import PROBE_SHARE, Acceptance, Costs, DraftPlan, _Mean
from tests.methods.test_exhaustive import SETTINGS, assert_same_distribution, max_new
from tests.methods.toys import Toys, params


def brute_force_match(tokens, limit):
    for n in range(min(MAX_NGRAM, len(tokens)), MIN_NGRAM - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # latest earlier occurrence first
            if tokens[end - n:end] == suffix:
                return n, tokens[end:end + limit]
    return 0, []


def test_index_matches_the_longest_suffix_at_its_latest_occurrence():
    index = NgramIndex()
    text = [5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7]
    # "5 6 7" ended at 3 (followed by 8 1 6); the later "6 7" (end 7) is shorter
    assert index.match(text, 3) == (3, [8, 1, 6])
    assert index.match(text + [4], 3) == (0, [])  # 4 never occurred
    assert index.match(text + [4, 5], 2) == (1, [6, 7])  # 5 last ended at 10: continuation 6 7
    assert NgramIndex().match([1, 1, 1], 5) == (2, [1])  # the continuation stops at the end


def test_index_is_incremental_and_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        tokens, index = [], NgramIndex()
        for _ in range(rng.randrange(1, 40)):
            tokens.extend(rng.randrange(4) for _ in range(rng.randrange(1, 4)))
            assert index.match(tokens, 4) == brute_force_match(tokens, 4), tokens


def test_free_drafts_pay_on_a_flat_target_curve_and_not_on_a_steep_one():
    """Copies cost no drafter pass: only the target's extra scoring counts."""
    def plan(target, a):
        c = Costs()
        c.target = {n: _Mean(s) for n, s in target.items()}
        c.draft = _Mean(10.0)  # the drafter's cost must not count against copies
        acc = Acceptance()
        acc.positions = [_Mean(a)]
        return DraftPlan(5, True, c, acc, free=True)

    assert plan({1: 0.1, 6: 0.11}, 0.8).best()[0] == 5  # PyTorch bf16
    assert plan({1: 0.03, 6: 0.18}, 0.3).best()[0] == 0  # llama.cpp: n tokens cost n steps
    k, rate = plan({1: 0.1, 6: 0.11}, 0.8).best()
    assert (k, rate) == (5, pytest.approx((1 + sum(0.8 ** i for i in range(1, 6))) / 0.11))


def test_copies_beating_an_idle_drafter_still_let_it_probe():
    """A drafter whose estimates say "plain step" loses every step to copies that beat a plain
    step; those steps count towards its probes, or it would never run again (a floor rerun lost
    its drafter for three whole requests that way)."""
    import types

    from tests.methods.test_policy import FakeState

    c = Costs()
    c.target = {1: _Mean(0.2), 6: _Mean(0.21)}
    c.draft = _Mean(0.02)
    drafter_acc, copy_acc = Acceptance(), Acceptance()
    drafter_acc.positions, copy_acc.positions = [_Mean(0.0)], [_Mean(0.3)]
    inner = types.SimpleNamespace(name="sd", plan=DraftPlan(5, True, c, drafter_acc))
    inner.plan.steps = 2
    lookup = PromptLookup(c, {}, 5, True, inner)
    lookup.plan = DraftPlan(5, True, c, copy_acc, free=True)
    state = FakeState()
    steps = ["copy" if lookup._copy_wins(state, 2) else inner.plan.k(state) for _ in range(60)]
    waste = 5 * 0.02 + 0.21 - 0.2  # a full draft none of which is kept
    first = waste / (0.2 * PROBE_SHARE)  # 27.5 copy steps earn it
    assert [(i, k) for i, k in enumerate(steps) if k != "copy"] == [(28, 5), (57, 5)]
    assert first < 28


# -- exactness by enumeration ---------------------------------------------------------------

PROMPT = [1, 2, 3, 1, 2]  # "abcab": the tail "ab" and "b" occurred before, so copies happen


@pytest.fixture(scope="module")
def toys():
    return Toys()


def fixed_lookup(inner=None):
    return PromptLookup(Costs(), {}, 2, adaptive=False, inner=inner)


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_lookup_is_exact(toys, settings):
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    states = []

    def make():
        method = fixed_lookup()
        start = method.start
        method.start = lambda state: (states.append(state), start(state))
        return method

    got, paths = toys.method_distribution(make, PROMPT, p, max_new(settings))
    assert paths >= len(want)
    assert_same_distribution(got, want)
    assert any(state.stats.drafted for state in states)  # some steps copied candidates


@pytest.mark.parametrize("settings", SETTINGS[1:], ids=str)
@pytest.mark.parametrize("inner", ["slem", "tli"])
def test_copying_mixed_with_a_drafter_is_exact(toys, inner, settings, monkeypatch):
    """Copy and drafter steps alternate by position: the drafter must read what copies commit."""
    monkeypatch.setattr(PromptLookup, "_copy_wins", lambda self, state, n: n > 0 and len(state.committed) % 2 == 1)
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    pairing = toys.pairing(num_draft_tokens=2)
    make = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection}[inner]
    names = set()

    def method():
        m = fixed_lookup(make(pairing))
        names.add(m.name)
        return m

    got, _ = toys.method_distribution(method, PROMPT, p, max_new(settings))
    assert_same_distribution(got, want)
    assert names == {f"{inner}+lookup"}


def test_a_wrong_copy_verifier_is_caught(toys, monkeypatch):
    """The harness must be able to fail: committing every copied candidate is not lossless."""
    import anydraft.methods.lookup as lookup

    original = lookup.verify_exact

    def accept_all(logits, candidates, params_, generator):
        return len(candidates), original(logits[len(candidates):], [], params_, generator)[1]

    monkeypatch.setattr(lookup, "verify_exact", accept_all)
    p = params(temperature=1.0, top_k=4)
    want = toys.exact_target_distribution(PROMPT, p, 3)
    got, _ = toys.method_distribution(fixed_lookup, PROMPT, p, 3)
    with pytest.raises(AssertionError):
        assert_same_distribution(got, want)
