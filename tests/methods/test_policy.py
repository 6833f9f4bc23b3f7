"""Adaptive draft length: the choice follows the measured costs, and no schedule of draft
lengths (0 included) changes what any method samples."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from anydraft.methods import (
    SpeculativeSampling,
    StringLevelExactMatch,
    StringLevelRejectionSampling,
    TokenLevelIntersection,
)
from anydraft.planning.cost import best, read_size, room
from anydraft.planning.estimates import Acceptance, Costs, Estimates, Mean
from anydraft.planning.policy import Bid, Choice, Measured, Policy, allocate
from anydraft.planning.settings import SETTINGS, Settings
from tests.methods.test_exhaustive import PROMPT, assert_same_distribution
from tests.methods.toys import params

PROBE_READ, PROBE_SHARE = Settings.probe_read, Settings.probe_share


def costs(target: dict, draft: float, read: float | None = None) -> Costs:
    c = Costs()
    for n, seconds in target.items():
        c.target[n] = Mean(seconds)
    c.draft = Mean(draft)
    if read is not None:
        c.read = Mean(read)
    return c


def acceptance(*a: float, ratio: float = 1.0) -> Acceptance:
    acc = Acceptance()
    acc.positions = [Mean(x) for x in a]
    acc.ratio = Mean(ratio)
    return acc


class FakeState:
    """Enough of a DecodeState for Policy.choose."""

    def __init__(self, budget=100):
        from anydraft.decoding.stats import Stats

        self.stats = Stats()
        self.committed = [0] * 10
        self.budget = budget
        self.target = type("T", (), {"max_length": 1000})()


class FakeDrafter:
    batch = None

    def __init__(self, behind):
        self.behind = behind

    def behind_up_to(self, most):
        return min(self.behind, most) if most else self.behind


def policy(c: Costs, acc: Acceptance, max_k=5, adaptive=True, context=0, steps=2) -> Policy:
    p = Policy(max_k, adaptive, Estimates(c), greedy=True, draft=acc, context=context)
    p.steps["draft"] = steps  # past the measuring steps
    return p


def run(p: Policy, state, drafter=None, *, target=0.1, draft=0.0, calls=0, accepted=0, read=0) -> Choice:
    """One step as the loop runs it: choose, then observe what the step measured."""
    choice = p.choose(state, drafter)
    p.observe(choice, Measured(wall=target + draft, draft=draft, target=target, calls=calls,
                               scored=1 + choice.k, offered=choice.k, accepted=min(accepted, choice.k),
                               read=read))
    return choice


def steady(p: Policy, state, drafter=None) -> Choice:
    """A step that measures exactly what the estimates say: only the schedule moves."""
    c = p.estimates.costs
    k = p.choose(state, drafter).k
    return run(p, state, drafter, target=c.target_seconds(1 + k), draft=c.draft.value * k, calls=k)


def test_expected_tokens_multiplies_the_acceptance_along_the_draft():
    assert acceptance(0.5).expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)  # constant a
    assert acceptance(0.5, 0.8).expected_tokens(3) == pytest.approx(1 + 0.5 + 0.4 + 0.32)
    assert acceptance(0.5, 0.8).expected_tokens(1.5) == pytest.approx(1 + 0.5 + 0.5 * 0.4)
    assert acceptance(0.0).expected_tokens(5) == 1
    assert acceptance(1.0).expected_tokens(3) == 4


def test_acceptance_counts_only_the_positions_a_step_reached():
    acc = Acceptance()
    acc.add(4, 1)  # position 1 accepted, 2 rejected, 3 and 4 never judged
    a1, a2, a3, a4 = (p.value for p in acc.positions)
    assert a1 > acc.a(0) > a2 and a3 == a4 == Acceptance().a(1)  # unjudged: the prior
    acc.add(2, 2)  # both accepted: nothing rejected
    assert acc.positions[1].value > a2 and acc.a(9) == acc.a(4)


def test_target_cost_curve_interpolates_and_extrapolates():
    c = costs({1: 1.0, 5: 2.0}, draft=0.1)
    assert c.target_seconds(3) == pytest.approx(1.5)
    assert c.target_seconds(9) == pytest.approx(3.0)
    assert costs({3: 2.0}, 0.1).target_seconds(7) == 2.0  # one size seen: flat
    assert Costs().target_seconds(1) is None


def test_target_cost_curve_keeps_a_bend_that_a_line_would_blur():
    """Qwen-1.5B on llama.cpp (Xeon, session 34): 1 token 85 ms, 2 tokens 136, 3 tokens 166, 5
    tokens 190. A line through these put T(1) at 103 ms and T(2) at 124, so a 1-token draft
    (20 ms, accepted 65% of the time) looked faster than a plain step, and ran at 0.86x it.
    Drawn through its sizes, the curve keeps both, and the policy decodes plainly."""
    c = Costs(draft=Mean(0.020))
    for n, seconds, calls in ((1, 0.085, 30), (2, 0.136, 30), (3, 0.166, 3), (5, 0.190, 5)):
        for _ in range(calls):
            c.add_target(n, seconds)
    assert c.target_seconds(1) == pytest.approx(0.085, rel=0.02)
    assert c.target_seconds(2) == pytest.approx(0.136, rel=0.02)
    assert c.target_seconds(4) == pytest.approx((0.166 + 0.190) / 2, rel=0.05)
    assert c.target_seconds(9) > c.target_seconds(5)  # past the last size: the line's slope
    assert best(1, c, acceptance(0.65))[0] == 0
    steps = [c.target_seconds(n / 4) for n in range(1, 41)]
    assert steps == sorted(steps)  # never falls


@pytest.mark.parametrize("case, want", [
    # cheap drafter, high acceptance, flat target curve: draft the most
    (dict(target={1: 0.2, 6: 0.21}, draft=0.01, a=0.9), 8),
    # a drafter as slow as the target: never worth it
    (dict(target={1: 0.2, 6: 0.25}, draft=0.2, a=0.6), 0),
    # scoring costs M times one token (a compute-bound target): never worth it
    (dict(target={1: 0.03, 9: 0.27}, draft=0.009, a=0.7), 0),
    # poor acceptance: plain steps
    (dict(target={1: 0.2, 6: 0.3}, draft=0.03, a=0.1), 0),
])
def test_choice_follows_the_costs(case, want):
    assert best(8, costs(case["target"], case["draft"]), acceptance(case["a"]))[0] == want


def test_middle_ground_picks_a_short_draft():
    assert 1 <= best(8, costs({1: 0.2, 3: 0.24, 9: 0.6}, 0.03), acceptance(0.6))[0] < 8


def test_rising_acceptance_favours_long_drafts():
    """The same first position; acceptance that rises along the draft makes long drafts pay."""
    c = costs({1: 0.09, 6: 0.106}, 0.01)
    assert best(5, c, acceptance(0.5))[0] == 2
    assert best(5, c, acceptance(0.5, 0.9, 0.9, 0.9, 0.9))[0] == 5


seconds = st.floats(0.001, 1.0)
share = st.floats(0.0, 1.0)


@given(t1=seconds, slope=st.floats(0.0, 0.2), d=seconds, a=share, cheaper=st.floats(0.1, 1.0))
def test_a_cheaper_drafter_or_better_acceptance_never_drafts_less(t1, slope, d, a, cheaper):
    """Properties of `best`, whatever the costs: the chosen k maximises the expected rate,
    and it does not shrink when drafts get cheaper or more likely to be accepted."""
    target = {1: t1, 9: t1 + 8 * slope * t1}
    k, rate = best(8, costs(target, d), acceptance(a))
    assert rate >= best(0, costs(target, d), acceptance(a))[1]  # never below a plain step
    assert best(8, costs(target, d * cheaper), acceptance(a))[0] >= k
    assert best(8, costs(target, d), acceptance(min(1.0, a + 0.1)))[0] >= k


@given(backlog=st.integers(0, 5000), budget=st.integers(1, 5000))
def test_a_backlog_never_makes_drafting_more_attractive(backlog, budget):
    c = costs({1: 0.09, 6: 0.1}, 0.01, read=0.002)
    assert best(5, c, acceptance(0.7), budget=budget, backlog=backlog)[0] <= \
        best(5, c, acceptance(0.7), budget=budget)[0]


def test_probes_waste_at_most_a_share_of_the_plain_time_across_requests():
    """When speculation loses, drafting resumes only as probes, each once the plain steps before
    it have cost enough that the probe wastes at most PROBE_SHARE of their time; the count
    carries over to the pair's next request."""
    c, acc = costs({1: 0.2, 6: 0.25}, 0.05), acceptance(0.1)
    ks = []
    for request in range(2):  # a new Policy per request, the pair's estimates shared
        p = policy(c, acc)
        ks += [steady(p, FakeState()).k for _ in range(60 if request == 0 else 120)]
    probes = [i for i, k in enumerate(ks) if k]
    waste = 5 * 0.05 + 0.25 - 0.2  # were none of its drafts kept
    first = probes[0]  # 75 plain steps (give or take rounding)
    assert abs(first - waste / (0.2 * PROBE_SHARE)) <= 1 and first > 60  # in the second request
    assert len(probes) == 2 and abs(probes[1] - (2 * first + 1)) <= 1  # as many again
    assert all(ks[i] == 5 for i in probes)
    assert best(5, c, acc)[0] == 0  # nothing learned here: the probes are the schedule's own


