"""`sd`: standard speculative sampling for a drafter with the target's own tokenizer.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (ICML 2023);
Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling" (2023).
"""

from __future__ import annotations

import torch

from .pairing import Pairing
from .verify import verify_exact, verify_rejection


class SpeculativeSampling:
    name = "sd"

    def __init__(self, pairing: Pairing):
        self.pairing = pairing

    def start(self, state) -> None:
        self.drafter = self.pairing.new_drafter(state, same_ids=True)
        self.plan = self.pairing.plan(self.name, state.params.greedy, self.drafter)

    def step(self, state) -> tuple[list[int], int]:
        params, width = state.params, self.pairing.target_vocab_size
        # padded vocabularies may differ in width: propose only ids the target has
        drafts, qs = self.drafter.propose(
            self.plan.k(state),
            lambda logits: params.probs(logits[:width]), params.greedy, state.generator,
            self.pairing.confidence, self.pairing.target_table.eos_ids)
        logits = state.score(drafts)
        if params.greedy:
            n, token = verify_exact(logits, drafts, params, state.generator)
        else:
            p = params.probs(logits)
            q = torch.zeros(len(drafts), width, dtype=p.dtype)
            for i, dist in enumerate(qs):
                q[i, : dist.shape[0]] = dist
            n, token = verify_rejection(p, q, drafts, state.generator)
        self.plan.close(state, drafts, n)
        self.drafter.sync_ids(n, [token])
        return drafts[:n] + [token], n
