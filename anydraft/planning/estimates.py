"""What the planning learns about a pair: running means of what its steps cost (`Costs`, shared
by every method and setting of one pair) and earn (`Acceptance`, per method and greedy or not),
kept in `Estimates` across requests (in the `Pairing`, or the decoder without a drafter).

- ``a_i``: the chance that the i-th candidate is accepted given that the ones before it were.
  One a per position: acceptance rises along a draft, and a single a measured on short drafts
  would undervalue long ones.
- ``r``: target candidates per drafter token (a cross-vocabulary bridge re-tokenises).
- ``d``: seconds per drafter forward pass; ``o``: the rest of a step (translation, verification).
- ``T(n)``: the target's measured time to score n tokens in one call: a curve, not a constant
  (nearly flat on some machines, nearly linear on others, and it may bend), kept as one running
  mean per n and drawn through them, each pulled a little towards a straight line fit
  (`Costs.target_curve`). Where this machine measured the target's cost curve before
  (hardware/profile.py), its points join as a weak prior that fades as the pair's own calls
  come in (`Costs.profile`).

Every mean forgets old values geometrically (`Settings.forget`); the drafter's fade while it does
not run (`Settings.fade`), so a probe after a transient slowdown replaces stale numbers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from .settings import SETTINGS


class Mean:
    """A running mean that forgets old values geometrically (``prior`` counts as ``weight`` values)."""

    def __init__(self, prior: float | None = None, weight: float = 1.0):
        self.total = 0.0 if prior is None else prior * weight
        self.weight = 0.0 if prior is None else weight

    def add(self, value: float) -> None:
        self.total = self.total * SETTINGS.forget + value
        self.weight = self.weight * SETTINGS.forget + 1.0

    def fade(self) -> None:
        """Trust the mean less (same value, less weight): the next observation counts more."""
        factor = SETTINGS.fade
        self.total *= factor
        self.weight *= factor

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass
class Costs:
    """What a pair's steps cost (shared by every method and setting of one pair)."""

    target: dict = field(default_factory=dict)  # tokens scored in one call -> Mean seconds
    draft: Mean = field(default_factory=Mean)  # seconds per drafter forward pass
    read: Mean = field(default_factory=Mean)  # drafter seconds per backlog token read, beyond a pass
    plain_overhead: Mean = field(default_factory=lambda: Mean(0.0))  # rest of a plain step
    # the target's cost curve as hardware/profile.py measured it on this machine (tokens ->
    # seconds; empty: none cached): a prior worth ``profile_weight`` observations in all,
    # fading as the pair's own calls are observed (`add_target`)
    profile: dict = field(default_factory=dict)
    profile_weight: float = field(default_factory=lambda: SETTINGS.profile_weight)
    _curve: tuple | None = field(default=None, repr=False, compare=False)  # (inputs, fitted curve)

    def add_target(self, n: int, seconds: float) -> None:
        """A target call that scored ``n`` tokens took ``seconds``: the profile counts less."""
        self.target.setdefault(n, Mean()).add(seconds)
        self.profile_weight *= SETTINGS.forget

    def target_curve(self):
        """n -> T(n), or None before any call or profile point. A straight line is fitted to
        the per-size means (weighted by how much each size was seen; one size seen: flat) and
        the profile's points; then each size seen, or profiled, is a knot: its own mean and
        the profile's point, shrunk towards the line as if the line were `Settings.shrink` more
        observations; T runs straight between knots, with the line's slope past the ends, and
        never falls. The line alone would blur a bend (llama.cpp's curve bends), making drafts
        that lose look worth it (docs/adaptive-drafting.md, rule 9). Before the
        pair's own calls spread over sizes, the profile gives the curve its shape: the first
        batch of rows shares its call as the hardware allows."""
        points = [(m, mean.value, mean.weight) for m, mean in self.target.items()]
        profile = [(m, seconds, self.profile_weight) for m, seconds in self.profile.items()]
        # a step asks several times while nothing changed: fitted once per change of its inputs
        key = (points, profile, SETTINGS.shrink)
        if self._curve is not None and self._curve[0] == key:
            return self._curve[1]
        self._curve = (key, self._fit(points, profile))
        return self._curve[1]

    def _fit(self, points: list[tuple], profile: list[tuple]):
        if not points and not profile:
            return None
        line, slope = _line(points + [(m, v, w / len(profile)) for m, v, w in profile])
        evidence: dict = {}  # size -> (weighted seconds, weight)
        for m, seconds, weight in points + profile:
            total, w = evidence.get(m, (0.0, 0.0))
            evidence[m] = (total + weight * seconds, w + weight)
        knots, top = [], 0.0
        for m in sorted(evidence):
            total, w = evidence[m]
            shrink = SETTINGS.shrink
            top = max(top, (total + shrink * line(m)) / (w + shrink))
            knots.append((m, top))
        return partial(_through, knots, slope)

    def target_seconds(self, n: float) -> float | None:
        curve = self.target_curve()
        return None if curve is None else curve(n)

    def read_per_token(self) -> float | None:
        """Drafter seconds per backlog token read, beyond a pass (before any read: a share of a pass)."""
        if self.read.value is not None or self.draft.value is None:
            return self.read.value
        return self.draft.value * SETTINGS.first_read_share

    def read_seconds(self, tokens: int) -> float:
        """What reading ``tokens`` backlog tokens costs the drafter before it can draft."""
        per_token = self.read_per_token()
        return 0.0 if tokens <= SETTINGS.free_read or per_token is None else per_token * tokens


