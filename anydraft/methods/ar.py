"""Plain autoregressive decoding: the method that proposes nothing."""

from __future__ import annotations

from ..planning.estimates import Estimates
from ..planning.policy import Policy
from .row import Row


class Autoregressive:
    name = "ar"

    def __init__(self, estimates: Estimates | None = None):
        # the decoder's: plain steps learn nothing, but a batch reads the target's cost curve
        # in them (planning/call.py `prefill_budget`)
        self.estimates = estimates if estimates is not None else Estimates()

    def start(self, state) -> Row:
        return Row(state, Policy(0, False, self.estimates, state.params.greedy), forces=False)
