"""`Row`: one sequence's speculative state, the unit a decoding step runs over (a batch is a
list of rows)."""

from __future__ import annotations

from dataclasses import dataclass

from .drafter import Drafter
from .policy import Policy


@dataclass
class Row:
    state: object  # decoding.DecodeState: target session, committed tokens, sampling, stats
    policy: Policy  # chooses each step's proposer and draft length, learns from the step
    drafting: object = None  # the drafter method's proposer (sd, slem, tli, slrs) or None
    drafter: Drafter | None = None  # the drafter model and its cache (with `drafting`)
    copying: object = None  # prompt lookup's proposer (lookup.PromptLookup) or None
    proposed: str = "plain"  # the proposer of its latest step (whose candidates it accepted)

    def proposer(self, name: str):
        """The proposer a `Choice` names ("plain": the drafting one proposes nothing)."""
        return self.copying if name == "copy" else self.drafting
