"""What every drafter-based method needs about a (target, drafter) pair, built once per Decoder."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..bridge import same_tokenizer, token_table
from ..bridge.intersection import intersect
from ..models.session import HFSession, Session
from .drafter import Drafter


def _logits_width(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


@dataclass
class Pairing:
    target_table: object  # TokenTable
    drafter_table: object
    target_vocab_size: int  # logits width (padded vocabularies are wider than the tokenizer)
    drafter_vocab_size: int
    new_drafter_session: Callable[[], Session]
    drafter_bos: list[int]  # what the drafter's tokenizer puts before a text (Gemma: <bos>)
    num_draft_tokens: int = 5
    confidence: float = 0.0

    @classmethod
    def of(cls, decoder) -> Pairing:
        tok, model = decoder.drafter.tokenizer, decoder.drafter.model
        bos = tok.bos_token_id
        probe = tok.encode("x", add_special_tokens=True)
        return cls(decoder.table, token_table(tok), _logits_width(decoder.target.model),
                   _logits_width(model), lambda: HFSession(model),
                   [bos] if bos is not None and probe[:1] == [bos] else [],
                   decoder.num_draft_tokens, decoder.draft_confidence)

    @functools.cached_property
    def same_tokenizer(self) -> bool:
        return same_tokenizer(self.target_table, self.drafter_table)

    @functools.cached_property
    def intersection(self):
        return intersect(self.target_table, self.drafter_table, self.target_vocab_size,
                         self.drafter_vocab_size)

    def new_drafter(self, state, same_ids: bool) -> Drafter:
        """A drafter session reading the prompt: the same ids, or the prompt's text re-encoded."""
        if same_ids:
            ids = list(state.committed)
        else:
            prompt = state.committed
            if prompt and prompt[0] == self.target_table.bos_id:
                prompt = prompt[1:]
            text = self.target_table.decode_bytes(prompt).decode("utf-8", errors="replace")
            ids = self.drafter_bos + self.drafter_table.encode(text)
        return Drafter(self.new_drafter_session(), self.drafter_table, ids, state.stats)


def room(state) -> int:
    """How many candidates are worth offering: the target's context window must hold them,
    and one token of the step is always the target's own, so drafts beyond the remaining
    budget minus one would be thrown away."""
    return max(0, min(state.target.max_length - len(state.committed), state.budget) - 1)


def close_step(state, candidates: list[int], n: int) -> None:
    """After verification: the target's cache keeps the committed text and the ``n`` accepted
    candidates (the step's own last token is fed next step); count what was offered."""
    state.target.rollback(len(state.committed) + n)
    state.stats.drafted += len(candidates)
