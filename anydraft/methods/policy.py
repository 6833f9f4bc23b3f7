"""How many tokens to draft at each step, and from which proposer: fixed, or chosen from what
the pair costs and earns.

The policy is pure functions over measured estimates, plus one small stateful estimator:
`Policy.choose` returns a `Choice` and changes nothing; `Policy.observe` learns from the step
the loop ran (decoding/step.py). Adaptive drafting picks the draft length k (0 = a plain target
step) that maximises expected committed tokens per second (`expected_rate`), from online
measurements:

- ``a_i``: the chance that the i-th candidate is accepted given that the ones before it were.
  With m candidates a step commits ``E(m) = 1 + a_1 + a_1 a_2 + ... + a_1...a_m`` tokens in
  expectation (with one constant a this is Leviathan et al., "Fast Inference from Transformers
  via Speculative Decoding", ICML 2023, eq. 1). One a per position: acceptance rises along a
  draft, and a single a measured on short drafts would undervalue long ones.
- ``r``: target candidates per drafter token (a cross-vocabulary bridge re-tokenises).
- ``d``: seconds per drafter forward pass; ``o``: the rest of a step (translation, verification).
- ``T(n)``: the target's measured time to score n tokens in one call: a curve, not a constant
  (it is nearly flat on some machines and nearly linear on others, and may bend), kept as one
  running mean per n and drawn through them, each pulled a little towards a straight line fit
  (`Costs.target_curve`). Where this machine measured the target's cost curve before
  (hardware/profile.py), its points join as a weak prior that fades as the pair's own calls
  come in (`Costs.profile`).

A step with k drafts takes ``k d + T(1 + r k) + o``; a plain step ``T(1) + o_plain``. A drafter
behind the committed text (the prompt, at first) reads its backlog before drafting: that cost
is spread over the tokens still wanted; the read waits until the answer's plain tokens would
have cost as much (ski rental: `renting`), and it reads only as many of the backlog's last
tokens as one plain step costs (`read_size`). When no k beats a plain step, the method runs
plain steps (or copies) and probes with a full draft once the steps without the drafter have
cost enough that the probe, were none of its drafts kept, wastes at most PROBE_SHARE of their
time (`probe_due`). While the drafter does not run its estimates fade, so a probe after a
transient slowdown replaces stale numbers. The estimates live in the `Pairing` (or the
decoder, without a drafter): a pair's next request starts from what the last one learned.

In a batch (decoding/step.py) the rows whose targets are rows of one batch are scored in one
call, and what one row drafts lengthens everyone's step. The call's cost is recorded once, at
the call's total tokens (so T(n) is the cost of n tokens over any rows), and `allocate` shares
the call out: each row's choice alone is the most it drafts, and drafts go, one row at a time,
where they raise the batch's committed tokens per second. Where the curve is flat the rows
draft as they would alone; where several rows already fill it (a linear curve) drafts shrink,
towards plain batched decoding. One row alone gets exactly its own choice.

The draft length never changes what is sampled, only how fast (every method is lossless for
any k), but with adaptive drafting a seeded sample depends on timing: use a fixed draft length
for run-to-run identical seeded samples. The measurements behind each mechanism are in
docs/adaptive-drafting.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

FORGET = 0.9  # weight kept by older steps per new observation: ~10 steps of memory
FADE = 0.95  # weight kept by the drafter's estimates per step that does not run it
PROBE_SHARE = 0.02  # what a probe may waste, as a share of the steps without the drafter before it
PROBE_READ = 16  # backlog tokens a probe reads, and the fewest an adaptive draft reads
PRIOR_ACCEPTANCE = 0.5  # a_i before position i was ever reached: replaced within a few steps
# before any read was measured, a backlog token is priced at this share of a drafter pass
# (one pass reads many tokens for little more than one)
FIRST_READ_SHARE = 1 / 16
FREE_READ = 2  # a backlog this short (the last step's own tokens) rides along with the first pass
MIN_SECONDS = 1e-6  # a fitted cost line never reaches zero
# the target cost curve's line counts as this many calls at each size seen: a size seen once
# sits halfway between its time and the line, one seen often at its own (`Costs.target_curve`)
SHRINK = 1.0
# a measured cost curve (hardware/profile.py) counts as this many of the pair's own target
# calls, all its sizes together: it shapes the first steps, and has faded after ~20 calls
PROFILE_WEIGHT = 1.0


class Mean:
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
    """What a pair's steps cost (shared by every method and setting of one pair)."""

    target: dict = field(default_factory=dict)  # tokens scored in one call -> Mean seconds
    draft: Mean = field(default_factory=Mean)  # seconds per drafter forward pass
    read: Mean = field(default_factory=Mean)  # drafter seconds per backlog token read, beyond a pass
    plain_overhead: Mean = field(default_factory=lambda: Mean(0.0))  # rest of a plain step
    # the target's cost curve as hardware/profile.py measured it on this machine (tokens ->
    # seconds; empty: none cached): a prior worth ``profile_weight`` observations in all,
    # fading as the pair's own calls are observed (`add_target`)
    profile: dict = field(default_factory=dict)
    profile_weight: float = PROFILE_WEIGHT

    def add_target(self, n: int, seconds: float) -> None:
        """A target call that scored ``n`` tokens took ``seconds``: the profile counts less."""
        self.target.setdefault(n, Mean()).add(seconds)
        self.profile_weight *= FORGET

    def target_curve(self):
        """n -> T(n), or None before any call or profile point. A straight line is fitted to
        the per-size means (weighted by how much each size was seen; one size seen: flat) and
        the profile's points; then each size seen, or profiled, is a knot: its own mean and
        the profile's point, shrunk towards the line as if the line were `SHRINK` more
        observations; T runs straight between knots, with the line's slope past the ends, and
        never falls. The line alone would blur a bend: on llama.cpp 2 tokens can cost 1.7x
        one and 5 tokens 2.1x, and a line through all sizes put the plain step 15% too dear
        and a 1-token draft 10% too cheap, so drafts that lose looked worth it. Before the
        pair's own calls spread over sizes, the profile gives the curve its shape: the first
        batch of rows shares its call as the hardware allows."""
        points = [(m, mean.value, mean.weight) for m, mean in self.target.items()]
        profile = [(m, seconds, self.profile_weight) for m, seconds in self.profile.items()]
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
            top = max(top, (total + SHRINK * line(m)) / (w + SHRINK))
            knots.append((m, top))
        return partial(_through, knots, slope)

    def target_seconds(self, n: float) -> float | None:
        curve = self.target_curve()
        return None if curve is None else curve(n)

    def read_per_token(self) -> float | None:
        """Drafter seconds per backlog token read, beyond a pass (before any read: a share of a pass)."""
        if self.read.value is not None or self.draft.value is None:
            return self.read.value
        return self.draft.value * FIRST_READ_SHARE

    def read_seconds(self, tokens: int) -> float:
        """What reading ``tokens`` backlog tokens costs the drafter before it can draft."""
        per_token = self.read_per_token()
        return 0.0 if tokens <= FREE_READ or per_token is None else per_token * tokens


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
        return max(MIN_SECONDS, seconds + slope * (n - m))
    (m1, s1), (m2, s2) = knots[i - 1], knots[i]
    return max(MIN_SECONDS, s1 + (s2 - s1) * (n - m1) / (m2 - m1))


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
            return PRIOR_ACCEPTANCE
        return self.positions[min(i, len(self.positions)) - 1].value

    def add(self, offered: int, accepted: int) -> None:
        """A step offered ``offered`` candidates; the first ``accepted`` were accepted."""
        self.steps += 1
        while len(self.positions) < offered:
            self.positions.append(Mean(PRIOR_ACCEPTANCE, 1.0))
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


