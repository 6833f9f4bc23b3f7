"""The analytic speedup bound of speculative decoding (ALGORITHMS.md section 0).

With per-token acceptance probability ``a`` (each draft token accepted independently), ``k``
draft tokens per round and cost ratio ``c`` = time of one drafter step / time of one target
step, one target pass commits (1 - a^(k+1)) / (1 - a) tokens on average and costs k c + 1
target steps, so the expected speedup over plain decoding is

    S(a, k, c) = (1 - a^(k+1)) / ((1 - a) (k c + 1)).

Verifying j drafts scores j + 1 tokens in one target call, which costs v_j = T(j+1) / T(1)
plain steps, read off the target's measured cost curve (hardware/profile.py): 1 where scoring
is flat, nearly j + 1 where it is compute-bound. With it the round costs j c + v_j steps. The
bound ignores every other overhead (translation, sync): measured speedups should fall below
it; one above it means the inputs are off.
"""

from __future__ import annotations

import statistics


def expected_tokens_per_round(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens one target pass commits (accepted drafts + its own)."""
    _check(a, k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup_bound(a: float, k: int, c: float, verify: float = 1.0) -> float:
    """(1 - a^(k+1)) / ((1 - a)(k c + v)); a in [0, 1], k >= 1, c >= 0, v = ``verify`` (the cost
    of scoring k + 1 tokens in plain steps; 1 gives the classic S(a, k, c))."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_round(a, k) / (k * c + verify)


def best_bound(a: float, k: int, c: float, verify: list[float] | None = None) -> float:
    """max over j = 1..k of the bound with draft length j and verification cost ``verify[j-1]``
    (None: 1, scoring is flat): the speedup of the best fixed draft length up to k, with no
    overhead. The reference for adaptive drafting, which picks its draft length per step."""
    return max(speedup_bound(a, j, c, 1.0 if verify is None else verify[j - 1]) for j in range(1, k + 1))


def cost_at(curve: dict[int, float], n: float) -> float:
    """T(n), the seconds to score ``n`` tokens in one call, from a measured cost curve (tokens
    scored -> seconds): linear between measured sizes and along the last two beyond them."""
    sizes = sorted(curve)
    lo = max([s for s in sizes if s <= n] or sizes[:1])
    hi = min([s for s in sizes if s > lo] or sizes[-1:])
    if hi == lo:
        lo, hi = sizes[-2:] if len(sizes) > 1 else (lo, lo)
    if hi == lo:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)


def verify_costs(curve: dict[int, float], k: int) -> list[float]:
    """v_j = T(j+1) / T(1) for j = 1..k from a measured cost curve (`cost_at`)."""
    return [max(cost_at(curve, j + 1), 0.0) / cost_at(curve, 1) for j in range(1, k + 1)]


def per_token_acceptance(accepted: int, rejected: int) -> float | None:
    """The per-token acceptance a of the bound, measured: accepted / (accepted + rejected),
    where ``rejected`` counts the rounds that ended at a rejected candidate.

    Under the model of section 0 a round's candidates are judged in order, each accepted with
    chance a, until one is rejected; those after it are never judged. Every judged candidate is
    one trial, so this is the maximum-likelihood a whatever each round's length (adaptive
    drafting varies it; a round whose drafts were all accepted adds no rejection). None when
    no candidate was judged."""
    judged = accepted + rejected
    return accepted / judged if judged else None


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


def median(values):
    """The median of ``values`` that are not None (None: there are none)."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