def test_fixed_plan_always_drafts_k():
    p = policy(Costs(), Acceptance(), max_k=4, adaptive=False, steps=0)
    for _ in range(3):
        assert run(p, FakeState(), accepted=2).k == 4
    assert not p.estimates.costs.target  # nothing learned


def test_adaptive_plan_learns_costs_and_acceptance():
    p = policy(Costs(), Acceptance(), max_k=4, steps=0)
    state = FakeState()
    for target in (9.0, 0.1, 0.1, 0.1, 0.1):  # the first target call also reads the prompt
        run(p, state, target=target, draft=0.04, calls=4, accepted=3)  # (step 1: a plain one)
    c = p.estimates.costs
    assert c.target[5].value == pytest.approx(0.1)
    assert c.draft.value == pytest.approx(0.01)
    assert p.draft.a(1) > 0.8 and p.draft.a(4) < 0.2  # 3 of 4 accepted, five times


def test_reading_a_long_prompt_is_paid_for_by_the_tokens_still_wanted():
    """A drafter 1000 tokens behind at 2 ms a token: not worth it for 20 tokens, worth it for 2000."""
    c = costs({1: 0.09, 6: 0.1}, 0.01, read=0.002)
    acc = acceptance(0.7)
    assert best(5, c, acc, budget=20, backlog=1000)[0] == 0
    assert best(5, c, acc, budget=2000, backlog=1000)[0] > 0
    assert best(5, c, acc, budget=20, backlog=2)[0] > 0  # in step: nothing to read
    # through choose(): the drafter's own backlog counts
    assert policy(c, acc).choose(FakeState(budget=20), FakeDrafter(behind=1000)).k == 0


