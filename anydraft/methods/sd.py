"""`sd`: standard speculative sampling for a drafter with the target's own tokenizer.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023);
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023).

A logit bias (keyed by target ids, which are the drafter's too) is part of the one transform
on both sides: the drafter draws from q with it, the verifier judges against p with it, and
speculative sampling emits exactly p, as without one.
"""

from __future__ import annotations

import torch

from .pairing import DrafterMethod
from .verify import Proposal, ProposalRows, RowsOnDemand, verify_exact, verify_rejection


class SpeculativeSampling(DrafterMethod):
    name = "sd"
    same_ids = True  # the drafter reads the target's own ids

    def draft_args(self, state) -> tuple:
        params, width = state.params, self.pairing.target_vocab_size
        # padded vocabularies may differ in width: propose only ids the target has
        return (lambda logits: params.probs(logits[:width]), params.greedy, state.generator,
                self.pairing.confidence, self.pairing.target_table.eos_ids)

    def finish(self, state, drafts: list[int], qs: list) -> Proposal:
        return Proposal(drafts, qs)

    def verify(self, state, proposal: Proposal, logits: torch.Tensor) -> tuple[int, int]:
        params, drafts = state.params, proposal.candidates
        if params.greedy:
            return verify_exact(logits, drafts, params, state.generator)
        p = RowsOnDemand(params.probs, logits)
        return verify_rejection(p, PaddedRows(proposal.qs, self.pairing.target_vocab_size, p), drafts,
                                state.generator)


class PaddedRows(ProposalRows):
    """The drafter's distributions ``qs`` as rows over the target's ``width`` ids: a padded
    vocabulary may be narrower on the drafter's side, whose ids past it have probability 0.
    Only a rejected position needs its whole row."""

    def __init__(self, qs: list, width: int, p: RowsOnDemand):
        self.qs, self.width, self.p = qs, width, p  # p: the rows' dtype

    def prob(self, i: int, x: int) -> float:
        return float(self.qs[i][x].to(self.p[i].dtype))

    def row(self, i: int) -> torch.Tensor:
        dist = self.qs[i]
        out = torch.zeros(self.width, dtype=self.p[i].dtype)
        out[: dist.shape[0]] = dist
        return out
