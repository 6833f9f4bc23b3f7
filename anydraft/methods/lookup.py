"""`lookup`: prompt-lookup (n-gram) drafting: candidates copied from earlier in the text.

Saxena, "Prompt Lookup Decoding" (2023); Yang et al., "Inference with Reference: Lossless
Acceleration of Large Language Models" (LLMA, 2023). When the text being written repeats
text already there (a summary quoting its source, an answer quoting a retrieved document,
a code edit, a list that continues a pattern), the tokens that followed the latest earlier
occurrence of the last few tokens are a good guess of what comes next, and cost nothing to
propose: no drafter model is involved.

The proposal is a deterministic function of the committed text (a point mass), so exact-match
verification (``verify.verify_exact``) keeps every method lossless: each candidate survives
only if it is the target's own choice, which for sampling accepts a candidate x with
probability p(x), the same as rejection sampling against a point mass.

With a drafter (`auto` does this when drafting is adaptive) the copy is an extra proposer:
each step takes the copy when the adaptive policy expects it to commit more tokens per second
than the drafter would (acceptance is learned per matched n-gram length), and the drafter
otherwise. Which proposer a step uses depends only on the text and timings so far, never on
the step's own random draws, so the mixture is as exact as each part.

Copies are measured even when no step takes them (adaptive only): each match's copy is held
as a "shadow" and compared with the tokens the steps then commit, whatever proposed them. The
committed text is the target's own (every step is lossless), so a shadow candidate equals the
committed token with the very chance that verification would have accepted it (greedy: the
target's choice; sampling: p(x)). Without this, copies priced at a neutral prior never won a
step on a steep cost curve (a llama.cpp target on 2 cores verifies 2 tokens at ~1.7 plain
steps), and what never runs is never measured.
"""

from __future__ import annotations

from ..planning.estimates import Estimates
from ..planning.policy import Policy
from .row import Row
from .verify import Proposal, verify_exact

MIN_NGRAM, MAX_NGRAM = 1, 4


class NgramIndex:
    """Where each n-gram (n = MIN_NGRAM..MAX_NGRAM) of a growing token list last ended.

    Incremental: each call indexes only the positions added since the last one."""

    def __init__(self):
        self.last: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence
        self.indexed = 0  # every n-gram ending at or before this position is in `last`

    def match(self, tokens: list[int], limit: int) -> tuple[int, list[int]]:
        """``(n, continuation)``: the longest n whose last n tokens occurred earlier, and up to
        ``limit`` tokens that followed their latest earlier occurrence; ``(0, [])`` if none."""
        end_now = len(tokens)
        for end in range(self.indexed + 1, end_now):  # earlier occurrences only
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self.last[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, end_now - 1)
        for n in range(min(MAX_NGRAM, end_now), MIN_NGRAM - 1, -1):
            end = self.last.get(tuple(tokens[end_now - n :]))
            if end is not None:
                return n, tokens[end : min(end + limit, end_now)]
        return 0, []


class PromptLookup:
    """Drafts by copying; with ``inner`` (a drafter-based method), the policy takes the better
    proposer per step. ``estimates``: what copies earned, kept per decoder."""

    def __init__(self, max_k: int, adaptive: bool, inner=None, estimates: Estimates | None = None):
        self.max_k, self.adaptive, self.inner = max_k, adaptive, inner
        self.estimates = estimates if estimates is not None else Estimates()
        self.name = "lookup" if inner is None else f"{inner.name}+lookup"
        self.index = NgramIndex()  # one generation's
        self.copy: list[int] = []
        self.policy: Policy | None = None  # the row's: its copy estimates learn from shadows
        self.shadow: tuple[int, list[int], int] | None = None  # (match length, copy, proposed at)

    def start(self, state) -> Row:
        if self.inner is None:
            row = Row(state, Policy(self.max_k, self.adaptive, self.estimates, state.params.greedy))
        else:
            row = self.inner.start(state)
        row.copy_proposer, row.policy.copies = self, True
        self.policy = row.policy
        return row

    def match(self, committed: list[int]) -> int:
        """How many tokens of the committed text's end matched earlier text (0: none); the
        tokens that followed that match are the next proposal. Settles the open shadow, or
        opens one on this proposal."""
        if self.shadow is not None:
            self._settle(committed)
        n, self.copy = self.index.match(committed, self.max_k)
        if n and self.adaptive and self.shadow is None:
            self.shadow = (n, self.copy, len(committed))
        return n

    def _settle(self, committed: list[int]) -> None:
        """Record the open shadow as the copy step it would have been, once the committed text
        decides it: at its first token that differs, or once all of it was committed."""
        n, copy, at = self.shadow
        new = committed[at:at + len(copy)]
        kept = next((i for i, (a, b) in enumerate(zip(copy, new, strict=False)) if a != b), len(new))
        if kept == len(new) < len(copy):
            return  # all of it committed so far: the rest decides
        self.policy.copy_estimates(n).add(len(copy), kept)
        self.shadow = None

    def propose(self, state, drafter, k: int, read: int) -> Proposal:
        if k and self.shadow is not None and self.shadow[2] == len(state.committed):
            self.shadow = None  # proposed this step: the step measures the copy itself
        return Proposal(self.copy[:k])

    def verify(self, state, proposal: Proposal, logits) -> tuple[int, int]:
        return verify_exact(logits, proposal.candidates, state.params, state.generator)
