"""Adaptive draft length: the choice follows the measured costs, and no schedule of draft
lengths (0 included) changes what any method samples."""

import pytest

from anydraft.methods import (
    SpeculativeSampling,
    StringLevelExactMatch,
    StringLevelRejectionSampling,
    TokenLevelIntersection,
)
from anydraft.methods.policy import (
    PROBE_CONTEXT,
    PROBE_SHARE,
    Acceptance,
    Costs,
    DraftPlan,
    _Mean,
    room,
)
from tests.methods.test_exhaustive import PROMPT, assert_same_distribution
from tests.methods.toys import Toys, params


def costs(target: dict, draft: float) -> Costs:
    c = Costs()
    for n, seconds in target.items():
        c.target[n] = _Mean(seconds)
    c.draft = _Mean(draft)
    return c


def acceptance(*a: float, ratio: float = 1.0) -> Acceptance:
    acc = Acceptance()
    acc.positions = [_Mean(x) for x in a]
    acc.ratio = _Mean(ratio)
    return acc


def test_expected_tokens_multiplies_the_acceptance_along_the_draft():
    assert acceptance(0.5).expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)  # constant a
    assert acceptance(0.5, 0.8).expected_tokens(3) == pytest.approx(1 + 0.5 + 0.4 + 0.32)
    assert acceptance(0.5, 0.8).expected_tokens(1.5) == pytest.approx(1 + 0.5 + 0.5 * 0.4)
    assert acceptance(0.0).expected_tokens(5) == 1
    assert acceptance(1.0).expected_tokens(3) == 4
    assert Acceptance().expected_tokens(1) == 1.5  # prior


def test_acceptance_counts_only_the_positions_a_step_reached():
    acc = Acceptance()
    acc.add(4, 1)  # position 1 accepted, 2 rejected, 3 and 4 never judged
    # prior 0.5 worth one step, forgetting 0.9: (0.5 * 0.9 + 1) / 1.9
    assert [round(p.value, 3) for p in acc.positions] == [0.763, 0.237, 0.5, 0.5]
    acc.add(2, 2)  # both accepted: nothing rejected
    assert acc.a(2) > 0.25 and acc.a(9) == acc.a(4)


def test_target_cost_curve_interpolates_and_extrapolates():
    c = costs({1: 1.0, 5: 2.0}, draft=0.1)
    assert c.target_seconds(3) == pytest.approx(1.5)
    assert c.target_seconds(9) == pytest.approx(3.0)
    assert costs({3: 2.0}, 0.1).target_seconds(7) == 2.0  # one size seen: flat
    assert Costs().target_seconds(1) is None


@pytest.mark.parametrize("case, want", [
    # cheap drafter, high acceptance, flat target curve (PyTorch bf16): draft the most
    (dict(target={1: 0.2, 6: 0.21}, draft=0.01, a=0.9), 8),
    # a drafter as slow as the target: never worth it
    (dict(target={1: 0.2, 6: 0.25}, draft=0.2, a=0.6), 0),
    # scoring costs M times one token (llama.cpp target on 2 cores): never worth it
    (dict(target={1: 0.03, 9: 0.27}, draft=0.009, a=0.7), 0),
    # poor acceptance: plain steps
    (dict(target={1: 0.2, 6: 0.3}, draft=0.03, a=0.1), 0),
])
def test_choice_follows_the_costs(case, want):
    plan = DraftPlan(8, True, costs(case["target"], case["draft"]), acceptance(case["a"]))
    assert plan.best()[0] == want


def test_middle_ground_picks_a_short_draft():
    plan = DraftPlan(8, True, costs({1: 0.2, 3: 0.24, 9: 0.6}, 0.03), acceptance(0.6))
    assert 1 <= plan.best()[0] < 8


def test_rising_acceptance_favours_long_drafts():
    """The same first position; acceptance that rises along the draft makes long drafts pay."""
    c = costs({1: 0.09, 6: 0.106}, 0.01)
    assert DraftPlan(5, True, c, acceptance(0.5)).best()[0] == 2
    assert DraftPlan(5, True, c, acceptance(0.5, 0.9, 0.9, 0.9, 0.9)).best()[0] == 5


class FakeState:
    """Enough of a DecodeState for DraftPlan.k/close."""

    def __init__(self):
        from anydraft.decoding.stats import Stats

        self.stats = Stats()
        self.committed = [0] * 10
        self.budget = 100
        self.pending = [0]
        self.target = type("T", (), {"max_length": 1000, "rollback": lambda self, n: None})()


