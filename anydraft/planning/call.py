"""The rules of one step over rows that share target calls: who is scored in which call, what
each row proposes (`plan`), what joining prompts each call reads on the side (`prefill`), and
what each row's policy learns from its step (`learn`).

A row alone is a call of one, and gets exactly its own policy's choice. Rows whose target
sessions are rows of one batch (models/batch.py) are scored in ONE call: what one row drafts
lengthens everyone's step, so their draft lengths are chosen together (`allocate`, after every
row's own choice), and the call is added to the pair's cost curve once, at its total tokens, by
one row per pair. Rows of one pair share its estimates and so decide alike; `plan` keeps what
they would all do at once (probe, draft on little evidence, read a long backlog) to about
what one costs.

Sequences still reading their prompts (``joining``) read them inside the target calls, as much
each step as `prefill_budget` allows: a call then costs little more than the step alone, and
nobody waits for a call of a prompt's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .cost import read_size
from .policy import Choice, Measured, allocate
from .settings import PREFILL_CHUNK, SETTINGS


@dataclass
class Call:
    """One target call of a step. Built once per step by `calls`; `prefill` then fills in what
    it reads beside its rows, its tokens and who records it, once the rows proposed."""

    rows: list[int]  # the step's rows it scores, by index (none: joiners of no batch, read alone)
    batch: object = None  # the target `BatchSession` its rows are rows of (None: a row alone)
    prefills: list = field(default_factory=list)  # [(joining DecodeState, prompt ids it reads)]
    budget: int = 0  # prompt tokens it may read for joining sequences (`prefill_budget`)
    tokens: int = 0  # tokens it scores: its rows' pending tokens and candidates, and the prefills
    records: set = field(default_factory=set)  # rows that add it to their pair's cost curve


def calls(rows: list) -> list[Call]:
    """The target calls that score ``rows``: one per batch for the rows whose targets are rows
    of one `BatchSession`, one per row otherwise, in the order of their first rows."""
    out, batches = [], {}
    for i, row in enumerate(rows):
        batch = row.state.target.batch
        if batch is None:
            out.append(Call([i]))
        elif id(batch) in batches:
            batches[id(batch)].rows.append(i)
        else:
            out.append(batches.setdefault(id(batch), Call([i], batch)))
    return out


def plan(rows: list, calls: list[Call]) -> list[Choice]:
    """Each row's `Choice`: its own policy's, then, for rows scored in one call (what one row
    drafts, all wait for), cut to the call's joint draft lengths (`allocate`). Rows of one pair
    share its estimates, so a probe falls due for all of them at once: one probe per call
    re-measures the drafter, the others sit the step out; likewise while the estimates it gave
    rest on little (`_confirm`), and for long drafter reads, which every row of the call waits
    for (`_share_reads`). Changes nothing: `learn` does."""
    choices = []
    for row in rows:
        match = row.copy_proposer.match(row.state.committed) if row.copy_proposer is not None else 0
        choices.append(row.policy.choose(row.state, row.drafter, match))
    for call in calls:
        group = call.rows
        if len(group) > 1:
            for i in [i for i in group if choices[i].probe][1:]:
                choices[i] = choices[i].cut(0)
            _confirm(rows, choices, group)
            _share_reads(rows, choices, group)
            ks = allocate([rows[i].policy.bid(choices[i], rows[i].state, rows[i].drafter) for i in group])
            for i, k in zip(group, ks, strict=True):
                choices[i] = choices[i].cut(k)
            _wait_once(choices, group)
    return choices


def _confirm(rows: list, choices: list, group: list[int]) -> None:
    """One adaptive row a call drafts while its acceptance estimate rests on fewer than
    `Settings.evidence` observations of the first draft position (at the start, or after a
    probe of estimates that had faded): rows of one pair share the estimate, so one probe whose
    drafts were all kept had every row draft long in the next steps, calls several times a
    plain one (docs/benchmarks-history.md). The others sit out until the drafting row's steps
    confirm it."""
    seen = set()
    for i in group:
        choice = choices[i]
        if not (choice.proposer == "draft" and choice.k and rows[i].policy.adaptive):
            continue
        positions = choice.acc.positions
        if (positions[0].weight if positions else 0.0) < SETTINGS.evidence:
            if id(choice.acc) in seen:
                choices[i] = choice.cut(0)
            seen.add(id(choice.acc))


def _wait_once(choices: list, group: list[int]) -> None:
    """A call's step counts once towards each sitting-out estimator's next probe, however many
    of its rows sat out: probes are due once the steps without the drafter cost enough
    (`probe_due`, one plain step each), and every row counting probed several times as
    often, each probe lengthening every row's step (docs/benchmarks-history.md)."""
    seen: set = set()
    for i in group:
        waited = tuple(acc for acc in choices[i].waited if id(acc) not in seen)
        seen.update(id(acc) for acc in choices[i].waited)
        if waited != choices[i].waited:
            choices[i] = replace(choices[i], waited=waited)