# -- pure functions of the estimates -------------------------------------------------------
def expected_rate(k: int, costs: Costs, acc: Acceptance, curve, draft: float,
                  overhead: float, read: float = 0.0, budget: int = 1 << 30) -> float:
    """Expected committed tokens per second of a step with ``k`` drafts (``curve``: the fitted
    T(n); ``draft``: seconds per drafter pass, 0 for copies; ``read``: seconds to read the
    backlog first, paid once for the ``budget`` tokens still wanted)."""
    if k == 0:
        return 1.0 / (curve(1) + costs.plain_overhead.value)
    m = acc.ratio.value * k
    expected = acc.expected_tokens(m)
    return expected / (k * draft + curve(1 + m) + overhead + read * expected / max(budget, 1))


def best(max_k: int, costs: Costs, acc: Acceptance, free: bool = False, budget: int = 1 << 30,
         backlog: int = 0) -> tuple[int, float | None]:
    """``(k, expected tokens per second)`` for the best k in 0..max_k (0 = a plain step); the
    rate is None (and k = max_k) before anything is measured. ``free``: drafts cost no drafter
    pass (copies); ``backlog``: tokens the drafter reads before drafting."""
    curve = costs.target_curve()
    draft = 0.0 if free else costs.draft.value
    if curve is None or draft is None:
        return max_k, None  # nothing measured yet: draft, and learn from it
    overhead = (costs.plain_overhead if free else acc.overhead).value
    read = costs.read_seconds(backlog)
    rates = [expected_rate(k, costs, acc, curve, draft, overhead, read, budget) for k in range(max_k + 1)]
    k = max(range(max_k + 1), key=lambda i: (rates[i], -i))  # ties: the shorter draft
    return k, rates[k]


