"""Prompt lookup: the n-gram index finds what a brute-force search finds, and copying (alone,
or mixed step by step with a drafter method) keeps every sampling distribution exact."""

import random

import pytest

from anydraft.methods import StringLevelExactMatch, TokenLevelIntersection
from anydraft.methods.lookup import MAX_NGRAM, MIN_NGRAM, NgramIndex, PromptLookup
from anydraft.planning.cost import best
from anydraft.planning.estimates import Acceptance, Costs, Estimates, Mean
from anydraft.planning.policy import Measured, Policy
from anydraft.planning.settings import Settings
from tests.methods.test_exhaustive import SETTINGS, assert_same_distribution, max_new
from tests.methods.toys import params

PROBE_SHARE = Settings.probe_share


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
    def best_copy(target, a):
        c = Costs()
        c.target = {n: Mean(s) for n, s in target.items()}
        c.draft = Mean(10.0)  # the drafter's cost must not count against copies
        acc = Acceptance()
        acc.positions = [Mean(a)]
        return best(5, c, acc, free=True)

    assert best_copy({1: 0.1, 6: 0.11}, 0.8)[0] == 5  # a flat curve
    assert best_copy({1: 0.03, 6: 0.18}, 0.3)[0] == 0  # n tokens cost n steps
    k, rate = best_copy({1: 0.1, 6: 0.11}, 0.8)
    # priced with the margin a draft must win by (cost.py `terms`)
    expected = (1 + sum(0.8 ** i for i in range(1, 6))) / (1 + Settings().min_gain)
    assert (k, rate) == (5, pytest.approx(expected / 0.11))


def test_copies_beating_an_idle_drafter_still_let_it_probe():
    """A drafter whose estimates say "plain step" loses every step to copies that beat a plain
    step; those steps count towards its probes, or it would never run again (a floor rerun lost
    its drafter for three whole requests that way)."""
    from tests.methods.test_policy import FakeDrafter, FakeState

    c = Costs()
    c.target = {1: Mean(0.2), 6: Mean(0.21)}
    c.draft = Mean(0.02)
    estimates = Estimates(c)
    drafter_acc = estimates.of("sd", True)
    drafter_acc.positions = [Mean(0.0)]
    estimates.of("copy", True, 2).positions = [Mean(0.3)]
    p = Policy(5, True, estimates, True, drafter_acc, copies=True)
    p.steps = {"draft": 2, "copy": 2}
    choices = []
    for _ in range(60):
        choice = p.choose(FakeState(), FakeDrafter(behind=0), match=2)
        copy, k = choice.proposer == "copy", choice.k
        choices.append("copy" if copy else k)
        # the step measures what the estimates say; copies are all kept, drafts none
        seconds = c.target_seconds(1 + k) + (0 if copy else 0.02 * k)
        p.observe(choice, Measured(seconds, seconds - c.target_seconds(1 + k), c.target_seconds(1 + k),
                                   0 if copy else k, 1 + k, k, k if copy else 0, 0))
    waste = 5 * 0.02 + 0.21 - 0.2  # a full draft none of which is kept
    first = waste / (0.2 * PROBE_SHARE)  # 27.5 copy steps earn it
    assert [(i, k) for i, k in enumerate(choices) if k != "copy"] == [(28, 5), (57, 5)]
    assert first < 28


def shadowing(committed, max_k=3):
    """A PromptLookup alone (adaptive) started on a state whose committed text is ``committed``."""
    from tests.methods.test_policy import FakeState

    state = FakeState()
    state.params = params()
    state.committed = list(committed)
    lookup = PromptLookup(max_k, adaptive=True)
    row = lookup.start(state)
    return lookup, row.policy, state


def test_copies_are_measured_from_what_the_steps_commit_without_being_taken():
    """A shadow copy is scored against the committed tokens, whatever proposed them: kept up to
    its first differing token, and left open while all of it committed so far agrees."""
    lookup, policy, state = shadowing([5, 6, 7, 8, 1, 6, 2, 5, 6, 7])
    assert lookup.match(state.committed) == 3  # "5 6 7" -> copy 8 1 6
    for token in (8, 1):  # plain steps commit the copy's first two tokens: not decided yet
        state.committed.append(token)
        lookup.match(state.committed)
        assert policy.copy_estimates(3).steps == 0
    state.committed.append(9)  # its third differs
    lookup.match(state.committed)
    acc = policy.copy_estimates(3)
    assert acc.steps == 1
    f, prior = Settings.forget, Settings.prior_acceptance  # one observation after the prior
    assert [m.value for m in acc.positions] == [pytest.approx((prior * f + x) / (f + 1)) for x in (1, 1, 0)]