def test_read_cost_is_learned_from_the_first_pass():
    c = costs({1: 0.09, 6: 0.1}, 0.01)
    p = policy(c, acceptance(0.7), max_k=4)
    # the first of 4 passes read 100 tokens: 0.5 s more
    run(p, FakeState(), FakeDrafter(behind=0), draft=0.04 + 0.5, calls=4, accepted=3, read=100)
    assert c.read.value == pytest.approx(0.005) and c.draft.value == pytest.approx(0.01)


# -- any schedule of draft lengths is exact ------------------------------------------------

@pytest.mark.parametrize("context", [64, 1], ids=lambda n: f"drafter_context={n}")
@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "sd"])
def test_varying_draft_lengths_keep_the_distribution_exact(toys, method, context, monkeypatch):
    """k = 0, 1, 2 by position (a plain step included) through the real loop, enumerated; with
    a 1-token drafter context the backlog a plain step leaves is cut to its last token, and
    the k = 1 steps, like a probe, first trim the backlog to its last token."""
    from tests.methods.toys import TARGET_VOCAB, ToySession

    def choose(self, state, drafter=None, match=0):
        k = min(len(state.committed) % 3, room(state))
        return Choice("draft", k, 1 if k == 1 else 0, self.draft)

    monkeypatch.setattr(Policy, "choose", choose)
    p = params(temperature=0.8, top_k=4)
    want = toys.exact_target_distribution(PROMPT, p, 3)
    pairing = dataclasses.replace(toys.pairing(num_draft_tokens=2), drafter_context=context)
    if method == "sd":
        pairing = dataclasses.replace(
            pairing, drafter_table=toys.target_table, drafter_vocab_size=len(TARGET_VOCAB),
            new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    make = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
            "slrs": StringLevelRejectionSampling, "sd": SpeculativeSampling}[method]
    got, _ = toys.method_distribution(lambda: make(pairing), PROMPT, p, 3)
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", [dict(temperature=0.8, top_k=4), dict(temperature=0.0)], ids=str)
@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "sd"])
def test_stopping_on_the_drafters_confidence_keeps_the_distribution_exact(toys, method, settings):
    """--draft-confidence: drafting stops before a position where the drafter is unsure (a
    function of the drafts alone); the output must not change."""
    from anydraft.methods.drafter import Drafter
    from tests.methods.toys import TARGET_VOCAB, ToySession

    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, 3)
    pairing = dataclasses.replace(toys.pairing(num_draft_tokens=2), confidence=0.75)
    if method == "sd":
        pairing = dataclasses.replace(
            pairing, drafter_table=toys.target_table, drafter_vocab_size=len(TARGET_VOCAB),
            new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0),
            confidence=0.5)  # the sd toy drafter is less sure
    short = []  # whether each draft stopped before k (below the threshold, or at EOS)
    propose = Drafter.propose

    def spy(self, k, *args, **kwargs):
        tokens, dists = propose(self, k, *args, **kwargs)
        short.append(len(tokens) < k)
        return tokens, dists

    Drafter.propose = spy
    try:
        make = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
                "slrs": StringLevelRejectionSampling, "sd": SpeculativeSampling}[method]
        got, _ = toys.method_distribution(lambda: make(pairing), PROMPT, p, 3)
    finally:
        Drafter.propose = propose
    assert_same_distribution(got, want)
    assert True in short  # the threshold stopped some drafts


