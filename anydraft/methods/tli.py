"""`tli`: token-level intersection, lossless for greedy decoding and sampling.

Timor et al. (ICML 2025), Algorithm "TLI". The drafter's distribution is restricted to the
tokens both vocabularies spell identically and renormalised; that restricted distribution is
the true proposal, so plain speculative sampling over the target's vocabulary is exact.
A logit bias, keyed by target ids, is in p (`SamplingParams.probs` of the target's logits);
the drafter drafts with it moved to the ids it spells alike (`Pairing.drafter_params`), and q'
stays the distribution each draft was drawn from: exact with any bias, as without.
"""

from __future__ import annotations

import functools
import math

import torch

from ..errors import AnydraftError
from .pairing import DrafterMethod, Pairing
from .verify import Proposal, ProposalRows, RowsOnDemand, verify_exact, verify_rejection


class TokenLevelIntersection(DrafterMethod):
    name = "tli"

    def __init__(self, pairing: Pairing):
        super().__init__(pairing)
        if self.map.size == 0:
            raise AnydraftError("these two tokenizers share no token: use method 'slem' or 'slrs'")

    @functools.cached_property
    def map(self):
        return self.pairing.intersection

    @functools.cached_property
    def mapped(self) -> torch.Tensor:
        return self.map.drafter_mask.nonzero().flatten()  # drafter ids inside the map

    @functools.cached_property
    def unmapped(self) -> torch.Tensor:
        return ~self.map.drafter_mask  # formed once: a draft masks with it

    def _restricted(self, params):
        unmapped = self.unmapped

        def to_probs(logits: torch.Tensor):
            # the mask is as long as the longer of logits and tokenizer: ids past the logits
            # are unmapped (bridge.intersect), so the first ``width`` entries are the mask
            q = params.probs(logits.masked_fill(unmapped[: logits.shape[-1]], -math.inf))
            # probabilities sum to a finite number exactly when each is finite (one vectorised
            # pass, where isfinite().all() took two slower ones)
            return q if math.isfinite(float(q.sum())) else None

        return to_probs

    def draft_args(self, state) -> tuple:
        params = self.pairing.drafter_params(state.params)
        return (self._restricted(params), params.greedy, state.generator, self.pairing.confidence,
                self.pairing.drafter_table.eos_ids)

    def finish(self, state, drafts: list[int], qs: list) -> Proposal:
        with state.stats.timed("translate"):
            candidates = [int(self.map.drafter_to_target[d]) for d in drafts]
        return Proposal(candidates, qs, drafts)

    def verify(self, state, proposal: Proposal, logits: torch.Tensor) -> tuple[int, int]:
        params, candidates = state.params, proposal.candidates
        if params.greedy:
            return verify_exact(logits, candidates, params, state.generator)
        p = RowsOnDemand(params.probs, logits)
        q = MappedRows(proposal.qs, proposal.drafts, self, p)
        return verify_rejection(p, q, candidates, state.generator)


class MappedRows(ProposalRows):
    """The restricted drafter distributions ``qs`` as rows over the target's ids. The map is
    one-to-one (bridge/intersection.py), so a candidate's proposal probability is its draft's:
    q'(t) = q'(d) for t = drafter_to_target[d]."""

    def __init__(self, qs: list, drafts: list[int], method: TokenLevelIntersection, p: RowsOnDemand):
        self.qs, self.drafts, self.method, self.p = qs, drafts, method, p  # p: the rows' dtype

    def prob(self, i: int, x: int) -> float:
        assert int(self.method.map.drafter_to_target[self.drafts[i]]) == x
        return float(self.qs[i][self.drafts[i]].to(self.p[i].dtype))

    def row(self, i: int) -> torch.Tensor:
        method, dtype = self.method, self.p[i].dtype
        out = torch.zeros(method.pairing.target_vocab_size, dtype=dtype)
        out[method.map.drafter_to_target[method.mapped]] = self.qs[i][method.mapped].to(dtype)
        return out
