"""How many tokens to draft at each step: fixed, or chosen from what the pair costs and earns.

Adaptive drafting picks the draft length k (0 = a plain target step) that maximises expected
committed tokens per second, from online measurements:

- ``a_i``: the chance that the i-th candidate is accepted given that the ones before it were.
  With m candidates a step commits ``E(m) = 1 + a_1 + a_1 a_2 + ... + a_1...a_m`` tokens in
  expectation (with one constant a this is Leviathan et al., "Fast Inference from Transformers
  via Speculative Decoding", ICML 2023, eq. 1). One a per position, not a constant: acceptance
  rises along a draft (a drafter that got two tokens right is on familiar text), and a single
  a measured on short drafts would undervalue long ones. Each a_i is a running mean of
  accepted/rejected at position i, over the steps that reached it.
- ``r``: target candidates per drafter token (a cross-vocabulary bridge re-tokenises).
- ``d``: seconds per drafter forward pass; ``o``: the rest of a step (translation,
  verification: per method).
- ``T(n)``: the target's measured time to score n tokens in one call. It is a curve, not a
  constant (PyTorch bf16 here: 9 tokens ~1.07x one token; fp32 ~2.3x; llama.cpp ~7.5x), kept as
  one running mean per n, with a straight line fitted through them.

A step with k drafts takes ``k d + T(1 + r k) + o``; a plain step ``T(1) + o_plain``. A drafter
that is behind the committed text (the prompt, at first) must read it before drafting: that
one-off cost is spread over the tokens still wanted, so a long prompt with a short answer is
decoded plainly when reading it would cost the drafter more than it can win; and since an
answer may stop early, the reading waits until the answer's plain tokens would have cost as
much (ski rental: `DraftPlan.renting`), and it reads only as many of the backlog's last tokens
as one plain step costs (`DraftPlan.window`). When no k beats the plain step, the method runs
plain steps (or copies, with prompt lookup) and probes with a full draft once the steps without
the drafter have cost enough that the probe, were none of its drafts kept, would waste at most
PROBE_SHARE of their time (`DraftPlan.probe_due`). A probe reads only the last PROBE_CONTEXT
tokens of the drafter's backlog, so that each probe is cheap (every probe lands whole in one
request) and probes come often at the same share: a pair that cannot win loses at most that
share, and one that only looked bad (a few unlucky samples, a transient slowdown) gets its
estimates refreshed within a request or two. While the drafter does not run, its estimates fade
(keep their value, lose weight), so a probe after a transient slowdown (another job on the
cores) replaces the stale numbers instead of being averaged away by them. The estimates live in
the `Pairing`, so a pair's next request starts from what the last one learned.

The draft length never changes what is sampled, only how fast (every method is lossless for
any k), but with adaptive drafting a seeded sample depends on timing: use a fixed draft length
for run-to-run identical seeded samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FORGET = 0.9  # weight kept by older steps per new observation
FADE = 0.95  # weight kept by the drafter's estimates per step that does not run it
# what a probe may waste, as a share of the time of the steps without the drafter before it.
# It replaced a doubling back-off (16, 32, ... 256 plain steps, blocked while the drafter was
# behind by more than a plain step's reading) that kept good drafters off for whole runs:
# Qwen-1.5B <- Gemma-3, t=0, 1.17x -> 1.70x (benchmarks/results/2026-11-30-floor{,-probe}-*)
PROBE_SHARE = 0.02
# backlog tokens a probe reads. In llama.cpp here a 64-token read costs more than the probe's
# 5 passes: Gemma-3-270M 94 ms vs 58 ms, Qwen-0.5B 280 vs 98, SmolLM2 208 vs 39; 16 tokens
# cost 30, 87 and 55 ms, so a probe costs 40-60% less
PROBE_CONTEXT = 16


class _Mean:
    """A running mean that forgets old values geometrically (``prior`` counts as ``weight`` values)."""

    def __init__(self, prior: float | None = None, weight: float = 1.0):
        self.total = 0.0 if prior is None else prior * weight
        self.weight = 0.0 if prior is None else weight

    def add(self, value: float) -> None:
        self.total = self.total * FORGET + value
        self.weight = self.weight * FORGET + 1.0

    def fade(self, factor: float = FADE) -> None:
        """Trust the mean less (same value, less weight): the next observation counts more."""
        self.total *= factor
        self.weight *= factor

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


@dataclass
class Costs:
    """What a pair's steps cost (shared by every method and setting of one `Pairing`)."""

    target: dict = field(default_factory=dict)  # tokens scored in one call -> _Mean seconds
    draft: _Mean = field(default_factory=_Mean)  # seconds per drafter forward pass
    catch_up: _Mean = field(default_factory=_Mean)  # drafter seconds per backlog token read, beyond a pass
    plain_overhead: _Mean = field(default_factory=lambda: _Mean(0.0))  # rest of a plain step

    def target_curve(self):
        """n -> T(n), a straight line fitted to the per-size means (weighted by how much each
        size was seen; one size seen: flat), or None before any measurement. A line rides over
        the noise of single sizes."""
        points = [(m, mean.value, mean.weight) for m, mean in self.target.items()]
        if not points:
            return None
        w = sum(p[2] for p in points)
        mx = sum(p[0] * p[2] for p in points) / w
        my = sum(p[1] * p[2] for p in points) / w
        sxx = sum(p[2] * (p[0] - mx) ** 2 for p in points)
        slope = max(0.0, sum(p[2] * (p[0] - mx) * (p[1] - my) for p in points) / sxx) if sxx else 0.0
        return lambda n: max(1e-6, my + slope * (n - mx))

    def target_seconds(self, n: float) -> float | None:
        curve = self.target_curve()
        return None if curve is None else curve(n)


