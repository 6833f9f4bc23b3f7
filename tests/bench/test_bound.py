"""The analytic bound and the quantities derived for it, against hand-computed values."""

import pytest

from anydraft.bench.bound import (
    best_bound,
    cost_ratio,
    expected_tokens_per_round,
    per_token_acceptance,
    speedup_bound,
)


@pytest.mark.parametrize("a,k,c,expected", [
    (0.0, 5, 0.0, 1.0),  # nothing accepted, free drafter: one token per pass
    (0.5, 1, 0.0, 1.5),  # (1 - 0.25) / 0.5
    (0.5, 2, 0.0, 1.75),  # (1 - 0.125) / 0.5
    (0.8, 4, 0.05, (1 - 0.8**5) / (0.2 * 1.2)),  # 3.3616 / 1.2 = 2.80133...
    (0.5, 1, 1.0, 0.75),  # drafter as dear as the target: 1.5 / 2
    (1.0, 5, 0.1, 4.0),  # all accepted: (k + 1) / (k c + 1) = 6 / 1.5
])
def test_speedup_bound_hand_values(a, k, c, expected):
    assert speedup_bound(a, k, c) == pytest.approx(expected, rel=1e-12)


def test_bound_examples_written_out():
    assert speedup_bound(0.8, 4, 0.05) == pytest.approx(2.801333333, rel=1e-9)
    assert expected_tokens_per_round(0.6, 3) == pytest.approx(1 + 0.6 + 0.36 + 0.216)


def test_any_a_above_c_speeds_up_at_k1():
    for a, c in [(0.3, 0.29), (0.6, 0.5), (0.9, 0.1)]:
        assert speedup_bound(a, 1, c) > 1
        assert speedup_bound(c * 0.99, 1, c) < 1


@pytest.mark.parametrize("bad", [dict(a=-0.1, k=3, c=0.1), dict(a=1.1, k=3, c=0.1),
                                 dict(a=0.5, k=0, c=0.1), dict(a=0.5, k=3, c=-1)])
def test_bound_rejects_bad_inputs(bad):
    with pytest.raises(ValueError):
        speedup_bound(**bad)


def test_per_token_acceptance_counts_every_judged_candidate_once():
    # rounds of any length: 3 accepted then rejected (4 judged), 2 accepted (all kept), 0
    # accepted (1 judged): 5 kept of 7 judged; the drafts after a rejection are never judged
    assert per_token_acceptance(3 + 2 + 0, 2) == pytest.approx(5 / 7)
    assert per_token_acceptance(6, 0) == 1.0 and per_token_acceptance(0, 4) == 0.0
    assert per_token_acceptance(0, 0) is None


def test_per_token_acceptance_recovers_a_from_simulated_rounds_of_varying_length():
    """The estimate must not depend on how long the rounds were (adaptive drafting)."""
    import random

    rng = random.Random(0)
    for a in (0.3, 0.8):
        accepted = rejected = 0
        for _ in range(20000):
            for _ in range(rng.randint(1, 6)):  # each round drafts 1..6
                if rng.random() >= a:
                    rejected += 1
                    break
                accepted += 1
        assert per_token_acceptance(accepted, rejected) == pytest.approx(a, abs=0.01)


def test_best_bound_takes_the_best_draft_length():
    # a cheap drafter and high acceptance: the longest draft; a dear one: a short draft
    assert best_bound(0.9, 5, 0.01) == pytest.approx(speedup_bound(0.9, 5, 0.01))
    assert best_bound(0.5, 5, 0.3) == pytest.approx(speedup_bound(0.5, 1, 0.3))
    assert best_bound(0.5, 5, 0.3) > speedup_bound(0.5, 5, 0.3)


def test_cost_ratio_definition():
    # drafter: 0.2 s over 40 calls = 5 ms; target in AR: 1.0 s over 20 calls = 50 ms -> 0.1
    assert cost_ratio(0.2, 40, 1.0, 20) == pytest.approx(0.1)
    assert cost_ratio(0.2, 0, 1.0, 20) is None
    assert cost_ratio(0.2, 40, 0.0, 0) is None


def test_verification_costs_come_from_the_measured_curve():
    from anydraft.bench.bound import verify_costs

    flat = {1: 0.2, 2: 0.18, 5: 0.21, 9: 0.25}
    assert verify_costs(flat, 3) == pytest.approx([0.9, 0.95, 1.0])  # T(2), T(3) interpolated, T(4)
    assert verify_costs({1: 0.1, 5: 0.5}, 6)[-1] == pytest.approx(7.0)  # beyond: along the last two
    compute_bound = {1: 0.03, 2: 0.06, 5: 0.126, 9: 0.238}
    # the same a and c: a target whose scoring grows with M bounds the speedup far lower
    assert best_bound(0.8, 5, 0.05, verify_costs(compute_bound, 5)) < 1 < best_bound(0.8, 5, 0.05)
    assert best_bound(0.8, 5, 0.05, [1.0] * 5) == best_bound(0.8, 5, 0.05)