def test_a_probe_reads_only_the_end_of_a_backlog_and_waits_for_that_read():
    """A drafter 100 tokens behind at 2 ms a token: the probe reads only the last PROBE_READ
    (16: 0.032 s), and waits for that much more plain time: 0.332 s of waste at 0.004 s of
    allowance per plain step (0.3 s without a backlog: 75 steps)."""
    c, acc = costs({1: 0.2, 6: 0.25}, 0.05, read=0.002), acceptance(0.1)
    p = policy(c, acc)
    choices = [steady(p, FakeState(), FakeDrafter(behind=100)) for _ in range(120)]
    probes = [i for i, choice in enumerate(choices) if choice.k]
    assert len(probes) == 1 and abs(probes[0] - 83) <= 1
    assert choices[probes[0]].read == PROBE_READ  # the drafter trims its backlog to this


@pytest.mark.parametrize("read_seconds, read", [(0.002, 45), (0.001, 64), (0.02, PROBE_READ)])
def test_a_draft_reads_as_much_of_a_backlog_as_one_plain_step_costs(read_seconds, read):
    """0.09 s plain steps: at 2 ms a token a draft reads the last 45 tokens of a 1000-token
    backlog, at 1 ms the whole context (64), at 20 ms no fewer than a probe's PROBE_READ;
    the read is priced at what is read."""
    c = costs({1: 0.09, 6: 0.1}, 0.01, read=read_seconds)
    p = policy(c, acceptance(0.9), context=64)
    state = FakeState(budget=2000)
    state.stats.new_tokens = 50
    drafter = FakeDrafter(behind=1000)
    assert read_size(c, 64) == read and p.backlog(drafter) == read
    choice = p.choose(state, drafter)
    assert choice.k > 0 and choice.read == read
    assert read_size(c, 0) == 0 and policy(c, acceptance(0.9), context=0).backlog(drafter) == 1000


def test_a_probe_after_plain_steps_outweighs_the_stale_drafter_cost():
    """A drafter measured slow under a transient load: after 64 plain steps one probe at its
    real speed moves the estimate most of the way back (a mean worth 10 steps, unfaded, would
    move a tenth of the way)."""
    c = Costs()
    for _ in range(30):
        c.draft.add(0.04)  # slowed by another job
    c.target[1] = Mean(0.1)
    p = policy(c, acceptance(0.7), max_k=4)
    for _ in range(64):  # plain steps: the drafter does not run
        p.observe(Choice("draft", 0, acc=p.draft), Measured(0.1, 0, 0.1, 0, 1, 0, 0, 0))
    assert c.draft.value == pytest.approx(0.04)  # faded, not changed
    p.observe(Choice("draft", 4, acc=p.draft, ran=True), Measured(0.14, 0.04, 0.1, 4, 5, 4, 4, 0))
    assert c.draft.value < 0.02