def test_probes_waste_at_most_a_share_of_the_plain_time_across_requests():
    """When speculation loses, drafting resumes only as probes, each once the plain steps before
    it have cost enough that the probe wastes at most PROBE_SHARE of their time; the count
    carries over to the pair's next request."""
    c, acc = costs({1: 0.2, 6: 0.25}, 0.05), acceptance(0.1)
    state = FakeState()
    ks = []
    for request in range(2):
        plan = DraftPlan(5, True, c, acc)
        plan.steps = 2  # past the measuring steps
        ks += [plan.k(state) for _ in range(60 if request == 0 else 120)]
    probes = [i for i, k in enumerate(ks) if k]
    waste = 5 * 0.05 + 0.25 - 0.2  # were none of its drafts kept
    first = probes[0]  # 75 plain steps (give or take rounding)
    assert abs(first - waste / (0.2 * PROBE_SHARE)) <= 1 and first > 60  # in the second request
    assert probes == [first, 2 * first + 1] and all(ks[i] == 5 for i in probes)
    assert plan.best()[0] == 0  # nothing learned here: the probes are the schedule's own


def test_fixed_plan_always_drafts_k():
    plan = DraftPlan(4, False, Costs(), Acceptance())
    state = FakeState()
    for _ in range(3):
        assert plan.k(state) == 4
        plan.close(state, [1, 2, 3, 4], 2)
    assert state.stats.drafted == 12 and not plan.costs.target  # nothing learned


def test_adaptive_plan_learns_costs_and_acceptance():
    plan = DraftPlan(4, True, Costs(), Acceptance())
    state = FakeState()
    for target in (9.0, 0.1, 0.1, 0.1, 0.1):  # the first target call also reads the prompt
        plan.k(state)
        state.stats.drafter_calls += 4
        state.stats.phase_seconds["target"] += target
        state.stats.phase_seconds["draft"] += 0.04
        plan.close(state, [1, 2, 3, 4], 3)
    assert plan.costs.target[5].value == pytest.approx(0.1)
    assert plan.costs.draft.value == pytest.approx(0.01)
    assert plan.acc.a(1) > 0.8 and plan.acc.a(4) < 0.2  # 3 of 4 accepted, five times


class FakeDrafter:
    def __init__(self, behind, context=0):
        self.behind, self.context, self.caught_up = behind, context, 0

    def trim(self, context):
        self.behind = min(self.behind, context)


def test_reading_a_long_prompt_is_paid_for_by_the_tokens_still_wanted():
    """A drafter 1000 tokens behind at 2 ms a token: not worth it for 20 tokens, worth it for 2000."""
    c = costs({1: 0.09, 6: 0.1}, 0.01)
    c.catch_up = _Mean(0.002)
    plan = DraftPlan(5, True, c, acceptance(0.7))
    assert plan.best(budget=20, behind=1000)[0] == 0
    assert plan.best(budget=2000, behind=1000)[0] > 0
    assert plan.best(budget=20, behind=2)[0] > 0  # in step: nothing to catch up
    # through k(): the drafter's own backlog counts
    state = FakeState()
    state.budget = 20
    plan.drafter, plan.steps = FakeDrafter(behind=1000), 2
    assert plan.k(state) == 0


def test_catch_up_cost_is_learned_from_the_first_pass():
    c = costs({1: 0.09, 6: 0.1}, 0.01)
    plan = DraftPlan(4, True, c, acceptance(0.7), FakeDrafter(behind=0))
    state = FakeState()
    plan.k(state)
    plan.drafter.caught_up = 100  # the first of 4 passes read 100 tokens: 0.5 s more
    state.stats.drafter_calls += 4
    state.stats.phase_seconds["draft"] += 0.04 + 0.5
    plan.close(state, [1, 2, 3, 4], 3)
    assert c.catch_up.value == pytest.approx(0.005) and c.draft.value == pytest.approx(0.01)


# -- any schedule of draft lengths is exact ------------------------------------------------

@pytest.fixture(scope="module")
def toys():
    return Toys()