def read_size(costs: Costs, context: int) -> int:
    """How much of a backlog a draft reads: as many tokens as one plain target step costs to
    read, between PROBE_READ and the drafter's ``context`` (0: all, never cut). A read is paid
    once and lost whole when the answer ends soon after; a longer one buys acceptance."""
    per_token, plain = costs.read_per_token(), costs.target_seconds(1)
    if not context or not per_token or plain is None:  # reading is free: all of it
        return context
    return min(context, max(PROBE_READ, int(plain / per_token)))


def probe_due(max_k: int, costs: Costs, acc: Acceptance, backlog: int, free: bool = False) -> bool:
    """Whether the steps without the proposer so far (each worth a plain step) have earned a
    probe: a full draft, after reading the last PROBE_READ of the ``backlog``, that wastes at
    most PROBE_SHARE of their time were none of its drafts kept."""
    curve, draft = costs.target_curve(), (0.0 if free else costs.draft.value)
    if not acc.idle or curve is None or draft is None:
        return False
    plain = curve(1)
    waste = (costs.read_seconds(min(backlog, PROBE_READ)) + max_k * draft
             + curve(1 + acc.ratio.value * max_k) - plain)
    return acc.idle * plain * PROBE_SHARE >= waste


def renting(costs: Costs, backlog: int, new_tokens: int) -> bool:
    """Whether to keep decoding plainly before the drafter reads a backlog (a prompt). Reading
    is repaid only by the tokens after it, and an answer may end early: read only once this
    request's tokens so far would have cost as much at one plain step each (ski rental: at
    most about twice the better of reading at once and never reading)."""
    read, plain = costs.read_seconds(backlog), costs.target_seconds(1)
    return read > 0 and plain is not None and read > new_tokens * plain


def room(state) -> int:
    """How many candidates are worth offering: the target's context window must hold them,
    and one token of the step is always the target's own, so drafts beyond the remaining
    budget minus one would be thrown away."""
    return max(0, min(state.target.max_length - len(state.committed), state.budget) - 1)


