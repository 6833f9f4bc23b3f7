"""One speculative step, top to bottom, over a batch of sequences (`Row`s): the mechanics only.
Every decision about it is the planning's (anydraft/planning/), taken before and learnt after:

1. plan: which target call scores which rows (`calls`), and each row's proposer, draft length
   and drafter read (`plan`; no side effects);
2. propose: a drafter drafts (rows whose drafters are rows of one drafter batch draft
   together, `draft_together`), prompt lookup copies, a plain step proposes nothing; under a
   grammar, what it forces next is offered after them (`_with_forced`);
3. score: the target scores every row's pending tokens and candidates, one call per target
   batch, which also reads a part of each joining prompt (`prefill`);
4. verify: the proposer's verifier judges the candidates against the scores;
5. commit or roll back both caches: the target's here, the drafter's through `Drafter.commit`
   (which keeps its cache's still-valid prefix);
6. learn: each row's policy is told what the step cost and earned (`learn`).

Every method is lossless because each committed token is either a candidate its verifier
accepted or the verifier's own draw; what the planning chooses changes only the speed.
A row's measurements are its own: its propose and verify time, and the shared call as the
time it waited for it.

A row whose own work fails (proposing, drafting, verifying, committing) fails alone: its
result is the exception, it is left out of the calls after the failure, and the other rows
step on (issue 42: one request's failure ended every request of its batch). Only a failure
of a shared call itself, which no one row caused, fails the whole step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from ..methods.row import Row
from ..methods.verify import Proposal, verify_exact
from ..planning.call import Call, calls, learn, plan, prefill
from ..planning.cost import room
from ..planning.policy import Choice, Measured
from ..planning.settings import SETTINGS
from .logprobs import token_logprobs


@dataclass(frozen=True)
class RowStep:
    """What one row's step committed: ``tokens``, of which the first ``accepted`` were
    candidates of ``proposer`` ("draft", "copy"; "plain": it proposed nothing), the next
    ``forced`` tokens a grammar forced (`_with_forced`) and the last is the target's own;
    ``offered``: the proposer's candidates the target scored."""

    tokens: list[int]
    accepted: int
    offered: int
    proposer: str
    forced: int = 0


def step(rows: list[Row], joining: list = (), min_prefill: int | None = None) -> list[RowStep | Exception]:
    """Run one step of every row; each row's `RowStep`, or the exception that failed that row
    alone (its caches are then in no known state: the row must leave). ``joining``:
    `DecodeState`s still reading their prompts; the calls read the next part of each, their
    logits unused (`prefill`: at least ``min_prefill`` tokens a call, default
    `Settings.min_prefill`)."""
    shared = calls(rows)  # 1. plan
    choices = plan(rows, shared)

    # 2. propose
    failed = _sync_drafters(rows, choices)
    marks = [_mark(row) for row in rows]  # a row drafting together starts with all of them
    drafts, caught_up = draft_together(rows, choices, failed)
    proposals, proposing, forced = [], [], [[] for _ in rows]
    for i, (row, choice) in enumerate(zip(rows, choices, strict=True)):
        if i not in drafts:
            marks[i] = _mark(row)
        try:
            if i in failed:
                raise failed[i]
            if isinstance(drafts.get(i), Exception):
                raise drafts[i]
            if i in drafts:
                proposal = row.draft_proposer.finish(row.state, *drafts[i])
            elif choice.proposer == "plain":
                proposal = Proposal([])
            else:
                proposal = row.proposer(choice.proposer).propose(row.state, row.drafter, choice.k, choice.read)
            proposal, forced[i] = _with_forced(row, proposal)
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            failed[i], proposal = exc, Proposal([])
        proposals.append(proposal)
        proposing.append(time.perf_counter() - marks[i][0])
    candidates = [proposal.candidates + forced[i] for i, proposal in enumerate(proposals)]
    for call in shared:  # the calls score only the rows still going
        call.rows = [i for i in call.rows if i not in failed]
    shared = prefill(rows, shared, choices, candidates, joining, min_prefill)

    start = time.perf_counter()  # 3. score
    logits = score(rows, shared, candidates)
    waited = time.perf_counter() - start  # every row waits for every call

    call_of = {i: call for call in shared for i in call.rows}  # 4-6. verify, commit, learn
    out = []
    for i, row in enumerate(rows):
        if i in failed:
            out.append(failed[i])
            continue
        try:
            out.append(_finish(call_of[i], i, row, choices[i], marks[i], proposals[i], forced[i],
                               proposing[i] + waited, logits[i], caught_up.get(i)))
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            out.append(exc)
    return out


