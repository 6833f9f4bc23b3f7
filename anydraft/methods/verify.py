"""The `Proposal` a method makes, and the two verifiers every speculative method shares.

Both take the target's logits for ``len(candidates) + 1`` positions (row i = next-token logits
after the committed text and the first i candidates) and return ``(n_accepted, next_token)``:
the first ``n_accepted`` candidates are committed, then ``next_token`` (a correction at the
first rejection, or the bonus token when everything was accepted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams, bernoulli, sample


@dataclass
class Proposal:
    """What a proposer offers the target: ``candidates`` (target ids, scored in one call),
    and for verifiers that need them the drafter's ``drafts`` (its own ids) and ``qs`` (the
    distribution each draft was drawn from)."""

    candidates: list[int]
    qs: list[torch.Tensor] = ()
    drafts: list[int] = ()


def verify_exact(logits: torch.Tensor, candidates: Sequence[int], params: SamplingParams,
                 generator: torch.Generator) -> tuple[int, int]:
    """Exact match: at each position the target makes its own choice (argmax, or a sample of
    its processed distribution) and a candidate survives only if it equals that choice.

    Lossless for any proposal: every committed token is the target's own choice given the
    committed prefix. (SLEM; and greedy for every method.)
    """
    for i, candidate in enumerate(candidates):
        choice = params.choose(logits[i], generator)
        if choice != candidate:
            return i, choice
    return len(candidates), params.choose(logits[len(candidates)], generator)


class ProposalRows:
    """Proposal distributions over the target's vocabulary that verification forms on demand:
    ``prob(i, x)``, row i's probability of candidate x, and ``row(i)``, the whole row, which
    only a rejected position needs (methods/tli.py: moving every draft's distribution to target
    ids took 0.4 ms a draft over 49,152 ids)."""

    def prob(self, i: int, x: int) -> float:
        raise NotImplementedError

    def row(self, i: int) -> torch.Tensor:
        raise NotImplementedError


class RowsOnDemand:
    """``form(logits[i])`` for each row i, formed when first read: rejection sampling reads
    the rows up to its first rejection, often one of six (a processed distribution over
    151,936 ids is ~0.3 ms). Each row is formed as plain decoding forms its own, alone."""

    def __init__(self, form, logits: torch.Tensor):
        self.form, self.logits, self.rows = form, logits, {}

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.rows:
            self.rows[i] = self.form(self.logits[i])
        return self.rows[i]


def verify_rejection(p: torch.Tensor | RowsOnDemand, q: torch.Tensor | ProposalRows,
                     candidates: Sequence[int], generator: torch.Generator) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    ``p``: target's processed distributions, ``len(candidates) + 1`` rows (a tensor, or
    `RowsOnDemand`); ``q``: the proposal distributions the candidates were drawn from, one row
    per candidate, over the same (target) vocabulary (a tensor, or `ProposalRows`). Candidate
    x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the
    correction is drawn from the residual max(0, p_i - q_i) / Z. Every emitted token is then
    distributed exactly as p_i.
    """
    rows = q if isinstance(q, ProposalRows) else None
    for i, x in enumerate(candidates):
        px, qx = float(p[i][x]), (float(q[i, x]) if rows is None else rows.prob(i, x))
        assert qx > 0, "a candidate must have positive proposal probability"
        if bernoulli(px / qx, generator):
            continue
        return i, sample_residual(p[i], q[i] if rows is None else rows.row(i), generator)
    return len(candidates), sample(p[len(candidates)], generator)


def sample_residual(p: torch.Tensor, q: torch.Tensor, generator) -> int:
    """Draw from max(0, p - q) / Z: what makes a rejection step emit exactly p."""
    residual = torch.clamp(p - q, min=0)
    if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had ~zero chance
        residual = p
    return sample(residual / residual.sum(), generator)
