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
"""

from __future__ import annotations

from .policy import Acceptance, Costs, DraftPlan
from .verify import verify_exact

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
    """Drafts by copying; with ``inner`` (a drafter-based method), the better proposer per step."""

    def __init__(self, costs: Costs, acceptance: dict, max_k: int, adaptive: bool, inner=None):
        self.costs, self.acceptance = costs, acceptance  # kept per decoder: (greedy, n) -> Acceptance
        self.max_k, self.adaptive, self.inner = max_k, adaptive, inner
        self.name = "lookup" if inner is None else f"{inner.name}+lookup"

    def start(self, state) -> None:
        self.index = NgramIndex()
        self.plan = DraftPlan(self.max_k, self.adaptive, self.costs, Acceptance(), free=True)
        if self.inner is not None:
            self.inner.start(state)

    def step(self, state) -> tuple[list[int], int]:
        n, copy = self.index.match(state.committed, self.max_k)
        plan = self.plan
        plan.acc = self.acceptance.setdefault((state.params.greedy, n), Acceptance())
        if self.inner is not None and not self._copy_wins(state, n):
            return self.inner.step(state)
        candidates = copy[: plan.k(state)]
        logits = state.score(candidates)
        accepted, token = verify_exact(logits, candidates, state.params, state.generator)
        plan.close(state, candidates, accepted)
        new = candidates[:accepted] + [token]
        if self.inner is not None:
            self.inner.drafter.follow(new)
        return new, accepted

    def _copy_wins(self, state, n: int) -> bool:
        """A match, and more expected tokens per second from it than from the drafter. A step
        the drafter sits out for a copy while its own best is a plain step counts towards its
        next probe (`DraftPlan.probe_due`), and a due probe runs the drafter instead."""
        if not n:
            return False
        inner = self.inner.plan
        behind = inner.behind()
        k, drafter_rate = inner.best(state.budget, behind)
        _, copy_rate = self.plan.best(state.budget)
        if None in (drafter_rate, copy_rate) or copy_rate <= drafter_rate:
            return False
        if not k:
            if inner.probe_due(behind):
                return False
            inner.acc.idle += 1
        return True