def _share_reads(rows: list, choices: list, group: list[int]) -> None:
    """Keep the long drafter reads of one call's rows, which every row of it waits for, to
    about what one costs alone. Rows of one pair decide alike, so their drafters start (the
    prompt) or resume (what was committed while they sat drafting out) in the same step, and
    such reads made a batch's longest steps (docs/benchmarks-history.md).
    The readers share one read's worth (`read_size`, what one plain step costs), each the last
    ``max(probe_read, its share)`` tokens of its backlog: as many readers a call as that holds
    at `Settings.probe_read` tokens each, the others decoding plainly until their turn; where
    every read is whole (drafter context 0), one a call."""
    readers = [i for i in group if _reads_long(rows[i], choices[i])]
    if len(readers) < 2:
        return
    policy = rows[readers[0]].policy
    size, least = read_size(policy.estimates.costs, policy.context), SETTINGS.probe_read
    turn = min(len(readers), max(1, size // least))
    for i in readers[turn:]:
        choices[i] = choices[i].cut(0)
    if size:
        for i in readers[:turn]:
            choices[i] = choices[i].reading(max(least, size // turn))


def _reads_long(row, choice: Choice) -> bool:
    """Whether ``choice`` has an adaptive row's drafter read more than `Settings.probe_read`
    tokens of its backlog before drafting."""
    if not (choice.proposer == "draft" and choice.k and row.drafter is not None and row.policy.adaptive):
        return False
    behind = row.drafter.behind
    return (min(behind, choice.read) if choice.read else behind) > SETTINGS.probe_read


def prefill_budget(curve, tokens: int, min_prefill: int | None = None) -> int:
    """Prompt tokens a call of ``tokens`` step tokens also reads for joining sequences: up to
    the size whose cost stays within `Settings.batch_latency` of a one-token call, at least
    ``min_prefill`` (default `Settings.min_prefill`; ``anydraft serve --min-read``: fewer keep
    the decoding rows' steps steadier where the curve is steep, more bring a prompt's first
    token sooner), at most a prompt chunk; a whole chunk where the cost curve is unknown.
    ``curve``: tokens -> seconds (`Costs.target_curve`) or None."""
    if curve is None:
        return PREFILL_CHUNK
    limit = SETTINGS.batch_latency * curve(1)
    low, high = 0, PREFILL_CHUNK  # the most extra tokens within the limit (the curve never falls)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if curve(tokens + mid) <= limit else (low, mid - 1)
    return max(SETTINGS.min_prefill if min_prefill is None else min_prefill, low)


def prefill(rows: list, calls: list[Call], choices: list[Choice], candidates: list,
            joining=(), min_prefill: int | None = None) -> list[Call]:
    """The calls as they run, once the rows proposed ``candidates`` (the rows that failed
    left out of ``calls`` already; a call with none left is dropped). Each call reads the
    prompts of ``joining`` `DecodeState`s whose targets are rows of its batch, the first
    joiners first, within its `prefill_budget`; one more call (last, with no rows) reads the
    joiners of no call's batch, alone. Where more requests wait to join a call's batch than
    it decodes, it reads a whole `PREFILL_CHUNK` of them: each token read slows the decoding
    rows' step and brings the joiners' first tokens forward, and when the joiners are more,
    reading them at once serves more requests sooner, in the pieces a prompt reads fastest in
    (llama-server reads every waiting prompt in its next call). Eight clients arriving
    together on a steep curve (Qwen2.5-1.5B on llama.cpp, AMD Zen 5): when the first request
    started alone, the others were read 16 tokens a step, their first tokens came 1.2-15.4 s
    after sending, and the level took 20.5 s; when all eight were read at once, 8.3 s and
    16.4 s (docs/llama-server.md). Each call also learns its tokens and which rows record it
    (`_records`)."""
    pending = [s for s in joining if len(s.pending) > 1]
    out = []
    for call in calls:
        if not call.rows:
            continue
        steps = sum(len(rows[i].state.pending) + len(candidates[i]) for i in call.rows)
        joiners = [s for s in pending if call.batch is not None and s.target.batch is call.batch]
        budget = prefill_budget(rows[call.rows[0]].policy.estimates.costs.target_curve(), steps, min_prefill)
        if len(joiners) > len(call.rows):  # a crowd waits: a whole chunk (see above)
            budget = max(budget, PREFILL_CHUNK)
        call.budget = budget
        for state in joiners:
            if budget > 0:
                # an exact batch reads a prompt in the pieces a request alone does (`exact.reads`)
                piece = PREFILL_CHUNK if call.batch.exact else budget
                call.prefills.append((state, state.pending[:-1][:piece]))
                budget -= len(call.prefills[-1][1])
            pending.remove(state)  # a joiner of this batch waits for its next call, never alone
        call.tokens = steps + sum(len(ids) for _, ids in call.prefills)
        call.records = _records(rows, choices, call)
        out.append(call)
    return out + [Call([], prefills=[(s, s.pending[:-1][:PREFILL_CHUNK]) for s in pending])]


def _records(rows: list, choices: list[Choice], call: Call) -> set[int]:
    """The rows of ``call`` that add it to their pair's cost curve: per pair (`Costs`) the first
    whose policy learns from the step, unless a row reads its prompt in the call (its first:
    the cost is the prompt's, not a step's)."""
    if not all(rows[i].state.stats.target_calls for i in call.rows):
        return set()
    out, seen = set(), set()
    for i in call.rows:
        costs = id(rows[i].policy.estimates.costs)
        if costs not in seen and rows[i].policy.learns_call(choices[i]):
            seen.add(costs)
            out.add(i)
    return out


def learn(call: Call, i: int, row, choice: Choice, outcome: Measured) -> None:
    """Teach row ``i``'s policy what its step (``outcome``, as the step timed it) cost and
    earned, within ``call``: the call's tokens over all its rows, and whether this row adds the
    call to the pair's cost curve."""
    outcome.call_tokens, outcome.records_call = call.tokens, i in call.records
    row.policy.observe(choice, outcome)