# -- one generation's choices --------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """What one step does: ``proposer`` "draft", "copy" or "plain" with ``k`` candidates (0: a
    plain target step); a drafter first reads the last ``read`` tokens of its backlog (0: as
    many as its context allows). ``acc``: the estimator that learns from the step; ``ran``:
    its proposer drafted or probed (its idle count restarts); ``waited``: estimators whose
    proposer sat out the step (their idle counts grow towards a probe)."""

    proposer: str
    k: int
    read: int = 0
    acc: Acceptance | None = None
    ran: bool = False
    waited: tuple = ()
    probe: bool = False  # a full draft due for re-measuring the drafter: `allocate` keeps it

    def cut(self, k: int) -> Choice:
        """This step with at most ``k`` candidates (`allocate`). Cut to none, the proposer sits
        the step out, as when `best` prefers a plain step: its idle count grows."""
        if k >= self.k:
            return self
        if k:
            return replace(self, k=k)
        return Choice(self.proposer, 0, 0, self.acc, False, (*self.waited, self.acc))

    def reading(self, read: int) -> Choice:
        """This step with the drafter reading at most the last ``read`` tokens of its backlog."""
        return replace(self, read=min(self.read, read) if self.read else read)


@dataclass
class Measured:
    """One step as the loop timed it."""

    wall: float  # seconds from the choice to verification
    draft: float  # drafter seconds
    target: float  # target seconds
    calls: int  # drafter passes
    scored: int  # tokens the target call scored (its backlog and the candidates)
    offered: int  # candidates
    accepted: int
    read: int  # backlog tokens the drafter read with its first pass
    # the target call's tokens over all the rows it scored (None: a call of this row alone)
    call_tokens: int | None = None
    records_call: bool = True  # this row adds the call to the cost curve (one row per call and pair)


class Policy:
    """Draft lengths of one generation: ``max_k`` every step, or adaptive. ``draft``: the
    drafter method's estimator (None: no drafter); ``copies``: whether prompt lookup proposes
    too (its estimators are per matched n-gram length); ``context``: the most backlog tokens
    the drafter reads (0: all)."""

    def __init__(self, max_k: int, adaptive: bool, estimates: Estimates, greedy: bool,
                 draft: Acceptance | None = None, copies: bool = False, context: int = 0):
        self.max_k, self.adaptive, self.estimates, self.greedy = max_k, adaptive, estimates, greedy
        self.draft, self.copies, self.context = draft, copies, context
        self.steps = {"draft": 0, "copy": 0}  # steps each proposer ran in this generation

    def choose(self, state, drafter=None, match: int = 0) -> Choice:
        """The step to run, given the ``drafter`` (None: none) and the length of the n-gram
        match prompt lookup found (0: none)."""
        if self.copies:
            if self.draft is None:
                return self._length(state, "copy", self._copies(match), None, ())
            copy, waited = self.copy_wins(state, drafter, match)
            if copy:
                return self._length(state, "copy", self._copies(match), None, (self.draft,) if waited else ())
        if self.draft is None:
            return Choice("plain", 0)
        return self._length(state, "draft", self.draft, drafter, ())

    def _copies(self, match: int) -> Acceptance:
        return self.estimates.of("copy", self.greedy, match)

    def backlog(self, drafter) -> int:
        """Committed tokens the drafter reads before it can draft (at most `read_size`)."""
        if drafter is None:
            return 0
        read = read_size(self.estimates.costs, self.context)
        return min(drafter.behind, read) if read else drafter.behind

    def copy_wins(self, state, drafter, match: int) -> tuple[bool, bool]:
        """``(copy, drafter waited)``: copy when there is a match and it is expected to commit
        more tokens per second than the drafter. A step the drafter sits out while its own
        best is a plain step counts towards its next probe, and a due probe runs it instead."""
        if not match:
            return False, False
        costs, backlog = self.estimates.costs, self.backlog(drafter)
        k, drafter_rate = best(self.max_k, costs, self.draft, False, state.budget, backlog)
        _, copy_rate = best(self.max_k, costs, self._copies(match), True, state.budget)
        if None in (drafter_rate, copy_rate) or copy_rate <= drafter_rate:
            return False, False
        if k:
            return True, False
        if probe_due(self.max_k, costs, self.draft, backlog):
            return False, False
        return True, True

    def _length(self, state, proposer: str, acc: Acceptance, drafter, waited: tuple) -> Choice:
        costs, free = self.estimates.costs, proposer == "copy"  # copies cost no drafter pass
        if not self.adaptive:
            return Choice(proposer, min(self.max_k, room(state)), self.context, acc, False, waited)
        if self.steps[proposer] == 1 and 1 not in costs.target:
            # measure a plain step once per pair (step 0 also reads the prompt: not used)
            return Choice(proposer, 0, 0, acc, False, waited)
        backlog = 0 if free else self.backlog(drafter)
        k = best(self.max_k, costs, acc, free, state.budget, backlog)[0]
        if k and renting(costs, backlog, state.stats.new_tokens):
            return Choice(proposer, 0, 0, acc, False, waited)  # not a verdict: no probe owed
        if k:
            read = read_size(costs, self.context)
            return Choice(proposer, min(k, room(state)), read, acc, True, waited)
        if probe_due(self.max_k, costs, acc, backlog, free):
            return Choice(proposer, min(self.max_k, room(state)), PROBE_READ, acc, True, waited, True)
        return Choice(proposer, 0, 0, acc, False, (*waited, acc))

    def bid(self, choice: Choice, state, drafter=None) -> Bid:
        """``choice`` as one row of a shared target call (`allocate`). A fixed draft length and
        a probe are kept whole; renting and the first plain step chose no drafts already."""
        free = choice.proposer == "copy"
        together = not free and getattr(getattr(drafter, "session", None), "batch", None) is not None
        return Bid(choice, self.estimates.costs, len(state.pending),
                   not self.adaptive or choice.probe, free, 0 if free else self.backlog(drafter),
                   state.budget, together)

    def learns_call(self, choice: Choice) -> bool:
        """Whether the step ``choice`` leads to adds its target call to the pair's cost curve:
        adaptive, and not this proposer's first step (whose call also read the prompt)."""
        return self.adaptive and choice.proposer != "plain" and self.steps[choice.proposer] > 0

    def observe(self, choice: Choice, step: Measured) -> None:
        """Learn from the step ``choice`` led to."""
        learns = self.learns_call(choice) and step.records_call
        if choice.ran:
            choice.acc.idle = 0
        for acc in choice.waited:
            acc.idle += 1
        if choice.proposer == "plain":
            return
        self.steps[choice.proposer] += 1
        if not self.adaptive:
            return
        c, acc = self.estimates.costs, choice.acc
        if learns:
            c.add_target(step.call_tokens or step.scored, step.target)
        rest = max(0.0, step.wall - step.draft - step.target)
        if step.calls:
            if step.read <= FREE_READ:
                c.draft.add(step.draft / step.calls)
            elif c.draft.value is not None:
                # the first pass also read the backlog: price what that added beyond a pass
                # (a whole-pass share per token would price short reads dear)
                c.read.add(max(0.0, step.draft - step.calls * c.draft.value) / step.read)
            acc.overhead.add(rest)
            acc.ratio.add(step.offered / step.calls)
        else:
            c.plain_overhead.add(rest)
            # what the drafter costs and earns goes stale while it does not run (a load that
            # slowed it may have passed): the next probe's measurements then count for more
            stale = () if choice.proposer == "copy" else (acc.overhead, *acc.positions)
            for mean in (c.draft, c.read, *stale):
                mean.fade()
        if step.offered:
            acc.add(step.offered, step.accepted)