def _with_forced(row: Row, proposal: Proposal) -> tuple[Proposal, list[int]]:
    """Under a grammar, for a row whose method proposes (not ``ar``): ``proposal`` cut at its
    first candidate the grammar refuses where its verifier is exact match (greedy, or a
    proposal without distributions; cutting a sampled draft would change what its rejection
    sampling assumes), and the tokens the grammar forces after it (constraints/matcher.py
    `Constraint.forced`: a JSON schema's keys and punctuation), offered after the proposal's
    own candidates and verified as `verify_exact` does (`_finish`)."""
    state = row.state
    if state.constraint is None or not row.forces:
        return proposal, []
    own = proposal.candidates
    kept, forced = state.constraint.forced(own, state.params.greedy or not proposal.qs,
                                           min(SETTINGS.most_forced, room(state) - len(own)))
    return (proposal if kept == len(own) else replace(proposal, candidates=own[:kept])), forced


def _finish(call: Call, i: int, row: Row, choice: Choice, mark: tuple, proposal: Proposal,
            forced: list[int], waited: float, scores: torch.Tensor, caught_up: int | None) -> RowStep:
    """Verify row ``i``'s candidates against its ``scores``, commit or roll back its caches and
    have its policy learn what the step cost and earned (``waited``: the row's time before
    verifying, its proposing and the calls).

    ``forced``: tokens the grammar forces after the proposal's candidates, scored after them.
    Once every candidate is accepted, the token the verifier drew at the next row is the
    target's own choice there; each forced token equal to the target's choice at its row is
    kept and the choice at the row after it drawn, as `verify_exact` does: every committed token
    is still the target's own choice given the committed prefix."""
    start, state, candidates = time.perf_counter(), row.state, proposal.candidates
    if state.constraint is not None:  # the constrained distribution at every row verified
        params = state.params
        argmax_only = params.greedy and not params.logit_bias and state.top_logprobs is None
        scores = state.constraint.mask(scores, candidates + forced, argmax_only)
    if choice.proposer == "plain":
        n, token = verify_exact(scores, candidates, state.params, state.generator)
    else:
        n, token = row.proposer(choice.proposer).verify(state, proposal, scores)
    f = 0  # forced tokens kept
    if n == len(candidates):
        while f < len(forced) and token == forced[f]:
            f += 1
            token = state.params.choose(scores[n + f], state.generator)
    # the target keeps the committed text and the accepted candidates; the step's own
    # last token is fed with its next call
    keep = len(state.committed) + n + f
    if len(state.target) > keep:
        state.target.rollback(keep)
    state.stats.drafted += len(candidates)
    state.stats.rejected += n < len(candidates)
    wall = waited + time.perf_counter() - start  # its own work, and the wait
    if caught_up is None:
        caught_up = row.drafter.caught_up if row.drafter is not None else 0
    outcome = _measured(row, mark, wall, len(candidates), n, caught_up, len(forced))
    new = candidates[:n] + forced[:f] + [token]
    if state.constraint is not None:
        state.constraint.commit(new)
    if state.top_logprobs is not None:  # asked for: read off the verifying call's own logits
        state.step_logprobs = token_logprobs(state.params, scores, new, state.top_logprobs)
    if row.drafter is not None:
        row.drafter.commit(new, n if choice.proposer == "draft" else 0)
    learn(call, i, row, choice, outcome)
    return RowStep(new, n, len(candidates), choice.proposer, f)


def _sync_drafters(rows: list[Row], choices: list[Choice]) -> dict:
    """Have each drafter that drafts this step read the text committed since it last drafted
    (`Drafter.sync`) before the step is timed, as each commit's own reading was: the policy
    learns what drafting costs, not when the reading was done. The rows this failed, with why."""
    failed = {}
    for i, (row, choice) in enumerate(zip(rows, choices, strict=True)):
        if choice.proposer == "draft" and choice.k and row.drafter is not None:
            try:
                row.drafter.sync()
            except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
                failed[i] = exc
    return failed


