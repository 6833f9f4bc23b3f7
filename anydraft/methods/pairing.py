"""What every drafter-based method needs about a (target, drafter) pair, built once per Decoder."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..bridge import same_tokenizer, token_table
from ..bridge.intersection import intersect
from ..models.session import Session
from .drafter import Drafter
from .policy import Acceptance, Costs, DraftPlan

TRIAL_STEPS = 24  # drafting steps of each candidate method before `fastest` compares them
# prompt tokens the drafter reads by default: on long prompts (summaries, RAG) llama.cpp's slow
# prompt reading kept the drafter idle; with 64 auto measured 1.31x vs 1.23x (t=0) and 1.21x vs
# 1.13x (t=1) over AR there, and no loss on short prompts (benchmarks/results/2026-11-30-context*).
# 16 was measured too: it helps a cheap target (Qwen-0.5B <- SmolLM2, 13 categories: 1.39x vs
# 1.32x pooled) but costs the main pair acceptance (Qwen-1.5B <- SmolLM2: a 0.58 vs 0.63, 1.67x
# vs 1.78x pooled; `*context16*`, `context64-again*`), so probes read 16 (`PROBE_CONTEXT`), and
# adaptive drafts read what one target step costs (`DraftPlan.window`), 16 to this context
DRAFTER_CONTEXT = 64


@dataclass
class Pairing:
    target_table: object  # TokenTable
    drafter_table: object
    target_vocab_size: int  # logits width (padded vocabularies are wider than the tokenizer)
    drafter_vocab_size: int
    new_drafter_session: Callable[[], Session]
    drafter_bos: list[int]  # what the drafter's tokenizer puts before a text (Gemma: <bos>)
    num_draft_tokens: int = 5  # k, or the largest k adaptive drafting may choose
    confidence: float = 0.0
    adaptive: bool = False
    drafter_context: int = DRAFTER_CONTEXT  # prompt tokens (the drafter's) it reads; 0: all
    costs: Costs = field(default_factory=Costs)
    acceptance: dict = field(default_factory=dict)  # (method, greedy) -> Acceptance

    @classmethod
    def of(cls, decoder) -> Pairing:
        drafter = decoder.drafter
        tok = drafter.tokenizer
        bos = tok.bos_token_id
        probe = tok.encode("x", add_special_tokens=True)
        return cls(decoder.table, token_table(tok), decoder.target.logits_width,
                   drafter.logits_width, drafter.new_session,
                   [bos] if bos is not None and probe[:1] == [bos] else [],
                   decoder.num_draft_tokens, decoder.draft_confidence, decoder.adaptive,
                   decoder.drafter_context)

    @functools.cached_property
    def same_tokenizer(self) -> bool:
        return same_tokenizer(self.target_table, self.drafter_table)

    @functools.cached_property
    def intersection(self):
        return intersect(self.target_table, self.drafter_table, self.target_vocab_size,
                         self.drafter_vocab_size)

    def new_drafter(self, state, same_ids: bool) -> Drafter:
        """A drafter session reading the prompt: the same ids, or the prompt's text re-encoded.

        With ``drafter_context`` > 0 it reads only the prompt's last ``drafter_context`` tokens
        (after its BOS, if any), and later backlogs likewise (`Drafter.propose`; adaptive
        drafting may read fewer: `DraftPlan.window`): a long prompt costs the drafter less to
        read (llama.cpp reads ~3 ms a token here) for a slightly worse-informed draft.
        Lossless like any proposal."""
        prompt = list(state.committed)
        bos = self.target_table.bos_id
        head = prompt[:1] if prompt and prompt[0] == bos else []
        body = prompt[len(head):]
        if not same_ids:
            text = self.target_table.decode_bytes(body).decode("utf-8", errors="replace")
            head, body = list(self.drafter_bos), self.drafter_table.encode(text)
        return Drafter(self.new_drafter_session(), self.drafter_table, head + body, state.stats,
                       None if same_ids else self.target_table, len(head), self.drafter_context)

    def plan(self, method: str, greedy: bool, drafter: Drafter) -> DraftPlan:
        """The draft-length plan of one generation (adaptive estimates are kept per pair)."""
        acceptance = self.acceptance.setdefault((method, greedy), Acceptance())
        return DraftPlan(self.num_draft_tokens, self.adaptive, self.costs, acceptance, drafter)

    def fastest(self, candidates: tuple[str, ...], greedy: bool, budget: int) -> str:
        """The method expected to commit the most tokens per second on this pair, from what its
        drafting steps measured so far. A candidate seen for fewer than TRIAL_STEPS drafting
        steps is tried first, in the order given (put the usual best first)."""
        rates = {}
        for method in candidates:
            acceptance = self.acceptance.get((method, greedy))
            if acceptance is None or acceptance.steps < TRIAL_STEPS:
                return method
            rates[method] = DraftPlan(self.num_draft_tokens, True, self.costs, acceptance).best(budget)[1]
        if None in rates.values():
            return candidates[0]
        return max(candidates, key=rates.get)
