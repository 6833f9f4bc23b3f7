"""One speculative step, top to bottom, over a batch of sequences (`Row`s).

For each row: the policy chooses the proposer and the draft length (`Policy.choose`, no side
effects), the proposer proposes (a drafter drafts; prompt lookup copies; a plain step
proposes nothing), the target scores every candidate in one call, the proposer's verifier
judges them, and then, here and only here, both caches are committed or rolled back, the
statistics counted and the policy told what the step cost and earned (`Policy.observe`).

Every method is lossless because each committed token is either a candidate its verifier
accepted or the verifier's own draw; what the policy chooses changes only the speed.
The rows whose target sessions are rows of one batch (models/batch.py) are scored in ONE
call (`score`); every row still verifies, commits and rolls back on its own. Each row's
measurements are its own: a shared call counts, for each row, as the time it waited for it.
"""

from __future__ import annotations

import time

import torch

from ..methods.policy import Measured
from ..methods.row import Row
from ..methods.verify import Proposal, verify_exact


def step(rows: list[Row]) -> list[tuple[list[int], int]]:
    """Run one step of every row; return each row's ``(committed tokens, accepted drafts)``:
    the first ``accepted`` tokens were candidates, the last is the target's own."""
    plans = []
    for row in rows:  # choose and propose, each row on its own
        state = row.state
        match = row.copying.match(state.committed) if row.copying is not None else 0
        choice = row.policy.choose(state, row.drafter, match)
        mark = _mark(row)
        if choice.proposer == "plain":
            proposal = Proposal([])
        else:
            proposal = row.proposer(choice.proposer).propose(state, row.drafter, choice.k, choice.read)
        plans.append((choice, mark, proposal))

    logits = score([row.state for row in rows], [proposal.candidates for _, _, proposal in plans])

    out = []
    for row, (choice, mark, proposal), scores in zip(rows, plans, logits, strict=True):
        state, candidates = row.state, proposal.candidates
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
        row.policy.observe(choice, _measured(row, mark, len(candidates), n))
        new = candidates[:n] + [token]
        if row.drafter is not None:
            row.drafter.commit(new, n if choice.proposer == "draft" else 0)
        out.append((new, n))
    return out


def score(states: list, candidates: list[list[int]]) -> list[torch.Tensor]:
    """Each state's target logits for its pending tokens and candidates (`DecodeState.score`):
    one call per batch for the states whose targets are rows of one `BatchSession`, one call
    per state otherwise."""
    out: list = [None] * len(states)
    batches: dict[int, list[int]] = {}
    for i, state in enumerate(states):
        batch = getattr(state.target, "batch", None)
        if batch is None:
            out[i] = state.score(candidates[i])
        else:
            batches.setdefault(id(batch), []).append(i)
    for members in batches.values():
        batch = states[members[0]].target.batch
        feeds = {states[i].target.row: states[i].pending + list(candidates[i]) for i in members}
        start = time.perf_counter()
        logits = batch.feed_rows(feeds, {states[i].target.row: len(candidates[i]) + 1 for i in members})
        seconds = time.perf_counter() - start
        for i in members:
            states[i].account(seconds)
            out[i] = logits[states[i].target.row]
    return out


def _mark(row: Row) -> tuple:
    s = row.state.stats
    return (time.perf_counter(), s.phase_seconds["draft"], s.phase_seconds["target"],
            s.drafter_calls, len(row.state.pending))


def _measured(row: Row, mark: tuple, offered: int, accepted: int) -> Measured:
    s = row.state.stats
    start, draft, target, calls, pending = mark
    return Measured(
        wall=time.perf_counter() - start, draft=s.phase_seconds["draft"] - draft,
        target=s.phase_seconds["target"] - target, calls=s.drafter_calls - calls,
        scored=pending + offered, offered=offered, accepted=accepted,
        read=row.drafter.caught_up if row.drafter is not None else 0)