def test_a_backlog_is_read_only_once_the_answer_has_earned_it():
    """Ski rental: 1000 tokens to read at 2 ms (2 s) against 0.09 s plain steps. Worth it for
    2000 tokens wanted, but only read after 23 plain tokens, so an answer that stops at 10
    never pays; renting does not count as drafting losing (no probe is owed for it)."""
    c = costs({1: 0.09, 6: 0.1}, 0.01, read=0.002)
    p = policy(c, acceptance(0.7))
    drafter = FakeDrafter(behind=1000)
    state = FakeState(budget=2000)
    assert best(5, c, p.draft, budget=state.budget, backlog=p.backlog(drafter))[0] > 0
    ks = []
    for generated in range(30):
        state.stats.new_tokens = generated
        choice = p.choose(state, drafter)
        assert not choice.waited
        ks.append(choice.k)
    assert ks[:23] == [0] * 23 and all(k > 0 for k in ks[23:])


# -- rows that share one target call ---------------------------------------------------------

def bids(c: Costs, acc: Acceptance, rows: int, k: int = 5) -> list[Bid]:
    """``rows`` alike rows, each choosing up to k drafts on its own."""
    return [Bid(Choice("draft", k, 0, acc, True), c) for _ in range(rows)]


def test_a_draft_must_win_by_the_margin():
    """A draft predicted to beat a plain step by less than `Settings.min_gain` is not taken
    (its estimates' noise would make it lose on average); by more, it is."""
    acc = acceptance(0.9)
    # T(n) = 0.02 + 0.1 n: k = 1 commits 1.9 tokens in 0.221 s against 1 in 0.12 s, 3% more
    assert best(5, costs({1: 0.12, 9: 0.92}, 0.001), acc)[0] == 0
    # T(n) = 0.05 + 0.1 n: 1.9 in 0.251 s against 1 in 0.15 s, 13% more
    assert best(5, costs({1: 0.15, 9: 0.95}, 0.001), acc)[0] > 0


@given(t1=seconds, slope=st.floats(0.0, 0.3), d=st.floats(0.0001, 0.5), a=st.lists(share, min_size=1, max_size=6),
       overhead=st.floats(0.0, 0.3), plain=st.floats(0.0, 0.1), backlog=st.integers(0, 300),
       budget=st.integers(1, 500))
def test_one_row_alone_drafts_as_best(t1, slope, d, a, overhead, plain, backlog, budget):
    """Whatever the costs, one row's allocation is `best`'s k, even where one draft loses and
    several win (acceptance rising along the draft, a drafting overhead, a backlog to read)."""
    c = costs({1: t1, 9: t1 + 8 * slope * t1}, d * t1, read=0.01 * d * t1)
    c.plain_overhead = Mean(plain * t1)
    acc = acceptance(*a)
    acc.overhead = Mean(overhead * t1)
    row = Bid(Choice("draft", 8, 0, acc, True), c, backlog=backlog, budget=budget)
    assert allocate([row]) == [best(8, c, acc, budget=budget, backlog=backlog)[0]]


def test_rows_that_fill_the_call_draft_less():
    """A target whose call costs 0.1 s plus 5 ms a token: one row drafts all 5, two rows a
    little less, eight rows (who fill the call between them) none. On a flat curve drafts
    cost only their drafter passes (one row after another): a cheap drafter keeps drafting."""
    c, acc = costs({1: 0.1, 9: 0.14}, 0.01), acceptance(0.8)
    assert best(5, c, acc)[0] == 5
    assert allocate(bids(c, acc, 1)) == [5]
    assert 0 < sum(allocate(bids(c, acc, 2))) < 10
    assert allocate(bids(c, acc, 8)) == [0] * 8
    flat = costs({1: 0.1, 9: 0.1}, 0.001)
    assert allocate(bids(flat, acc, 8)) == [5] * 8


