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
from .verify import Proposal, verify_exact, verify_rejection


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

    def _restricted(self, params):
        mask = self.map.drafter_mask

        def to_probs(logits: torch.Tensor):
            # the mask is as long as the longer of logits and tokenizer: ids past the logits
            # are unmapped (bridge.intersect), so the first ``width`` entries are the mask
            q = params.probs(logits.masked_fill(~mask[: logits.shape[-1]], -math.inf))
            return None if not bool(torch.isfinite(q).all()) else q

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
        p = params.probs(logits)
        to_target = self.map.drafter_to_target[self.mapped]
        q = torch.zeros(len(candidates), self.pairing.target_vocab_size, dtype=p.dtype)
        for i, dist in enumerate(proposal.qs):
            q[i].index_add_(0, to_target, dist[self.mapped].to(p.dtype))
        return verify_rejection(p, q, candidates, state.generator)
