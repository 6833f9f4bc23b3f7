"""One row's plan: fixed, or chosen from what the pair costs and earns; and the joint draft
lengths of the rows that share a target call.

`Policy.choose` returns a `Choice` and changes nothing; `Policy.observe` learns from the step
it led to (decoding/step.py, through planning/call.py `learn`). Adaptive drafting picks the
draft length k (0 = a plain target step) that maximises expected committed tokens per second
(planning/cost.py). A drafter behind the committed text (the prompt, at first) reads its
backlog before drafting: that cost is spread over the tokens still wanted; the read waits until
the answer's plain tokens would have cost as much (ski rental: `renting`), and it reads only
as many of the backlog's last tokens as one plain step costs (`read_size`). When no k beats a
plain step, the method runs plain steps (or copies) and probes with a full draft once the
steps without the drafter have cost enough (`probe_due`). The estimates live in the `Pairing`
(or the decoder, without a drafter): a pair's next request starts from what the last one learned.

In a batch the rows whose targets are rows of one batch are scored in one call, and what one
row drafts lengthens everyone's step: `allocate` shares the call out. Each row's choice alone
is the most it drafts, and drafts go, one row at a time, where they raise the batch's committed
tokens per second. Where the curve is flat the rows draft as they would alone; where several
rows already fill it (a linear curve) drafts shrink, towards plain batched decoding. One row
alone gets exactly its own choice.

The draft length never changes what is sampled, only how fast (every method is lossless for
any k), but with adaptive drafting a seeded sample depends on timing: use a fixed draft length
for run-to-run identical seeded samples. The measurements behind each mechanism are in
docs/adaptive-drafting.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .cost import WANTED, best, probe_due, rate, read_size, renting, room, terms
from .estimates import Acceptance, Costs, Estimates
from .settings import SETTINGS


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
        return Choice(self.proposer, 0, acc=self.acc, waited=(*self.waited, self.acc))

    def reading(self, read: int) -> Choice:
        """This step with the drafter reading at most the last ``read`` tokens of its backlog."""
        return replace(self, read=min(self.read, read) if self.read else read)


@dataclass
class Measured:
    """One step as decoding/step.py timed it (the call's fields: filled by planning/call.py
    `learn`)."""

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
        self._priced: dict = {}  # `_best`'s answers within one `choose`

    def choose(self, state, drafter=None, match: int = 0) -> Choice:
        """The step to run, given the ``drafter`` (None: none) and the length of the n-gram
        match prompt lookup found (0: none)."""
        # `best`'s answers within this choice, by their inputs: nothing they read changes in
        # it, and `copy_wins` prices the very rows `_length` then prices again
        self._priced: dict = {}
        if self.copies:
            if self.draft is None:
                return self._length(state, "copy", self.copy_estimates(match), None, ())
            copy, waited = self.copy_wins(state, drafter, match)
            if copy:
                return self._length(state, "copy", self.copy_estimates(match), None, (self.draft,) if waited else ())
        if self.draft is None:
            return Choice("plain", 0)
        return self._length(state, "draft", self.draft, drafter, ())

    def copy_estimates(self, match: int) -> Acceptance:
        """What copies after an n-gram match of ``match`` tokens earn (per match length)."""
        return self.estimates.of("copy", self.greedy, match)

    def backlog(self, drafter) -> int:
        """Committed tokens the drafter reads before it can draft (at most `read_size`)."""
        if drafter is None:
            return 0
        return drafter.behind_up_to(read_size(self.estimates.costs, self.context))

    def copy_wins(self, state, drafter, match: int) -> tuple[bool, bool]:
        """``(copy, drafter waited)``: copy when there is a match and it is expected to commit
        more tokens per second than the drafter. A step the drafter sits out while its own
        best is a plain step counts towards its next probe, and a due probe runs it instead."""
        if not match:
            return False, False
        costs, backlog = self.estimates.costs, self.backlog(drafter)
        k, drafter_rate = self._best(self.draft, False, state.budget, backlog)
        _, copy_rate = self._best(self.copy_estimates(match), True, state.budget, 0)
        if None in (drafter_rate, copy_rate) or copy_rate <= drafter_rate:
            return False, False
        if k:
            return True, False
        if probe_due(self.max_k, costs, self.draft, backlog):
            return False, False
        return True, True

    def _best(self, acc: Acceptance, free: bool, budget: int, backlog: int) -> tuple[int, float | None]:
        """`best` for this policy's rows, once per choice and inputs."""
        key = (id(acc), free, budget, backlog)
        if key not in self._priced:
            self._priced[key] = best(self.max_k, self.estimates.costs, acc, free, budget, backlog)
        return self._priced[key]

    def _length(self, state, proposer: str, acc: Acceptance, drafter, waited: tuple) -> Choice:
        costs, free = self.estimates.costs, proposer == "copy"  # copies cost no drafter pass
        if not self.adaptive:
            return Choice(proposer, min(self.max_k, room(state)), read=self.context, acc=acc, waited=waited)
        if self.steps[proposer] == 1 and 1 not in costs.target:
            # measure a plain step once per pair (step 0 also reads the prompt: not used)
            return Choice(proposer, 0, acc=acc, waited=waited)
        backlog = 0 if free else self.backlog(drafter)
        k = self._best(acc, free, state.budget, backlog)[0]
        if k and renting(costs, backlog, state.stats.new_tokens):
            return Choice(proposer, 0, acc=acc, waited=waited)  # not a verdict: no probe owed
        if k:
            read = read_size(costs, self.context)
            return Choice(proposer, min(k, room(state)), read=read, acc=acc, ran=True, waited=waited)
        if probe_due(self.max_k, costs, acc, backlog, free):
            return Choice(proposer, min(self.max_k, room(state)), read=SETTINGS.probe_read, acc=acc,
                          ran=True, waited=waited, probe=True)
        return Choice(proposer, 0, acc=acc, waited=(*waited, acc))

    def bid(self, choice: Choice, state, drafter=None) -> Bid:
        """``choice`` as one row of a shared target call (`allocate`). A fixed draft length and
        a probe are kept whole; renting and the first plain step chose no drafts already."""
        free = choice.proposer == "copy"
        together = not free and drafter is not None and drafter.batch is not None
        return Bid(choice, self.estimates.costs, pending=len(state.pending),
                   fixed=not self.adaptive or choice.probe, free=free,
                   backlog=0 if free else self.backlog(drafter), budget=state.budget, together=together)

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
            if step.read <= SETTINGS.free_read:
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
    budget: int = WANTED
    together: bool = False


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
        priced = {k: terms(k, bid.costs, bid.choice.acc, free=bid.free, backlog=bid.backlog,
                           budget=bid.budget, pending=bid.pending) for k in ks_i}
        joint.append({k: t.draft if bid.together else 0.0 for k, t in priced.items()})
        if bid.together:  # its drafter seconds count in the max, not the sum
            priced = {k: t._replace(draft=0.0) for k, t in priced.items()}
        options.append(priced)
        ks[i] = min(ks_i)

    while True:
        totals = [sum(x) for x in zip(*(options[i][k] for i, k in enumerate(ks)), strict=True)]
        longest = sorted(((joint[i][k], i) for i, k in enumerate(ks)), reverse=True)[:2] + [(0.0, -1)]
        now, move = rate(totals, curve, longest[0][0]), None
        for i, k in enumerate(ks):
            others = longest[1][0] if longest[0][1] == i else longest[0][0]
            for more, priced in options[i].items():
                if more > k:
                    r = rate([t - o + n for t, o, n in zip(totals, options[i][k], priced, strict=True)],
                             curve, max(others, joint[i][more]))
                    if r > now:  # ties: the earlier row, the shorter draft
                        now, move = r, [(i, more)]
        # drafters that draft together also move together: one row's longer draft alone
        # makes all wait, where every row's pays
        for m in range(1, max((max(o) for o, b in zip(options, bids, strict=True) if b.together), default=0) + 1):
            raised = [(i, max(k, min(m, max(options[i])))) for i, k in enumerate(ks) if bids[i].together]
            if all(k in options[i] for i, k in raised) and any(k > ks[i] for i, k in raised):
                after = dict(enumerate(ks)) | dict(raised)
                chosen = [options[i][k] for i, k in after.items()]
                r = rate([sum(x) for x in zip(*chosen, strict=True)], curve,
                         max(joint[i][k] for i, k in after.items()))
                if r > now:
                    now, move = r, raised
        if move is None:
            return ks
        for i, k in move:
            ks[i] = k
