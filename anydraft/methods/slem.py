"""`slem`: string-level exact match, for any pair of tokenizers.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025), Algorithm "SLEM". The drafter drafts in its own
vocabulary; the drafted text is re-tokenized for the target (bridge.continue_tokens) and each
candidate survives only if it equals the target's own choice at its position (argmax, or the
target's own sample), which makes the method lossless for greedy decoding and sampling alike.
"""

from __future__ import annotations

from ..bridge.translate import continue_tokens
from .pairing import Pairing
from .policy import room
from .verify import verify_exact


class StringLevelExactMatch:
    name = "slem"

    def __init__(self, pairing: Pairing):
        self.pairing = pairing

    def start(self, state) -> None:
        self.drafter = self.pairing.new_drafter(state, same_ids=False)
        self.plan = self.pairing.plan(self.name, state.params.greedy, self.drafter)

    def step(self, state) -> tuple[list[int], int]:
        pairing, params = self.pairing, state.params
        dtable, ttable = pairing.drafter_table, pairing.target_table
        drafts, _ = self.drafter.propose(
            self.plan.k(state), params.probs, params.greedy, state.generator,
            pairing.confidence, dtable.eos_ids)
        ends = bool(drafts) and drafts[-1] in dtable.eos_ids
        with state.stats.timed("translate"):
            text = dtable.decode_bytes(drafts[:-1] if ends else drafts)
            candidates = continue_tokens(ttable, state.committed, text)
            if ends:
                candidates.append(ttable.eos_id)
            candidates = candidates[: room(state)]
        # The last candidate may be a prefix of a longer target token (the draft ended
        # mid-word). Keeping it costs nothing: if the target disagrees, its own token is
        # emitted at that position anyway (bridge.stable_prefix_len is not needed here).
        logits = state.score(candidates)
        n, token = verify_exact(logits, candidates, params, state.generator)
        self.plan.close(state, candidates, n)
        new = candidates[:n] + [token]
        self.drafter.sync_text(ttable.decode_bytes(new))
        return new, n
