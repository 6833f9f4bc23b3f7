"""`Row`: one sequence's speculative state, the unit a decoding step runs over (a batch is a
list of rows)."""

from __future__ import annotations

from dataclasses import dataclass

from ..planning.policy import Policy
from .drafter import Drafter


@dataclass
class Row:
    state: object  # decoding.DecodeState: target session, committed tokens, sampling, stats
    policy: Policy  # chooses each step's proposer and draft length, learns from the step
    draft_proposer: object = None  # the drafter method proposing (sd, slem, tli, slrs) or None
    drafter: Drafter | None = None  # the drafter model and its cache (`draft_proposer` drafts on it)
    copy_proposer: object = None  # prompt lookup proposing (lookup.PromptLookup) or None
    # under a grammar, offer what it forces after each proposal (decoding/step.py
    # `_with_forced`); plain decoding (`ar`) offers nothing
    forces: bool = True

    def proposer(self, name: str):
        """The proposer a `Choice` names ("plain": the drafting one proposes nothing)."""
        return self.copy_proposer if name == "copy" else self.draft_proposer