@pytest.mark.parametrize("rows", [2, 3, 8])
def test_a_linear_curve_batches_plainly(rows, monkeypatch):
    """A call that costs little besides its tokens (T(n) = 0.02 + 0.1 n): alone, a row with a
    cheap, well-accepted drafter drafts (the call's fixed cost, spread over more tokens);
    a few rows already spread it, and draft nothing. (The single row gains 3%: below the
    margin a draft must win by, which the next test covers; set aside here.)"""
    monkeypatch.setattr(SETTINGS, "min_gain", 0.0)
    c, acc = costs({1: 0.12, 9: 0.92}, 0.001), acceptance(0.9)
    assert best(5, c, acc)[0] > 0 and allocate(bids(c, acc, 1)) == [best(5, c, acc)[0]]
    assert allocate(bids(c, acc, rows)) == [0] * rows
    assert allocate(bids(costs({1: 0.1, 9: 0.9}, 0.001), acc, 1)) == [0]  # T(n) = 0.1 n: never


@given(t1=seconds, slope=st.floats(0.0, 0.3), d=st.floats(0.0001, 0.5), a=st.lists(share, min_size=1, max_size=5),
       overhead=st.floats(0.0, 0.3))
def test_adding_rows_never_lengthens_drafts(t1, slope, d, a, overhead):
    c, acc = costs({1: t1, 9: t1 + 8 * slope * t1}, d * t1), acceptance(*a)
    acc.overhead = Mean(overhead * t1)
    before = allocate(bids(c, acc, 1, 8))
    for rows in range(2, 7):
        ks = allocate(bids(c, acc, rows, 8))
        assert all(k <= was for k, was in zip(ks, before, strict=False)) and max(ks) <= max(before)
        before = ks


def test_drafters_that_draft_together_cost_the_longest_draft():
    """On a flat target curve with a drafter pass a fifth of a call, drafters one row after
    another make eight rows stop drafting; drafting together (one pass for all rows,
    `Bid.together`), they draft as one row alone does."""
    from dataclasses import replace

    c, acc = costs({1: 0.1, 9: 0.1}, 0.02), acceptance(0.8)
    alone = allocate(bids(c, acc, 1))
    assert alone[0] > 0 and sum(allocate(bids(c, acc, 8))) < 8 * alone[0]
    assert allocate([replace(b, together=True) for b in bids(c, acc, 8)]) == alone * 8


def test_one_probe_per_shared_call():
    """Rows of one pair share its estimates, so a probe falls due for all at once: in one
    call, the first row probes and the others sit the step out (their idle counts grow)."""
    from types import SimpleNamespace

    from anydraft.methods.row import Row
    from anydraft.planning.call import Call, plan

    acc = acceptance(0.8)

    class Probing:
        estimates, adaptive = SimpleNamespace(costs=Costs()), True

        def choose(self, state, drafter, match):
            return Choice("draft", 5, PROBE_READ, acc, True, probe=True)

        def bid(self, choice, state, drafter):
            return Bid(choice, self.estimates.costs, fixed=True)

    rows = [Row(SimpleNamespace(committed=[1], pending=[1]), Probing()) for _ in range(3)]
    first, *others = plan(rows, [Call([0, 1, 2])])
    assert first.probe and first.k == 5
    assert all(c.k == 0 and not c.probe for c in others)
    assert [acc in c.waited for c in others] == [True, False]  # the call's step counts once
    assert plan(rows[:1], [Call([0])])[0].probe  # alone, it probes


@pytest.mark.parametrize("rows, context, reads, drafting", [
    (2, 64, [22, 22], 2),  # half each
    (4, 64, [22, 22, 0, 0], 2),  # a quarter (11) is less than a probe reads: two at a time
    (1, 64, [45], 1),  # alone: all it would read
    (3, 0, [0, 0, 0], 1),  # whole reads (context 0): one a call, the others decode plainly
])
def test_long_drafter_reads_of_one_call_share_one_reads_worth(rows, context, reads, drafting):
    """Every row of a call waits for all its drafters' reads: rows whose drafters are 100
    tokens behind read, together, the 45 tokens one plain step costs to read (0.09 s at 2 ms a
    token), each at least PROBE_READ, as many at once as that holds, the others plainly until
    their turn (``reads``: the last tokens each reads, 0 all). Whether a drafter reads its
    prompt or what was committed while it sat drafting out is all one."""
    from anydraft.methods.row import Row
    from anydraft.planning.call import Call, plan

    c, acc = costs({1: 0.09, 6: 0.1}, 0.01, read=0.002), acceptance(0.9)
    acc.positions[0] = Mean(0.9, 10.0)  # well measured: every row may draft on it
    batch = []
    for i in range(rows):
        state = FakeState(budget=2000)
        state.stats.new_tokens, state.stats.drafter_calls, state.pending = 50, i % 2, [1]
        batch.append(Row(state, policy(c, acc, context=context), drafter=FakeDrafter(behind=100)))
    choices = plan(batch, [Call(list(range(rows)))])
    assert [choice.read for choice in choices] == reads
    assert [choice.k > 0 for choice in choices] == [i < drafting for i in range(rows)]


