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
from .verify import Proposal, verify_exact, verify_rejection


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
        p = params.probs(logits)
        q = torch.zeros(len(drafts), self.pairing.target_vocab_size, dtype=p.dtype)
        for i, dist in enumerate(proposal.qs):
            q[i, : dist.shape[0]] = dist
        return verify_rejection(p, q, drafts, state.generator)
