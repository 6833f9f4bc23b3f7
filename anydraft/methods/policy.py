"""How many tokens to draft at each step: fixed, or chosen from what the pair costs and earns.

Adaptive drafting picks the draft length k (0 = a plain target step) that maximises expected
committed tokens per second, from online measurements:

- ``a``: the chance that a candidate is accepted given that the ones before it were. With m
  candidates a step commits ``E(m) = (1 - a^(m+1)) / (1 - a)`` tokens in expectation (Leviathan
  et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1).
  Estimated from (offered, accepted) counts, a censored geometric: accepted / (accepted +
  rejections), with older steps forgotten geometrically.
- ``r``: target candidates per drafter token (a cross-vocabulary bridge re-tokenises).
- ``d``: seconds per drafter forward pass; ``o``: the rest of a step (translation, verification).
- ``T(n)``: the target's measured time to score n tokens in one call. It is a curve, not a
  constant (PyTorch bf16 here: 9 tokens ~1.07x one token; fp32 ~2.3x; llama.cpp ~7.5x), kept as
  one running mean per n and interpolated linearly between the sizes seen.

A step with k drafts takes ``k d + T(1 + r k) + o``; a plain step ``T(1) + o_plain``. When no k
beats the plain step, the method runs plain steps and probes again with a short draft after
16, 32, 64, ... plain steps (the probe refreshes ``a``; backing off keeps its cost negligible
when speculation cannot win). The estimates live in the `Pairing`, so a pair's next request
starts from what the last one learned.

The draft length never changes what is sampled, only how fast (every method is lossless for
any k), but with adaptive drafting a seeded sample depends on timing: use a fixed draft length
for run-to-run identical seeded samples.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

FORGET = 0.9  # weight kept by older steps per new observation
PROBE_FIRST, PROBE_MAX = 16, 256


class _Mean:
    """A running mean that forgets old values geometrically (``prior`` counts as ``weight`` values)."""

    def __init__(self, prior: float | None = None, weight: float = 1.0):
        self.total = 0.0 if prior is None else prior * weight
        self.weight = 0.0 if prior is None else weight

    def add(self, value: float) -> None:
        self.total = self.total * FORGET + value
        self.weight = self.weight * FORGET + 1.0

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass
class Costs:
    """What a pair's steps cost (shared by every method and setting of one `Pairing`)."""

    target: dict = field(default_factory=dict)  # tokens scored in one call -> _Mean seconds
    draft: _Mean = field(default_factory=_Mean)  # seconds per drafter forward pass
    overhead: _Mean = field(default_factory=lambda: _Mean(0.0))  # rest of a drafting step
    plain_overhead: _Mean = field(default_factory=lambda: _Mean(0.0))  # rest of a plain step

    def target_seconds(self, n: float) -> float | None:
        """T(n), interpolated (and extrapolated) linearly between the sizes measured."""
        known = sorted((m, mean.value) for m, mean in self.target.items())
        if not known:
            return None
        if len(known) == 1:
            return known[0][1]  # one size seen: assume flat (optimistic; corrected once seen)
        i = min(max(bisect.bisect_left(known, (n,)), 1), len(known) - 1)
        lo, hi = known[i - 1], known[i]  # the segment around n, or the nearest one
        slope = max(0.0, (hi[1] - lo[1]) / (hi[0] - lo[0]))
        return max(1e-6, lo[1] + slope * (n - lo[0]))


@dataclass
class Acceptance:
    accepted: _Mean = field(default_factory=lambda: _Mean(1.0, 1.0))  # prior: a = 0.5
    rejected: _Mean = field(default_factory=lambda: _Mean(1.0, 1.0))
    ratio: _Mean = field(default_factory=lambda: _Mean(1.0, 1.0))  # candidates per drafter token

    @property
    def a(self) -> float:
        acc, rej = self.accepted.value, self.rejected.value
        return min(0.999, acc / (acc + rej)) if acc + rej > 0 else 0.5


def room(state) -> int:
    """How many candidates are worth offering: the target's context window must hold them,
    and one token of the step is always the target's own, so drafts beyond the remaining
    budget minus one would be thrown away."""
    return max(0, min(state.target.max_length - len(state.committed), state.budget) - 1)


def expected_tokens(a: float, m: float) -> float:
    """Tokens a step commits with m candidates: the accepted ones plus the target's own."""
    return m + 1 if a >= 1 else (1 - a ** (m + 1)) / (1 - a)


class DraftPlan:
    """One generation's draft lengths. ``k(state)`` before drafting; ``close(...)`` after
    verification (rolls the target back to what was kept, and learns from the step)."""

    def __init__(self, max_k: int, adaptive: bool, costs: Costs, acceptance: Acceptance,
                 drafter=None):
        self.max_k, self.adaptive, self.drafter = max_k, adaptive, drafter
        self.costs, self.acc = costs, acceptance
        self.steps = 0
        self.plain_streak, self.probe_after = 0, PROBE_FIRST

    def choose(self) -> int:
        """The k with the most expected tokens per second (0 = a plain target step)."""
        c, acc = self.costs, self.acc
        plain = c.target_seconds(1)
        d = c.draft.value
        if plain is None or d is None:
            return self.max_k  # nothing measured yet: draft, and learn from it
        best_k, best_rate = 0, 1.0 / (plain + c.plain_overhead.value)
        a, r = acc.a, acc.ratio.value
        for k in range(1, self.max_k + 1):
            m = r * k
            rate = expected_tokens(a, m) / (k * d + c.target_seconds(1 + m) + c.overhead.value)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def k(self, state) -> int:
        self._start = time.perf_counter()
        s = state.stats
        self._before = (s.phase_seconds["draft"], s.phase_seconds["target"], s.drafter_calls,
                        len(state.pending))
        if not self.adaptive:
            k = self.max_k
        elif self.steps == 0:
            k = 0  # the first step also reads the prompt: its cost says nothing about drafting
        elif self.steps == 1 and self.costs.target_seconds(1) is None:
            k = 0  # measure a plain step once per pair
        else:
            k = self.choose()
            if k:
                self.plain_streak, self.probe_after = 0, PROBE_FIRST
            else:
                self.plain_streak += 1
                if self.plain_streak >= self.probe_after:
                    k = min(2, self.max_k)
                    self.plain_streak = 0
                    self.probe_after = min(PROBE_MAX, self.probe_after * 2)
        return min(k, room(state))

    def close(self, state, candidates: list[int], n: int) -> None:
        """After verification: the target's cache keeps the committed text and the ``n``
        accepted candidates (the step's own last token is fed next step); learn from the step."""
        state.target.rollback(len(state.committed) + n)
        s = state.stats
        s.drafted += len(candidates)
        self.steps += 1
        if not self.adaptive or self.steps == 1:
            return
        draft = s.phase_seconds["draft"] - self._before[0]
        target = s.phase_seconds["target"] - self._before[1]
        calls = s.drafter_calls - self._before[2]
        wall = time.perf_counter() - self._start
        c = self.costs
        c.target.setdefault(self._before[3] + len(candidates), _Mean()).add(target)
        if calls:
            if self.drafter is None or self.drafter.caught_up <= 2:  # not after plain steps
                c.draft.add(draft / calls)
            c.overhead.add(max(0.0, wall - draft - target))
            self.acc.ratio.add(len(candidates) / calls)
        else:
            c.plain_overhead.add(max(0.0, wall - draft - target))
        if candidates:
            self.acc.accepted.add(n)
            self.acc.rejected.add(1.0 if n < len(candidates) else 0.0)
