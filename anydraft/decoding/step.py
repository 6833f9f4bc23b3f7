"""One speculative step, top to bottom, over a batch of sequences (`Row`s).

For each row: the policy chooses the proposer and the draft length (`Policy.choose`, no side
effects), the proposer proposes (a drafter drafts; prompt lookup copies; a plain step
proposes nothing), the target scores every candidate in one call, the proposer's verifier
judges them, and then, here and only here, both caches are committed or rolled back, the
statistics counted and the policy told what the step cost and earned (`Policy.observe`).

Every method is lossless because each committed token is either a candidate its verifier
accepted or the verifier's own draw; what the policy chooses changes only the speed.
The rows whose target sessions are rows of one batch (models/batch.py) are scored in ONE
call (`score`); every row still verifies, commits and rolls back on its own. Such rows share
the call's cost, so their draft lengths are chosen together (`policy.allocate`, after every
row's own choice), and the call is added to the cost curve once, at its total tokens, by one
row per pair. A row's other measurements are its own: its propose and verify time, and the
shared call as the time it waited for it.

Rows whose drafters are rows of one drafter batch draft together: each drafting pass of them
all is one drafter call (`draft_together`), and `allocate` prices their drafts so.

Sequences still reading their prompts (``joining``) read them inside the target calls, as
much each step as `read_budget` allows: a call then costs little more than the step alone,
and nobody waits for a call of a prompt's own (issue 21: p99 inter-token latency under load).

A row whose own work fails (proposing, drafting, verifying, committing) fails alone: its
result is the exception, it is left out of the calls after the failure, and the other rows
step on (issue 42: one request's failure ended every request of its batch). Only a failure
of a shared call itself, which no one row caused, fails the whole step.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..hardware.profile import BATCH_LATENCY, MIN_READ
from ..methods.policy import PROBE_READ, Measured, allocate, read_size
from ..methods.row import Row
from ..methods.verify import Proposal, verify_exact
from ..models.session import PREFILL_CHUNK
from .logprobs import token_logprobs

# observations of a pair's first draft position before more than one row of a call drafts
# on them (`_confirm`)
EVIDENCE = 3.0


def step(rows: list[Row], joining: list = (), min_read: int = MIN_READ) -> list[tuple[list[int], int] | Exception]:
    """Run one step of every row; return each row's ``(committed tokens, accepted drafts)``:
    the first ``accepted`` tokens were candidates (of the proposer it sets as ``row.proposed``),
    the last is the target's own; or the exception that failed that row alone (its caches are
    then in no known state: the row must leave). ``joining``: `DecodeState`s still reading
    their prompts; the calls read the next part of each (`_reads`, at least ``min_read``
    tokens a call), their logits unused."""
    states = [row.state for row in rows]
    groups = calls(states)
    choices = _choose(rows, groups)
    marks = [_mark(row) for row in rows]  # a row drafting together starts with all of them
    drafts, reads_together = draft_together(rows, choices)
    plans, failed = [], {}
    for i, (row, choice) in enumerate(zip(rows, choices, strict=True)):  # propose
        mark = marks[i] if i in drafts else _mark(row)
        try:
            if isinstance(drafts.get(i), Exception):
                raise drafts[i]
            if i in drafts:
                proposal = row.drafting.finish(row.state, *drafts[i])
            elif choice.proposer == "plain":
                proposal = Proposal([])
            else:
                proposal = row.proposer(choice.proposer).propose(row.state, row.drafter, choice.k, choice.read)
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            failed[i], proposal = exc, Proposal([])
        plans.append((choice, mark, proposal, time.perf_counter() - mark[0]))
    proposed = [proposal.candidates for _, _, proposal, _ in plans]
    if failed:  # the calls score only the rows still going
        groups = [g for g in ([i for i in group if i not in failed] for group in groups) if g]
    reads = _reads(rows, proposed, groups, joining, min_read)
    shared = _shared(rows, choices, proposed, groups, reads)

    start = time.perf_counter()
    logits = score(states, proposed, groups, reads)
    waited = time.perf_counter() - start  # every row waits for every call

    out = []
    for i, (row, (choice, mark, proposal, proposing), scores, call) in enumerate(
            zip(rows, plans, logits, shared, strict=True)):
        if i in failed:
            out.append(failed[i])
            continue
        try:
            out.append(_finish(row, choice, mark, proposal, proposing, scores, call, waited,
                               reads_together.get(i)))
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            out.append(exc)
    return out


def _finish(row: Row, choice, mark: tuple, proposal: Proposal, proposing: float,
            scores: torch.Tensor, call: tuple, waited: float, read: int | None) -> tuple[list[int], int]:
    """Verify one row's candidates against its ``scores``, commit or roll back its caches and
    tell its policy what the step cost and earned: the row's ``(committed tokens, accepted)``."""
    start, state, candidates = time.perf_counter(), row.state, proposal.candidates
    if choice.proposer == "plain":
        n, token = verify_exact(scores, candidates, state.params, state.generator)
    else:
        n, token = row.proposer(choice.proposer).verify(state, proposal, scores)
    # the target keeps the committed text and the accepted candidates; the step's own
    # last token is fed with its next call
    keep = len(state.committed) + n
    if len(state.target) > keep:
        state.target.rollback(keep)
    state.stats.drafted += len(candidates)
    state.stats.rejected += n < len(candidates)
    wall = proposing + waited + time.perf_counter() - start  # its own work, and the wait
    if read is None:
        read = row.drafter.caught_up if row.drafter is not None else 0
    row.policy.observe(choice, _measured(row, mark, wall, len(candidates), n, read, *call))
    new = candidates[:n] + [token]
    if state.top_logprobs is not None:  # asked for: read off the verifying call's own logits
        state.step_logprobs = token_logprobs(state.params, scores, new, state.top_logprobs)
    row.proposed = choice.proposer
    if row.drafter is not None:
        row.drafter.commit(new, n if choice.proposer == "draft" else 0)
    return new, n


