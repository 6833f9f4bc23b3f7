"""The one cost model: what a step is expected to commit, what it costs, and the rules priced
by it (the best draft length, when to probe, when and how much of a backlog to read).

A row's step with k candidates commits ``E(m) = 1 + a_1 + a_1 a_2 + ... + a_1...a_m`` tokens in
expectation, m = r k candidates (with one constant a this is Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", ICML 2023, eq. 1), and costs
``k d + T(p + m) + o + read``: its drafter passes, the target call scoring its p pending tokens
and the candidates, the rest of the step, and its drafter's backlog read, paid once for the
tokens still wanted. A plain step (k = 0) costs ``T(p) + o_plain``. A step with candidates is
priced as committing `Settings.min_gain` fewer of them than expected. `terms` prices one row;
`rate` prices any number of rows sharing one call, whose terms add up (a single row is a call
of one). Symbols: planning/estimates.py.
"""

from __future__ import annotations

from typing import NamedTuple

from .estimates import Acceptance, Costs
from .settings import SETTINGS

WANTED = 1 << 30  # tokens still wanted where nobody said: as good as unbounded


class Terms(NamedTuple):
    """One row's step, priced; the terms of rows sharing a call add up, field by field."""

    expected: float  # tokens it commits in expectation
    draft: float  # drafter seconds (its passes)
    overhead: float  # seconds of the rest of the step (translation, verification)
    read: float  # drafter seconds reading its backlog, the share this step pays
    tokens: float  # tokens the target call scores for it


def terms(k: int, costs: Costs, acc: Acceptance | None, *, free: bool = False, backlog: int = 0,
          budget: int = WANTED, pending: int = 1) -> Terms:
    """The `Terms` of a row's step with ``k`` candidates from the proposer ``acc`` measures
    (None: no proposer, a plain step). ``free``: the candidates cost no drafter pass (copies);
    ``backlog``: tokens the drafter reads first, paid for by the ``budget`` tokens still
    wanted; ``pending``: committed tokens the call scores before the candidates. A drafter
    never timed is priced at no seconds a pass (`best` and `allocate` keep its k)."""
    if acc is None:
        return Terms(1.0, 0.0, costs.plain_overhead.value, 0.0, pending)
    draft = 0.0 if free else costs.draft.value or 0.0
    m = acc.ratio.value * k
    expected = acc.expected_tokens(m)
    if k:  # a draft must beat a plain step by a margin: the estimates it wins on are noisy
        expected /= 1 + SETTINGS.min_gain
    if not k or free:
        return Terms(expected, k * draft, costs.plain_overhead.value, 0.0, pending + m)
    read = costs.read_seconds(backlog) * expected / max(budget, 1)
    return Terms(expected, k * draft, acc.overhead.value, read, pending + m)


def drafting_pays(curve: dict[int, float], draft_step: float, acceptance: float) -> bool:
    """Whether some draft of k tokens, each accepted with probability ``acceptance``, would
    commit tokens faster than plain decoding on the target's measured ``curve`` (seconds to
    score M tokens in one call) with a drafter pass of ``draft_step`` seconds:
    ``E(k) / (k d + T(k + 1)) > 1 / T(1)`` for a size k + 1 the curve holds, with E(k) the
    expected tokens of Leviathan et al. (ICML 2023, eq. 1)."""
    a = acceptance
    return any((1 - a ** m) / (1 - a) / (draft_step * (m - 1) + seconds) > 1 / curve[1]
               for m, seconds in curve.items() if m > 1)


def rate(total: Terms | list[float], curve, together: float = 0.0) -> float:
    """Expected committed tokens per second of a call whose rows' terms add up to ``total``
    (``curve``: the fitted T(n); ``together``: drafter seconds of rows drafting in one
    drafter call, the longest of their drafts, beside the drafts summed in ``total``)."""
    expected, draft, overhead, read, tokens = total
    return expected / (draft + together + curve(tokens) + overhead + read)


def best(max_k: int, costs: Costs, acc: Acceptance, free: bool = False, budget: int = WANTED,
         backlog: int = 0) -> tuple[int, float | None]:
    """``(k, expected tokens per second)`` for the best k in 0..max_k (0 = a plain step) of a
    row alone; the rate is None (and k = max_k) before anything is measured. ``free``: drafts
    cost no drafter pass (copies); ``backlog``: tokens the drafter reads before drafting."""
    curve = costs.target_curve()
    if curve is None or (not free and costs.draft.value is None):
        return max_k, None  # nothing measured yet: draft, and learn from it
    rates = [rate(terms(k, costs, acc, free=free, backlog=backlog, budget=budget), curve)
             for k in range(max_k + 1)]
    k = max(range(max_k + 1), key=lambda i: (rates[i], -i))  # ties: the shorter draft
    return k, rates[k]


def read_size(costs: Costs, context: int) -> int:
    """How much of a backlog a draft reads: as many tokens as one plain target step costs to
    read, between `Settings.probe_read` and the drafter's ``context`` (0: all, never cut). A
    read is paid once and lost whole when the answer ends soon after; a longer one buys
    acceptance."""
    per_token, plain = costs.read_per_token(), costs.target_seconds(1)
    if not context or not per_token or plain is None:  # reading is free: all of it
        return context
    return min(context, max(SETTINGS.probe_read, int(plain / per_token)))


def probe_due(max_k: int, costs: Costs, acc: Acceptance, backlog: int, free: bool = False) -> bool:
    """Whether the steps without the proposer so far (each worth a plain step) have earned a
    probe: a full draft, after reading the last `Settings.probe_read` of the ``backlog``, that
    wastes at most `Settings.probe_share` of their time were none of its drafts kept."""
    curve, draft = costs.target_curve(), (0.0 if free else costs.draft.value)
    if not acc.idle or curve is None or draft is None:
        return False
    plain = curve(1)
    waste = (costs.read_seconds(min(backlog, SETTINGS.probe_read)) + max_k * draft
             + curve(1 + acc.ratio.value * max_k) - plain)
    return acc.idle * plain * SETTINGS.probe_share >= waste


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
