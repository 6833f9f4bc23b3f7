"""Plain autoregressive decoding: the method that proposes nothing."""

from __future__ import annotations

from .policy import Estimates, Policy
from .row import Row


class Autoregressive:
    name = "ar"

    def start(self, state) -> Row:
        return Row(state, Policy(0, False, Estimates(), state.params.greedy))