def draft_together(rows: list[Row], choices: list[Choice], failed=()) -> tuple[dict, dict]:
    """The drafts of the rows that draft with drafters whose sessions are rows of one batch
    (`Decoder.new_rows`), two or more of them: each drafting pass of all of them is ONE call of
    that batch (`Drafter.draft_passes`, run here), so the drafter's weights are read once a
    pass, not once a row. Returns, per row index, ``(drafts, distributions)`` (or the exception
    that failed that row's drafting: the others draft on), and the backlog its first pass
    read: the whole call's, every row's backlog beyond one token each (a row whose own backlog
    was one token still waited for the others'; timed as a clean pass, it would price every
    later pass as a read). Each row drafts exactly as alone (its own text, sampling and
    generator); the calls' time counts as every taking part row's drafting time. The rows
    whose indices are in ``failed`` draft nothing."""
    groups: dict[int, list[int]] = {}
    for i, (row, choice) in enumerate(zip(rows, choices, strict=True)):
        batch = row.drafter.batch if row.drafter is not None else None
        if choice.proposer == "draft" and choice.k and batch is not None and i not in failed:
            groups.setdefault(id(batch), []).append(i)
    out, caught_up = {}, {}
    for group in (g for g in groups.values() if len(g) > 1):
        batch = rows[group[0]].drafter.batch
        passes, feeds = {}, {}
        for i in group:
            row, choice = rows[i], choices[i]
            try:
                passes[i] = row.drafter.draft_passes(choice.k, *row.draft_proposer.draft_args(row.state),
                                                     choice.read)
            except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
                out[i] = exc
                continue
            feeds[i] = _advance(row, passes[i], None, out, i)
        backlog = 1 + sum(max(0, rows[i].drafter.caught_up - 1) for i in group)
        caught_up |= {i: backlog for i in group if rows[i].drafter.caught_up}
        while any(ids is not None for ids in feeds.values()):
            feeds = {i: ids for i, ids in feeds.items() if ids is not None}
            start = time.perf_counter()
            logits = batch.feed_rows({rows[i].drafter.session.row: ids for i, ids in feeds.items()},
                                     {rows[i].drafter.session.row: 1 for i in feeds})
            seconds = time.perf_counter() - start
            for i in feeds:
                rows[i].state.stats.phase_seconds["draft"] += seconds
                rows[i].state.stats.drafter_model_seconds += seconds
                feeds[i] = _advance(rows[i], passes[i], logits[rows[i].drafter.session.row][-1], out, i)
    return out, caught_up


def _advance(row: Row, passes, logits, out: dict, i: int):
    """Send ``logits`` to a row's `Drafter.draft_passes` (None: start it); the ids it feeds
    next, or None once it returned its drafts, or failed (into ``out[i]``: the drafts, or the
    exception)."""
    with row.state.stats.timed("draft"):
        try:
            return next(passes) if logits is None else passes.send(logits)
        except StopIteration as end:
            out[i] = end.value
        except Exception as exc:  # noqa: BLE001 - this row's failure, not the others'
            out[i] = exc
        return None


def score(rows: list[Row], shared: list[Call], candidates: list[list[int]]) -> list[torch.Tensor | None]:
    """Each row's target logits for its pending tokens and candidates (`DecodeState.score`),
    one target call per `Call`, which also reads that call's prefills (a call with no rows:
    each alone); None for a row no call scores."""
    out: list = [None] * len(rows)
    for call in shared:
        if not call.rows:  # joiners of no call's batch: a call of their own each
            for state, ids in call.prefills:
                start = time.perf_counter()
                state.target.feed(ids, rows=1)
                state.account_prefill(time.perf_counter() - start)
            continue
        states = [rows[i].state for i in call.rows]
        if call.batch is None and not call.prefills:
            out[call.rows[0]] = states[0].score(candidates[call.rows[0]])
            continue
        feeds = {state.target.row: state.pending + list(candidates[i])
                 for i, state in zip(call.rows, states, strict=True)}
        wanted = {state.target.row: len(candidates[i]) + 1 for i, state in zip(call.rows, states, strict=True)}
        for state, ids in call.prefills:
            feeds[state.target.row], wanted[state.target.row] = ids, 1
        start = time.perf_counter()
        logits = call.batch.feed_rows(feeds, wanted)
        seconds = time.perf_counter() - start
        for i, state in zip(call.rows, states, strict=True):
            state.account(seconds)
            out[i] = logits[state.target.row]
        for state, _ in call.prefills:
            state.account_prefill(seconds)
    return out


def _mark(row: Row) -> tuple:
    s = row.state.stats
    return (time.perf_counter(), s.phase_seconds["draft"], s.phase_seconds["target"],
            s.drafter_calls, len(row.state.pending))


def _measured(row: Row, mark: tuple, wall: float, offered: int, accepted: int, read: int,
              forced: int) -> Measured:
    s = row.state.stats
    _, draft, target, calls, pending = mark
    return Measured(
        wall=wall, draft=s.phase_seconds["draft"] - draft,
        target=s.phase_seconds["target"] - target, calls=s.drafter_calls - calls,
        scored=pending + offered + forced, offered=offered, accepted=accepted, read=read)