# -- rows that share one target call ---------------------------------------------------------
@dataclass(frozen=True)
class Bid:
    """One row of a shared target call, as `allocate` sees it: its `Choice` (at most
    ``choice.k`` candidates; ``fixed``: exactly those), the ``pending`` tokens the call scores
    before them, its pair's ``costs``; ``free``: copies (no drafter pass); ``backlog``: tokens
    the drafter reads first, paid for by the ``budget`` tokens still wanted; ``together``:
    its drafter is a row of a drafter batch, drafting in one call with the other such rows'
    (decoding/step.py `draft_together`)."""

    choice: Choice
    costs: Costs
    pending: int = 1
    fixed: bool = False
    free: bool = False
    backlog: int = 0
    budget: int = 1 << 30
    together: bool = False


def _terms(bid: Bid, k: int) -> tuple:
    """``(expected tokens, drafter seconds, overhead seconds, read seconds, tokens scored)`` of
    ``bid``'s row with ``k`` candidates, priced as `expected_rate` prices them."""
    choice, costs = bid.choice, bid.costs
    if choice.acc is None:  # no proposer: a plain step
        return 1.0, 0.0, costs.plain_overhead.value, 0.0, bid.pending
    acc, draft = choice.acc, (0.0 if bid.free else costs.draft.value or 0.0)
    m = acc.ratio.value * k
    expected = acc.expected_tokens(m)
    if not k or bid.free:
        return expected, k * draft, costs.plain_overhead.value, 0.0, bid.pending + m
    read = costs.read_seconds(bid.backlog) * expected / max(bid.budget, 1)
    return expected, k * draft, acc.overhead.value, read, bid.pending + m