def test_fixed_rows_keep_their_drafts_and_fill_the_call():
    """A probe and an untimed drafter keep their k, and the row beside them drafts less than
    alone (5); so it does beside a plain row (no drafter, nothing measured)."""
    c, acc = costs({1: 0.1, 9: 0.14}, 0.01), acceptance(0.8)
    assert allocate(bids(c, acc, 1)) == [5]
    probe = Bid(Choice("draft", 5, PROBE_READ, acc, True, probe=True), c, fixed=True)
    untimed = Bid(Choice("draft", 5, 0, acc, True), costs({1: 0.1, 9: 0.14}, 0.01))
    untimed.costs.draft = Mean()
    first, k, last = allocate([probe, *bids(c, acc, 1), untimed])
    assert first == last == 5 and k < 5
    k, plain = allocate([*bids(c, acc, 1), Bid(Choice("plain", 0), Costs())])
    assert plain == 0 and 0 < k < 5
    assert allocate(bids(Costs(), acc, 3)) == [5] * 3  # no curve yet: draft, and learn from it


def test_a_measured_profile_shares_the_first_calls_as_the_hardware_allows():
    """Before the pair's own target calls are timed (its drafter is), the target's measured
    cost curve (hardware/profile.py) decides: where 4 tokens cost what 1 does, 4 rows draft
    fully from the first shared call; where each token costs as much as a call, they draft
    less (here: nothing), where a policy without a profile, knowing nothing, drafts fully.
    The pair's own calls then take over from the profile."""
    acc, sizes = acceptance(0.8), (1, 2, 5, 9, 17, 33)

    def seeded(profile: dict) -> Costs:
        return Costs(draft=Mean(0.001), profile=profile)

    flat, steep = seeded({m: 0.1 for m in sizes}), seeded({m: 0.1 * m for m in sizes})
    assert allocate(bids(flat, acc, 4)) == [5] * 4 and best(5, flat, acc)[0] == 5
    assert allocate(bids(steep, acc, 4)) == [0] * 4 and best(5, steep, acc)[0] == 0
    assert allocate(bids(seeded({}), acc, 4)) == [5] * 4 and best(5, seeded({}), acc)[1] is None
    for _ in range(30):  # the call costs the same at 4 and at 24 tokens: drafts are free
        steep.add_target(4, 0.1)
        steep.add_target(24, 0.1)
    assert allocate(bids(steep, acc, 4)) == [5] * 4


def test_a_cut_choice_sits_the_step_out():
    acc = acceptance(0.8)
    choice = Choice("draft", 5, 40, acc, True)
    assert choice.cut(5) is choice and choice.cut(3) == Choice("draft", 3, 40, acc, True)
    assert choice.cut(0) == Choice("draft", 0, 0, acc, False, (acc,))  # its idle count grows


def toy_rows(toys, make, prompts, settings):
    """Rows of one `SerialBatch` of toy targets, each made by ``make(pairing)`` (one adaptive
    pairing shared, as a Decoder shares it); the batch records each call's tokens."""
    from anydraft.decoding import DecodeState
    from anydraft.models.batch import RowView, SerialBatch

    class Counting(SerialBatch):
        def feed_rows(self, feeds, rows):
            self.tokens.append(sum(len(ids) for ids in feeds.values()))
            return super().feed_rows(feeds, rows)

    pairing = dataclasses.replace(toys.pairing(num_draft_tokens=3), adaptive=True)
    batch = Counting(toys.target_session, len(prompts))
    batch.tokens = []
    rows = [make(pairing).start(DecodeState(RowView(batch), list(prompt), params(**settings),
                                            torch.Generator().manual_seed(i)))
            for i, prompt in enumerate(prompts)]
    return rows, batch, pairing