class Acceptance:
    """What one (pair, method, greedy or not) earns and spends beyond the pair's shared costs:
    per-position acceptance a_1, a_2, ... (prior 0.5 each), candidates per drafter token, the
    rest of a drafting step (translation, verification), and the probing schedule."""

    def __init__(self):
        self.positions: list[_Mean] = []
        self.ratio = _Mean(1.0, 1.0)
        self.overhead = _Mean(0.0)
        self.steps = 0  # drafting steps seen
        # steps without the drafter since it last drafted (kept across requests, so a pair
        # that cannot win is probed at the same low rate whatever its requests' lengths)
        self.idle = 0

    def a(self, i: int) -> float:
        """a_i for i = 1, 2, ...; past the longest draft seen, the last position's."""
        if not self.positions:
            return 0.5
        return self.positions[min(i, len(self.positions)) - 1].value

    def add(self, offered: int, accepted: int) -> None:
        """A step offered ``offered`` candidates; the first ``accepted`` were accepted."""
        self.steps += 1
        while len(self.positions) < offered:
            self.positions.append(_Mean(0.5, 1.0))
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


def room(state) -> int:
    """How many candidates are worth offering: the target's context window must hold them,
    and one token of the step is always the target's own, so drafts beyond the remaining
    budget minus one would be thrown away."""
    return max(0, min(state.target.max_length - len(state.committed), state.budget) - 1)