def calls(states: list) -> list[list[int]]:
    """The target calls that score ``states``, as lists of their indices: one per batch for
    the states whose targets are rows of one `BatchSession`, one per state otherwise."""
    out, batches = [], {}
    for i, state in enumerate(states):
        batch = getattr(state.target, "batch", None)
        if batch is None:
            out.append([i])
        elif id(batch) in batches:
            batches[id(batch)].append(i)
        else:
            out.append(batches.setdefault(id(batch), [i]))
    return out


def draft_together(rows: list[Row], choices: list) -> tuple[dict, dict]:
    """The drafts of the rows that draft with drafters whose sessions are rows of one batch
    (`Decoder.new_rows`), two or more of them: each drafting pass of all of them is ONE call of
    that batch (`Drafter.drafting`, run in step), so the drafter's weights are read once a
    pass, not once a row. Returns, per row index, ``(drafts, distributions)`` (or the exception
    that failed that row's drafting: the others draft on), and the backlog
    its first pass read: the whole call's, every row's backlog beyond one token each (a row
    whose own backlog was one token still waited for the others'; timed as a clean pass, it
    would price every later pass as a read). Each row drafts exactly as alone (its own text,
    sampling and generator); the calls' time counts as every taking part row's drafting time."""
    groups: dict[int, list[int]] = {}
    for i, (row, choice) in enumerate(zip(rows, choices, strict=True)):
        batch = getattr(row.drafter.session, "batch", None) if row.drafter is not None else None
        if choice.proposer == "draft" and choice.k and batch is not None:
            groups.setdefault(id(batch), []).append(i)
    out, reads = {}, {}
    for group in (g for g in groups.values() if len(g) > 1):
        batch = rows[group[0]].drafter.session.batch
        drafting, feeds = {}, {}
        for i in group:
            row, choice = rows[i], choices[i]
            try:
                drafting[i] = row.drafter.drafting(choice.k, *row.drafting.draft_args(row.state), choice.read)
            except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
                out[i] = exc
                continue
            feeds[i] = _advance(row, drafting[i], None, out, i)
        backlog = 1 + sum(max(0, rows[i].drafter.caught_up - 1) for i in group)
        reads |= {i: backlog for i in group if rows[i].drafter.caught_up}
        while any(ids is not None for ids in feeds.values()):
            feeds = {i: ids for i, ids in feeds.items() if ids is not None}
            start = time.perf_counter()
            logits = batch.feed_rows({rows[i].drafter.session.row: ids for i, ids in feeds.items()},
                                     {rows[i].drafter.session.row: 1 for i in feeds})
            seconds = time.perf_counter() - start
            for i in feeds:
                rows[i].state.stats.phase_seconds["draft"] += seconds
                rows[i].state.stats.drafter_model_seconds += seconds
                feeds[i] = _advance(rows[i], drafting[i], logits[rows[i].drafter.session.row][-1], out, i)
    return out, reads


def _advance(row: Row, drafting, logits, out: dict, i: int):
    """Send ``logits`` to a row's `Drafter.drafting` (None: start it); the ids it feeds next,
    or None once it returned its drafts, or failed (into ``out[i]``: the drafts, or the
    exception)."""
    with row.state.stats.timed("draft"):
        try:
            return next(drafting) if logits is None else drafting.send(logits)
        except StopIteration as end:
            out[i] = end.value
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            out[i] = exc
        return None