def run_rows(rows, eos, steps=40, length=40) -> list[list[int]]:
    """Step the rows together, as `decode_batch` does, each to ``length`` tokens or an EOS;
    each row's new tokens."""
    from anydraft.decoding.step import step

    news = [[] for _ in rows]
    for _ in range(steps):
        live = [i for i, row in enumerate(rows) if len(row.state.committed) < length and not eos & set(news[i])]
        for i in live:
            rows[i].state.budget = length - len(rows[i].state.committed)
        for i, result in zip(live, step([rows[i] for i in live]) if live else [], strict=True):
            rows[i].state.committed.extend(result.tokens)
            news[i] += result.tokens
    return news


def test_a_shared_call_is_recorded_once_at_its_total_tokens(toys):
    """Three rows, one call per step: the pair's cost curve gets one measurement per call, at
    the tokens of all three rows together, from the second step on (the first reads the
    prompts)."""
    recorded = []

    class Spy(dict):
        def setdefault(self, n, default=None):
            recorded.append(n)
            return super().setdefault(n, default)

    rows, batch, pairing = toy_rows(toys, StringLevelExactMatch, [PROMPT, [1, 2], [3, 3, 3, 1]], {})
    pairing.estimates.costs.target = Spy()
    run_rows(rows, toys.target_table.eos_ids, steps=6, length=60)
    assert len(batch.tokens) == 6 and recorded == batch.tokens[1:]


@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "lookup"])
def test_rows_of_a_call_keep_their_output_under_any_allocation(toys, method, monkeypatch):
    """Random joint draft lengths (any cut of each row's own choice) leave every row's greedy
    output the target's own, as plain decoding of the same rows gives it."""
    import random

    from anydraft.methods.ar import Autoregressive
    from anydraft.methods.lookup import PromptLookup
    from anydraft.planning import call as call_module

    def make(pairing):
        if method == "lookup":  # with a drafter: copies and drafts
            return PromptLookup(3, True, StringLevelExactMatch(pairing), pairing.estimates)
        return {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
                "slrs": StringLevelRejectionSampling}[method](pairing)

    prompts = [PROMPT, [2, 3], [1, 2, 3, 1, 2, 3, 1], [3]]
    rng = random.Random(0)
    cuts = []

    def allocate(bids):
        cuts.extend(b.choice.k for b in bids)
        return [rng.randint(0, b.choice.k) for b in bids]

    monkeypatch.setattr(call_module, "allocate", allocate)
    drafted = toy_rows(toys, make, prompts, dict(temperature=0.0))[0]
    plain = toy_rows(toys, lambda pairing: Autoregressive(), prompts, dict(temperature=0.0))[0]
    eos = toys.target_table.eos_ids
    drafted, plain = run_rows(drafted, eos), run_rows(plain, eos)
    assert any(cuts)  # rows chose drafts, and the allocation cut them at random
    for d, p in zip(drafted, plain, strict=True):
        assert d[:len(p)] == p  # (a drafting step may commit tokens after an EOS)


def test_drafting_pays_only_where_a_draft_could_beat_a_plain_step():
    """`auto` keeps a drafter where some draft could pay at a high acceptance (decoder.py
    `_useful`): the curves of issue 59 (Zen 3, 2 cores, Qwen2.5-1.5B, in one-token steps) with
    SmolLM2 as drafter (c = 0.16)."""
    from anydraft.planning.cost import drafting_pays

    ik = {1: 1.0, 2: 1.10, 3: 1.24, 4: 1.41, 5: 1.57}
    llama = {1: 1.0, 2: 1.77, 3: 2.37, 4: 3.08, 5: 3.39}
    linear = {m: float(m) for m in range(1, 10)}  # M tokens cost M steps
    assert drafting_pays(ik, 0.16, 0.9) and drafting_pays(ik, 0.16, 0.5)
    assert drafting_pays(llama, 0.16, 0.9)  # 3 tokens for 2.37 steps: 2.71 tokens for 2.69
    assert not drafting_pays(llama, 0.16, 0.5)
    assert not drafting_pays(linear, 0.16, 0.9)  # nothing pays where verification is linear
    assert drafting_pays(linear, 0.0, 0.9) is False  # even a free drafter: E(k) < k + 1
    assert not drafting_pays(ik, 1.2, 0.9)  # a drafter slower than the target
