"""Plain autoregressive decoding: the method that proposes nothing."""

from __future__ import annotations


class Autoregressive:
    name = "ar"

    def start(self, state) -> None:
        pass

    def step(self, state) -> tuple[list[int], int]:
        logits = state.score()
        return [state.params.choose(logits[-1], state.generator)], 0