def _choose(rows: list[Row], groups: list[list[int]]) -> list:
    """Each row's `Choice`: its own, then, for rows scored in one call (what one row drafts,
    all wait for), cut to the call's joint draft lengths (`policy.allocate`). Rows of one pair
    share its estimates, so a probe falls due for all of them at once: one probe per call
    re-measures the drafter, the others sit the step out; likewise while the estimates it
    gave rest on little (`_confirm`), and for long drafter reads, which every row of the call
    waits for (`_share_reads`)."""
    choices = []
    for row in rows:
        match = row.copying.match(row.state.committed) if row.copying is not None else 0
        choices.append(row.policy.choose(row.state, row.drafter, match))
    for group in groups:
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


def _confirm(rows: list[Row], choices: list, group: list[int]) -> None:
    """One adaptive row a call drafts while its acceptance estimate rests on fewer than
    `EVIDENCE` observations of the first draft position (at the start, or after a probe of
    estimates that had faded): rows of one pair share the estimate, so one probe whose drafts
    were all kept had every row draft 3-5 tokens in the next steps, calls several times a
    plain one (offline, 8 rows: 1.2-1.6 s steps where plain ones took 0.35 s). The others sit
    out until the drafting row's steps confirm it."""
    seen = set()
    for i in group:
        choice = choices[i]
        if not (choice.proposer == "draft" and choice.k and rows[i].policy.adaptive):
            continue
        positions = choice.acc.positions
        if (positions[0].weight if positions else 0.0) < EVIDENCE:
            if id(choice.acc) in seen:
                choices[i] = choice.cut(0)
            seen.add(id(choice.acc))


def _wait_once(choices: list, group: list[int]) -> None:
    """A call's step counts once towards each sitting-out estimator's next probe, however many
    of its rows sat out: probes are due once the steps without the drafter cost enough
    (`probe_due`, one plain step each), and 8 rows counting 8 probed up to 7 times in 64
    steps, each probe lengthening all 8 rows' step by half."""
    seen: set = set()
    for i in group:
        waited = tuple(acc for acc in choices[i].waited if id(acc) not in seen)
        seen.update(id(acc) for acc in choices[i].waited)
        if waited != choices[i].waited:
            choices[i] = replace(choices[i], waited=waited)