def allocate(bids: list[Bid]) -> list[int]:
    """Joint draft lengths for the rows of one target call: the k's that raise the batch's
    expected committed tokens per second, ``sum E_r / (sum k_r d_r + T(sum n_r) + sum o_r)``
    with n_r the row's pending tokens and candidates (drafters run one row after another;
    drafters that draft together, `Bid.together`, cost the longest draft of them, ``max k_r
    d_r``, with d_r what a pass of them all cost, and are also raised together: every one to
    at least m drafts).

    Each row's own choice is the most it drafts (beside rows that fill the call too, a draft
    seldom buys more than alone; the cap keeps `room` and renting). From no drafts, the move
    that most raises the rate, one row's k raised to any k up to its choice, is taken until
    none helps (one draft at a time would never start a draft that pays only with the ones
    after it: acceptance that rises along a draft, a drafting overhead). One row alone gets
    `best`'s k, to the last bit. Fixed rows, and rows whose drafter was never timed, keep
    their k; the call's curve is its first row's with one (the rows of a call share a
    target)."""
    ks = [bid.choice.k for bid in bids]
    curve = next((c for c in (bid.costs.target_curve() for bid in bids) if c is not None), None)
    if curve is None:
        return ks
    options = []  # per row: k -> its terms, for each k it may take
    joint = []  # per row: k -> its drafter seconds where it drafts together (else 0, summed)
    for i, bid in enumerate(bids):
        timed = bid.free or bid.choice.acc is None or bid.costs.draft.value is not None
        ks_i = [ks[i]] if bid.fixed or not timed else range(ks[i] + 1)
        terms = {k: _terms(bid, k) for k in ks_i}
        joint.append({k: t[1] if bid.together else 0.0 for k, t in terms.items()})
        if bid.together:  # its drafter seconds count in the max, not the sum
            terms = {k: (t[0], 0.0, *t[2:]) for k, t in terms.items()}
        options.append(terms)
        ks[i] = min(ks_i)

    def rate(totals, together):
        expected, drafts, overheads, reads, tokens = totals
        return expected / (drafts + together + curve(tokens) + overheads + reads)

    while True:
        totals = [sum(x) for x in zip(*(options[i][k] for i, k in enumerate(ks)), strict=True)]
        longest = sorted(((joint[i][k], i) for i, k in enumerate(ks)), reverse=True)[:2] + [(0.0, -1)]
        now, move = rate(totals, longest[0][0]), None
        for i, k in enumerate(ks):
            others = longest[1][0] if longest[0][1] == i else longest[0][0]
            for more, terms in options[i].items():
                if more > k:
                    r = rate([t - o + n for t, o, n in zip(totals, options[i][k], terms, strict=True)],
                             max(others, joint[i][more]))
                    if r > now:  # ties: the earlier row, the shorter draft
                        now, move = r, [(i, more)]
        # drafters that draft together also move together: one row's longer draft alone
        # makes all wait, where every row's pays
        for m in range(1, max((max(o) for o, b in zip(options, bids, strict=True) if b.together), default=0) + 1):
            raised = [(i, max(k, min(m, max(options[i])))) for i, k in enumerate(ks) if bids[i].together]
            if all(k in options[i] for i, k in raised) and any(k > ks[i] for i, k in raised):
                after = dict(enumerate(ks)) | dict(raised)
                chosen = [options[i][k] for i, k in after.items()]
                r = rate([sum(x) for x in zip(*chosen, strict=True)], max(joint[i][k] for i, k in after.items()))
                if r > now:
                    now, move = r, raised
        if move is None:
            return ks
        for i, k in move:
            ks[i] = k