@pytest.mark.parametrize("context", [64, 1], ids=lambda n: f"drafter_context={n}")
@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "sd"])
def test_varying_draft_lengths_keep_the_distribution_exact(toys, method, context, monkeypatch):
    """k = 0, 1, 2 by position (a plain step included) through the real loop, enumerated; with
    a 1-token drafter context the backlog a plain step leaves is cut to its last token, and
    the k = 1 steps, like a probe, first trim the backlog to its last token."""
    import dataclasses

    from tests.methods.toys import TARGET_VOCAB, ToySession

    def k(self, state):
        k = min(len(state.committed) % 3, room(state))
        if k == 1:
            self.drafter.trim(1)
        return k

    monkeypatch.setattr(DraftPlan, "k", k)
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
    import dataclasses

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
    """A drafter 100 tokens behind at 2 ms a token: the probe reads only the last PROBE_CONTEXT
    (16: 0.032 s), and waits for that much more plain time: 0.332 s of waste at 0.004 s of
    allowance per plain step (0.3 s without a backlog: 75 steps)."""
    c, acc = costs({1: 0.2, 6: 0.25}, 0.05), acceptance(0.1)
    c.catch_up = _Mean(0.002)
    drafter = FakeDrafter(behind=100)
    plan = DraftPlan(5, True, c, acc, drafter)
    plan.steps = 2
    ks = [plan.k(FakeState()) for _ in range(120)]
    probes = [i for i, k in enumerate(ks) if k]
    assert PROBE_CONTEXT == 16 and len(probes) == 1 and abs(probes[0] - 83) <= 1
    assert drafter.behind == PROBE_CONTEXT  # trimmed for the probe


@pytest.mark.parametrize("read_seconds, window", [(0.002, 45), (0.001, 64), (0.02, PROBE_CONTEXT)])
def test_a_draft_reads_as_much_of_a_backlog_as_one_plain_step_costs(read_seconds, window):
    """0.09 s plain steps: at 2 ms a token a draft reads the last 45 tokens of a 1000-token
    backlog, at 1 ms the whole context (64), at 20 ms no fewer than a probe's PROBE_CONTEXT;
    the read is priced at what is read."""
    c = costs({1: 0.09, 6: 0.1}, 0.01)
    c.catch_up = _Mean(read_seconds)
    drafter = FakeDrafter(behind=1000, context=64)
    plan = DraftPlan(5, True, c, acceptance(0.9), drafter)
    plan.steps = 2
    state = FakeState()
    state.budget, state.stats.new_tokens = 2000, 50
    assert plan.window() == window and plan.behind() == window
    assert plan.k(state) > 0 and drafter.behind == window
    drafter.context, drafter.behind = 0, 1000  # read everything: never cut
    assert plan.window() == 0 and plan.behind() == 1000


def test_a_probe_after_plain_steps_outweighs_the_stale_drafter_cost():
    """A drafter measured slow under a transient load: after 64 plain steps one probe at its
    real speed moves the estimate most of the way back (a mean worth 10 steps, unfaded, would
    move a tenth of the way)."""
    c = Costs()
    for _ in range(30):
        c.draft.add(0.04)  # slowed by another job
    plan = DraftPlan(4, True, c, acceptance(0.7))
    state = FakeState()
    for _ in range(64):  # plain steps: the drafter does not run
        plan.k(state)
        state.stats.phase_seconds["target"] += 0.1
        plan.close(state, [], 0)
    assert c.draft.value == pytest.approx(0.04)  # faded, not changed
    plan.k(state)  # the probe: 4 drafter passes at 0.01 s
    state.stats.drafter_calls += 4
    state.stats.phase_seconds["draft"] += 0.04
    plan.close(state, [1, 2, 3, 4], 4)
    assert c.draft.value < 0.02


def test_a_backlog_is_read_only_once_the_answer_has_earned_it():
    """Ski rental: 1000 tokens to read at 2 ms (2 s) against 0.09 s plain steps. Worth it for
    2000 tokens wanted, but only read after 23 plain tokens, so an answer that stops at 10
    never pays; renting does not count as drafting losing (no probe is owed for it)."""
    c = costs({1: 0.09, 6: 0.1}, 0.01)
    c.catch_up = _Mean(0.002)
    plan = DraftPlan(5, True, c, acceptance(0.7), FakeDrafter(behind=1000))
    plan.steps = 2
    state = FakeState()
    state.budget = 2000
    assert plan.best(state.budget, plan.behind())[0] > 0
    ks = []
    for generated in range(30):
        state.stats.new_tokens = generated
        ks.append(plan.k(state))
    assert ks[:23] == [0] * 23 and all(k > 0 for k in ks[23:])
    assert plan.acc.idle == 0