def _share_reads(rows: list[Row], choices: list, group: list[int]) -> None:
    """Keep the long drafter reads of one call's rows, which every row of it waits for, to
    about what one costs alone. Rows of one pair decide alike, so their drafters start (the
    prompt) or resume (what was committed while they sat drafting out) in the same step:
    four reading their prompts, or five resuming with ~50 tokens each (2.9 s where the median
    was 0.64 s), made a batch's longest steps (docs/benchmarks-history.md).
    The readers share one read's worth (`read_size`, what one plain step costs), each the last
    ``max(PROBE_READ, its share)`` tokens of its backlog: as many readers a call as that holds
    at PROBE_READ tokens each, the others decoding plainly until their turn (8 rows reading
    16 each would read 4x a read's worth of 29 tokens); where every read is whole (drafter
    context 0), one a call."""
    readers = [i for i in group if _reads_long(rows[i], choices[i])]
    if len(readers) < 2:
        return
    policy = rows[readers[0]].policy
    size = read_size(policy.estimates.costs, policy.context)
    turn = min(len(readers), max(1, size // PROBE_READ))
    for i in readers[turn:]:
        choices[i] = choices[i].cut(0)
    if size:
        for i in readers[:turn]:
            choices[i] = choices[i].reading(max(PROBE_READ, size // turn))


def _reads_long(row: Row, choice) -> bool:
    """Whether ``choice`` has an adaptive row's drafter read more than `PROBE_READ` tokens of
    its backlog before drafting."""
    if not (choice.proposer == "draft" and choice.k and row.drafter is not None and row.policy.adaptive):
        return False
    behind = row.drafter.behind
    return (min(behind, choice.read) if choice.read else behind) > PROBE_READ


def read_budget(curve, tokens: int, min_read: int = MIN_READ) -> int:
    """Prompt tokens a call of ``tokens`` step tokens also reads for joining sequences: up to
    the size whose cost stays within `BATCH_LATENCY` of a one-token call, at least
    ``min_read`` (``anydraft serve --min-read``: fewer keep the decoding rows' steps steadier
    where the curve is steep, more bring a prompt's first token sooner), at most a prompt
    chunk; a whole chunk where the cost curve is unknown. ``curve``: tokens -> seconds
    (`Costs.target_curve`) or None."""
    if curve is None:
        return PREFILL_CHUNK
    limit = BATCH_LATENCY * curve(1)
    low, high = 0, PREFILL_CHUNK  # the most extra tokens within the limit (the curve never falls)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if curve(tokens + mid) <= limit else (low, mid - 1)
    return max(min_read, low)


def _reads(rows: list[Row], candidates: list, groups: list[list[int]], joining,
           min_read: int) -> list[list]:
    """Per call (`calls`), the prompt tokens it reads for ``joining`` states whose targets are
    rows of its batch: [(state, ids)], the first joiners first, within `read_budget`; one more
    "call" (last, with no rows) for joiners of no call's batch, read alone."""
    pending = [s for s in joining if len(s.pending) > 1]
    out = []
    for group in groups:
        batch = getattr(rows[group[0]].state.target, "batch", None)
        mine = [s for s in pending if batch is not None and getattr(s.target, "batch", None) is batch]
        tokens = sum(len(rows[i].state.pending) + len(candidates[i]) for i in group)
        budget = read_budget(rows[group[0]].policy.estimates.costs.target_curve(), tokens, min_read)
        reads = []
        for state in mine:
            if budget > 0:
                reads.append((state, state.pending[:-1][:budget]))
                budget -= len(reads[-1][1])
            pending.remove(state)
        out.append(reads)
    out.append([(s, s.pending[:-1][:PREFILL_CHUNK]) for s in pending])
    return out


def _shared(rows: list[Row], choices: list, candidates: list, groups: list[list[int]],
            reads: list[list]) -> list[tuple]:
    """Per row, before its call: the call's tokens over all its rows and reads, and whether
    this row adds the call to its pair's cost curve. Per call and pair (`Costs`) one row does,
    the first whose policy learns from the step, unless a row reads its prompt in the call
    (its first: the cost is the prompt's, not a step's)."""
    out: list = [None] * len(rows)
    for group, read in zip(groups, reads, strict=False):
        tokens = sum(len(rows[i].state.pending) + len(candidates[i]) for i in group)
        tokens += sum(len(ids) for _, ids in read)
        clean, seen = all(rows[i].state.stats.target_calls for i in group), set()
        for i in group:
            costs = id(rows[i].policy.estimates.costs)
            records = clean and costs not in seen and rows[i].policy.learns_call(choices[i])
            if records:
                seen.add(costs)
            out[i] = (tokens, records)
    return out


def score(states: list, candidates: list[list[int]], groups: list[list[int]],
          reads: list[list] = ()) -> list[torch.Tensor]:
    """Each state's target logits for its pending tokens and candidates (`DecodeState.score`),
    one target call per group (`calls(states)`), which also reads that group's ``reads``
    (`_reads`; the last entry's alone)."""
    reads = list(reads) or [[] for _ in range(len(groups) + 1)]
    out: list = [None] * len(states)
    for group, read in zip(groups, reads, strict=False):
        if len(group) == 1 and not read and getattr(states[group[0]].target, "batch", None) is None:
            out[group[0]] = states[group[0]].score(candidates[group[0]])
            continue
        batch = states[group[0]].target.batch
        feeds = {states[i].target.row: states[i].pending + list(candidates[i]) for i in group}
        wanted = {states[i].target.row: len(candidates[i]) + 1 for i in group}
        for state, ids in read:
            feeds[state.target.row], wanted[state.target.row] = ids, 1
        start = time.perf_counter()
        logits = batch.feed_rows(feeds, wanted)
        seconds = time.perf_counter() - start
        for i in group:
            states[i].account(seconds)
            out[i] = logits[states[i].target.row]
        for state, _ in read:
            state.account_read(seconds)
    for state, ids in reads[-1]:  # joiners of no call's batch: a call of their own
        start = time.perf_counter()
        state.target.feed(ids, rows=1)
        state.account_read(time.perf_counter() - start)
    return out


def _mark(row: Row) -> tuple:
    s = row.state.stats
    return (time.perf_counter(), s.phase_seconds["draft"], s.phase_seconds["target"],
            s.drafter_calls, len(row.state.pending))


def _measured(row: Row, mark: tuple, wall: float, offered: int, accepted: int, read: int,
              call_tokens: int, records_call: bool) -> Measured:
    s = row.state.stats
    _, draft, target, calls, pending = mark
    return Measured(
        wall=wall, draft=s.phase_seconds["draft"] - draft,
        target=s.phase_seconds["target"] - target, calls=s.drafter_calls - calls,
        scored=pending + offered, offered=offered, accepted=accepted,
        read=read,
        call_tokens=call_tokens, records_call=records_call)