class DraftPlan:
    """One generation's draft lengths. ``k(state)`` before drafting; ``close(...)`` after
    verification (rolls the target back to what was kept, and learns from the step)."""

    def __init__(self, max_k: int, adaptive: bool, costs: Costs, acceptance: Acceptance,
                 drafter=None, free: bool = False):
        # free: drafts cost nothing (copied by prompt lookup, no drafter pass)
        self.max_k, self.adaptive, self.drafter, self.free = max_k, adaptive, drafter, free
        self.costs, self.acc = costs, acceptance
        self.steps = 0

    def best(self, budget: int = 1 << 30, behind: int = 0) -> tuple[int, float | None]:
        """``(k, expected tokens per second)`` for the k with the most expected tokens per
        second (0 = a plain target step); the rate is None (and k the largest) before anything
        is measured.

        ``behind``: committed tokens the drafter has not read yet (the whole prompt at first,
        or what plain steps committed). Drafting first pays for reading them, once for the
        remaining ``budget`` tokens: ``catch`` seconds spread over the budget."""
        c, acc = self.costs, self.acc
        target = c.target_curve()  # fitted once per step
        d = 0.0 if self.free else c.draft.value
        if target is None or d is None:
            return self.max_k, None  # nothing measured yet: draft, and learn from it
        catch = self.catch_up_seconds(behind)
        best_k, best_rate = 0, 1.0 / (target(1) + c.plain_overhead.value)
        r = acc.ratio.value
        for k in range(1, self.max_k + 1):
            m = r * k
            expected = acc.expected_tokens(m)
            step = k * d + target(1 + m) + (c.plain_overhead if self.free else acc.overhead).value
            rate = expected / (step + catch * expected / max(budget, 1))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate

    def behind(self) -> int:
        """Committed tokens the drafter reads before it can draft again (at most `window`)."""
        if self.drafter is None:
            return 0
        window = self.window()
        return min(self.drafter.behind, window) if window else self.drafter.behind

    def window(self) -> int:
        """How much of a backlog a draft reads: as many tokens as one plain target step costs
        to read, between PROBE_CONTEXT and the drafter's context (0, all: never cut).

        A read is paid once per backlog and lost whole when the answer ends soon after (an
        extraction's 10 tokens); a longer read buys acceptance for the rest of the answer.
        At one step's worth, a dear read (SmolLM2 reads 64 tokens in 0.2 s, 2.6 of Qwen-0.5B's
        steps) shrinks to ~24 tokens, and a cheap one (one of Qwen-1.5B's 0.2 s steps) keeps
        the whole context, whose acceptance pays there (`DRAFTER_CONTEXT`)."""
        context = self.drafter.context
        per_token, plain = self._per_token(), self.costs.target_seconds(1)
        if not context or not per_token or plain is None:  # reading is free: all of it
            return context
        return min(context, max(PROBE_CONTEXT, int(plain / per_token)))

    def _per_token(self) -> float | None:
        """Drafter seconds per backlog token read, beyond a pass (before any read: a
        sixteenth of a pass)."""
        c = self.costs
        if c.catch_up.value is not None or c.draft.value is None:
            return c.catch_up.value
        return c.draft.value / 16

    def catch_up_seconds(self, behind: int) -> float:
        """What reading ``behind`` tokens costs the drafter (before it can draft again)."""
        per_token = self._per_token()
        return 0.0 if behind <= 2 or per_token is None else per_token * behind

    def k(self, state) -> int:
        self._start = time.perf_counter()
        s = state.stats
        self._before = (s.phase_seconds["draft"], s.phase_seconds["target"], s.drafter_calls,
                        len(state.pending))
        if not self.adaptive:
            k = self.max_k
        elif self.steps == 1 and 1 not in self.costs.target:
            k = 0  # measure a plain step once per pair (step 0 also reads the prompt: not used)
        else:
            behind = self.behind()
            k = self.best(state.budget, behind)[0]
            if k and self.renting(state, behind):
                k = 0  # not a verdict on drafting: no probe is owed for these steps
            elif k or self.probe_due(behind):
                if self.drafter is not None:
                    self.drafter.trim(self.window() if k else PROBE_CONTEXT)
                k = k or self.max_k
                self.acc.idle = 0
            else:
                self.acc.idle += 1
        return min(k, room(state))

    def probe_due(self, behind: int) -> bool:
        """Whether the steps without the drafter so far (each worth a plain step) have earned a
        probe: a full draft, after reading the last PROBE_CONTEXT of the ``behind`` tokens,
        that would waste at most PROBE_SHARE of their time were none of its drafts kept."""
        c, k = self.costs, self.max_k
        target, d = c.target_curve(), (0.0 if self.free else c.draft.value)
        if not self.acc.idle or target is None or d is None:
            return False
        plain = target(1)
        read = self.catch_up_seconds(min(behind, PROBE_CONTEXT))
        waste = read + k * d + target(1 + self.acc.ratio.value * k) - plain
        return self.acc.idle * plain * PROBE_SHARE >= waste

    def renting(self, state, behind: int) -> bool:
        """Whether to keep decoding plainly before the drafter reads a backlog (a prompt).

        Reading is paid once and repaid only by tokens that come after it; an answer that
        ends early (EOS after 10 tokens of the 64 asked) never repays it. The ski-rental rule:
        read only once this request's tokens so far would have cost as much as the reading,
        at one plain step each. Whatever the answer's length, that costs at most about twice
        the better of reading at once and never reading."""
        catch, plain = self.catch_up_seconds(behind), self.costs.target_seconds(1)
        return catch > 0 and plain is not None and catch > state.stats.new_tokens * plain

    def close(self, state, candidates: list[int], n: int) -> None:
        """After verification: the target's cache keeps the committed text and the ``n``
        accepted candidates (the step's own last token is fed next step); learn from the step."""
        state.target.rollback(len(state.committed) + n)
        s = state.stats
        s.drafted += len(candidates)
        s.rejected += n < len(candidates)
        self.steps += 1
        if not self.adaptive:
            return
        draft = s.phase_seconds["draft"] - self._before[0]
        target = s.phase_seconds["target"] - self._before[1]
        calls = s.drafter_calls - self._before[2]
        wall = time.perf_counter() - self._start
        c = self.costs
        if self.steps > 1:  # the first step's target call also reads the prompt
            c.target.setdefault(self._before[3] + len(candidates), _Mean()).add(target)
        if calls:
            caught_up = 0 if self.drafter is None else self.drafter.caught_up
            if caught_up <= 2:
                c.draft.add(draft / calls)
            elif c.draft.value is not None:  # the first pass also read `caught_up` tokens:
                # what that cost beyond a pass (a read of n tokens costs a pass plus n - 1
                # tokens' worth; a whole-pass share per token would price short reads dear)
                c.catch_up.add(max(0.0, draft - calls * c.draft.value) / caught_up)
            self.acc.overhead.add(max(0.0, wall - draft - target))
            self.acc.ratio.add(len(candidates) / calls)
        else:
            c.plain_overhead.add(max(0.0, wall - draft - target))
            # what the drafter costs and earns goes stale while it does not run (a load that
            # slowed it may have passed): the next probe's measurements then count for more
            stale = () if self.free else (self.acc.overhead, *self.acc.positions)
            for mean in (c.draft, c.catch_up, *stale):
                mean.fade()
        if candidates:
            self.acc.add(len(candidates), n)