def test_a_copy_the_step_proposes_is_measured_by_the_step_not_twice():
    lookup, policy, state = shadowing([5, 6, 7, 8, 1, 6, 2, 5, 6, 7])
    n = lookup.match(state.committed)
    assert lookup.propose(state, None, 0, 0).candidates == []  # a plain step: the shadow stays
    assert lookup.shadow is not None
    assert lookup.propose(state, None, 2, 0).candidates == [8, 1]
    state.committed += [8, 1, 6]
    lookup.match(state.committed)
    assert policy.copy_estimates(n).steps == 0  # Policy.observe records the real step


def test_shadows_let_copies_win_on_a_steep_curve():
    """Priced at the neutral prior, a copy never beats a plain step where 2 tokens cost 1.7
    steps, and so was never measured; its shadows show it is always right, and then it runs."""
    from tests.methods.test_policy import FakeDrafter

    text = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    lookup, _, state = shadowing(text[:9], max_k=3)
    c = lookup.estimates.costs
    c.target = {1: Mean(0.030), 2: Mean(0.051), 3: Mean(0.058), 4: Mean(0.070)}
    policy = lookup.policy
    policy.steps["copy"] = 2  # past the measuring steps
    choices = []
    for token in text[9:]:
        choices.append(policy.choose(state, FakeDrafter(0), lookup.match(state.committed)).k)
        state.committed.append(token)  # a plain step commits the text's next token
    assert choices[:6] == [0] * 6  # plain steps, their shadows measuring the copies
    assert choices[-10:] == [3] * 10


# -- exactness by enumeration ---------------------------------------------------------------

PROMPT = [1, 2, 3, 1, 2]  # "abcab": the tail "ab" and "b" occurred before, so copies happen


def fixed_lookup(inner=None):
    return PromptLookup(2, adaptive=False, inner=inner)


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_lookup_is_exact(toys, settings):
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    states = []

    def make():
        method = fixed_lookup()
        start = method.start
        method.start = lambda state: (states.append(state), start(state))[1]
        return method

    got, paths = toys.method_distribution(make, PROMPT, p, max_new(settings))
    assert paths >= len(want)
    assert_same_distribution(got, want)
    assert any(state.stats.drafted for state in states)  # some steps copied candidates


@pytest.mark.parametrize("settings", SETTINGS[1:], ids=str)
@pytest.mark.parametrize("inner", ["slem", "tli"])
def test_copying_mixed_with_a_drafter_is_exact(toys, inner, settings, monkeypatch):
    """Copy and drafter steps alternate by position: the drafter must read what copies commit."""
    monkeypatch.setattr(Policy, "copy_wins",
                        lambda self, state, drafter, n: (n > 0 and len(state.committed) % 2 == 1, False))
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


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_adaptive_copies_learning_from_shadows_are_exact(toys, settings, monkeypatch):
    """Adaptive prompt lookup alone, its copy estimates learned from shadows and from the copies
    it takes, on a clock where a call of n tokens costs 0.58 + 0.42 n ms (a copy of one wins at
    the prior, and loses once a copy failed: then shadows measure): every path's timings, and so
    its choices, replay alike. Still the target's distribution."""
    import time

    from tests.methods.toys import ToySession

    now = [0.0]
    feed = ToySession.feed

    def timed_feed(self, ids, rows=None):
        now[0] += 1e-3 * (0.58 + 0.42 * len(ids))
        return feed(self, ids, rows)

    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(ToySession, "feed", timed_feed)
    settle, settled = PromptLookup._settle, set()

    def counting_settle(self, committed):
        settle(self, committed)
        if self.shadow is None:
            settled.add(id(self))

    monkeypatch.setattr(PromptLookup, "_settle", counting_settle)
    curve = {n: Mean(1e-3 * (0.58 + 0.42 * n)) for n in (1, 2, 3)}
    states = {}  # id of a method (kept alive: ids stay unique) -> (it, its DecodeState)

    def make():
        method = PromptLookup(2, adaptive=True, estimates=Estimates(Costs(target=dict(curve))))
        start = method.start
        method.start = lambda state: (states.setdefault(id(method), (method, state)), start(state))[1]
        return method

    p, tokens = params(**settings), 4
    got, _ = toys.method_distribution(make, PROMPT, p, tokens)
    assert_same_distribution(got, toys.exact_target_distribution(PROMPT, p, tokens))
    copied = {m for m, (_, state) in states.items() if state.stats.drafted}
    if not p.greedy:  # some paths copied and also had a shadow measure copies
        assert settled & copied


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
