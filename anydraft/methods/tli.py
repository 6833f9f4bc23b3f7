"""`tli`: token-level intersection, lossless for greedy decoding and sampling.

Timor et al. (ICML 2025), Algorithm "TLI". The drafter's distribution is restricted to the
tokens both vocabularies spell identically and renormalised; that restricted distribution is
the true proposal, so plain speculative sampling over the target's vocabulary is exact.
"""

from __future__ import annotations

import math

import torch

from ..errors import AnydraftError
from .pairing import Pairing
from .verify import verify_exact, verify_rejection


class TokenLevelIntersection:
    name = "tli"

    def __init__(self, pairing: Pairing):
        self.pairing = pairing

    def start(self, state) -> None:
        self.drafter = self.pairing.new_drafter(state, same_ids=False)
        self.plan = self.pairing.plan(self.name, state.params.greedy, self.drafter)
        self.map = self.pairing.intersection
        if self.map.size == 0:
            raise AnydraftError("these two tokenizers share no token: use method 'slem' or 'slrs'")
        self.mapped = self.map.drafter_mask.nonzero().flatten()  # drafter ids inside the map

    def _restricted(self, params):
        mask = self.map.drafter_mask

        def to_probs(logits: torch.Tensor):
            q = params.probs(logits.masked_fill(~mask, -math.inf))
            return None if not bool(torch.isfinite(q).all()) else q

        return to_probs

    def step(self, state) -> tuple[list[int], int]:
        pairing, params = self.pairing, state.params
        drafts, qs = self.drafter.propose(
            self.plan.k(state), self._restricted(params), params.greedy,
            state.generator, pairing.confidence, pairing.drafter_table.eos_ids)
        with state.stats.timed("translate"):
            to_target = self.map.drafter_to_target
            candidates = [int(to_target[d]) for d in drafts]
        logits = state.score(candidates)
        if params.greedy:
            n, token = verify_exact(logits, candidates, params, state.generator)
        else:
            p = params.probs(logits)
            q = torch.zeros(len(drafts), pairing.target_vocab_size, dtype=p.dtype)
            for i, dist in enumerate(qs):
                q[i].index_add_(0, to_target[self.mapped], dist[self.mapped].to(p.dtype))
            n, token = verify_rejection(p, q, candidates, state.generator)
        self.plan.close(state, candidates, n)
        new = candidates[:n] + [token]
        self.drafter.sync_text(pairing.target_table.decode_bytes(new))
        return new, n
