"""The analytic speedup bound of speculative decoding (ALGORITHMS.md section 0).

With per-token acceptance probability ``a`` (each draft token accepted independently), ``k``
draft tokens per round and cost ratio ``c`` = time of one drafter step / time of one target
step, one target pass commits (1 - a^(k+1)) / (1 - a) tokens on average and costs k c + 1
target steps, so the expected speedup over plain decoding is

    S(a, k, c) = (1 - a^(k+1)) / ((1 - a) (k c + 1)).

It ignores verification being dearer than one plain step and every overhead (translation,
sync): measured speedups should fall below it; one above it means the inputs are off.
"""

from __future__ import annotations


def expected_tokens_per_round(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens one target pass commits (accepted drafts + its own)."""
    _check(a, k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup_bound(a: float, k: int, c: float) -> float:
    """S(a, k, c) = (1 - a^(k+1)) / ((1 - a)(k c + 1)); a in [0, 1], k >= 1, c >= 0."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_round(a, k) / (k * c + 1.0)


def accepted_fraction(a: float, k: int) -> float:
    """Expected accepted / drafted when every round drafts k tokens and stops at the first
    rejection: a (1 - a^k) / (k (1 - a)). Increasing in a, 0 at a = 0, 1 at a = 1."""
    _check(a, k)
    if a == 1.0:
        return 1.0
    return a * (1.0 - a**k) / (k * (1.0 - a))


def per_token_acceptance(rate: float, k: int, tol: float = 1e-10) -> float:
    """The per-token acceptance a of the bound, from a measured ``rate`` = accepted / drafted.

    The measured rate is not a: tokens drafted after a rejection count as drafted but can never
    be accepted. Under the model of section 0 (k drafts per round, independent acceptance)
    rate = a (1 - a^k) / (k (1 - a)); this inverts that (bisection; exact for k = 1).
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {rate}")
    if rate in (0.0, 1.0) or k == 1:
        return float(rate)
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if accepted_fraction(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def cost_ratio(draft_seconds: float, drafter_calls: int,
               ar_target_seconds: float, ar_target_calls: int) -> float | None:
    """Measured c = (draft_seconds / drafter_calls) / (ar_target_seconds / ar_target_calls).

    Numerator: mean wall time of one drafter forward call (one draft token; the drafter's
    prompt read and resync feeds are folded in) in the speculative run. Denominator: mean wall
    time of one target forward call in the plain (AR) run of the same prompt, where each call
    produces one token (callers leave out the first call, which reads the prompt). None when
    either is unmeasured.
    """
    if drafter_calls <= 0 or ar_target_calls <= 0 or ar_target_seconds <= 0:
        return None
    return (draft_seconds / drafter_calls) / (ar_target_seconds / ar_target_calls)


def _check(a: float, k: int) -> None:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"per-token acceptance a must be in [0, 1], got {a}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
