"""`slem`: string-level exact match, for any pair of tokenizers.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025), Algorithm "SLEM". The drafter drafts in its own
vocabulary; the drafted text is re-tokenized for the target (bridge.continue_tokens) and each
candidate survives only if it equals the target's own choice at its position (argmax, or the
target's own sample), which makes the method lossless for greedy decoding and sampling alike.
The target's choice is made from its logits with the logit bias (`SamplingParams.choose`); what
the drafter drafted from (the bias moved to its own ids, `Pairing.drafter_params`) never
enters the verification, so a bias leaves it exact.
"""

from __future__ import annotations

import torch

from ..bridge import UnspellableBytes
from ..bridge.translate import continue_tokens, spellable
from ..planning.cost import room
from .pairing import DrafterMethod
from .verify import Proposal, verify_exact


class StringLevelExactMatch(DrafterMethod):
    name = "slem"

    def draft_args(self, state) -> tuple:
        params = self.pairing.drafter_params(state.params)
        return (params.probs, params.greedy, state.generator, self.pairing.confidence,
                self.pairing.drafter_table.eos_ids)

    def finish(self, state, drafts: list[int], qs: list) -> Proposal:
        pairing = self.pairing
        dtable, ttable = pairing.drafter_table, pairing.target_table
        ends = bool(drafts) and drafts[-1] in dtable.eos_ids
        with state.stats.timed("translate"):
            drafted = dtable.decode_bytes(drafts[:-1] if ends else drafts)
            # a byte the target cannot spell ends the draft (Gemma-3 drafts <0x04>, SmolLM2
            # has no token for it): the text before it is still a proposal
            text = spellable(ttable, drafted)
            try:
                candidates = continue_tokens(ttable, state.committed, text)
            except UnspellableBytes:  # the committed tail itself: nothing to propose
                candidates = []
            if ends and text == drafted and pairing.target_eos is not None:
                candidates.append(pairing.target_eos)
        # The last candidate may be a prefix of a longer target token (the draft ended
        # mid-word). Keeping it costs nothing: if the target disagrees, its own token is
        # emitted at that position anyway.
        return Proposal(pairing.scorable(candidates)[: room(state)], qs, drafts)

    def verify(self, state, proposal: Proposal, logits: torch.Tensor) -> tuple[int, int]:
        return verify_exact(logits, proposal.candidates, state.params, state.generator)