def _line(points: list[tuple]) -> tuple[Callable[[float], float], float]:
    """The least-squares line through weighted ``(size, seconds, weight)`` points, never
    falling (a single size: flat), and its slope."""
    w = sum(p[2] for p in points)
    mx = sum(p[0] * p[2] for p in points) / w
    my = sum(p[1] * p[2] for p in points) / w
    sxx = sum(p[2] * (p[0] - mx) ** 2 for p in points)
    slope = max(0.0, sum(p[2] * (p[0] - mx) * (p[1] - my) for p in points) / sxx) if sxx else 0.0
    return (lambda n: my + slope * (n - mx)), slope


def _through(knots: list[tuple], slope: float, n: float) -> float:
    """The piecewise-linear curve through sorted ``(size, seconds)`` knots at ``n``, with
    ``slope`` past either end."""
    i = bisect.bisect_left(knots, n, key=lambda k: k[0])
    if i in (0, len(knots)):  # at or before the first knot, or past the last
        m, seconds = knots[min(i, len(knots) - 1)]
        return max(SETTINGS.min_seconds, seconds + slope * (n - m))
    (m1, s1), (m2, s2) = knots[i - 1], knots[i]
    return max(SETTINGS.min_seconds, s1 + (s2 - s1) * (n - m1) / (m2 - m1))


class Acceptance:
    """What one (pair, method, greedy or not) earns and spends beyond the pair's shared costs:
    per-position acceptance a_1, a_2, ..., candidates per drafter token, the rest of a drafting
    step (translation, verification), and how many steps the proposer sat out."""

    def __init__(self):
        self.positions: list[Mean] = []
        self.ratio = Mean(1.0, 1.0)
        self.overhead = Mean(0.0)
        self.steps = 0  # drafting steps seen
        # steps without this proposer since it last ran (kept across requests, so a pair that
        # cannot win is probed at the same low rate whatever its requests' lengths)
        self.idle = 0

    def a(self, i: int) -> float:
        """a_i for i = 1, 2, ...; past the longest draft seen, the last position's."""
        if not self.positions:
            return SETTINGS.prior_acceptance
        return self.positions[min(i, len(self.positions)) - 1].value

    def add(self, offered: int, accepted: int) -> None:
        """A step offered ``offered`` candidates; the first ``accepted`` were accepted."""
        self.steps += 1
        while len(self.positions) < offered:
            self.positions.append(Mean(SETTINGS.prior_acceptance, 1.0))
        for i in range(min(accepted + 1, offered)):
            self.positions[i].add(1.0 if i < accepted else 0.0)

    def expected_tokens(self, m: float) -> float:
        """Tokens a step commits with m candidates: the accepted ones plus the target's own."""
        total, run, i = 1.0, 1.0, 1
        while i <= m:
            run *= self.a(i)
            total += run
            i += 1
        return total + (m - (i - 1)) * run * self.a(i)  # a fractional last candidate


@dataclass
class Estimates:
    """Everything a decoder learns about its pair, kept across requests."""

    costs: Costs = field(default_factory=Costs)
    # (method, greedy) -> Acceptance for drafters; ("copy", greedy, n) for prompt lookup's
    # copies after an n-token match
    acceptance: dict = field(default_factory=dict)

    def of(self, *key) -> Acceptance:
        return self.acceptance.setdefault(key, Acceptance())

