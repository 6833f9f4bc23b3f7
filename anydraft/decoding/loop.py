"""The one decoding loop every method plugs into.

A method is an object with ``name`` and ``start(state) -> Row`` (methods/row.py: the
sequence's proposers, drafter and policy). The loop runs `step.step` until a stop condition:
each step commits one or more target tokens, exactly as plain sampling from the target's
processed distribution would have produced them. Plain autoregressive decoding is the method
that proposes nothing. The loop owns stopping (max_new_tokens, every EOS id, stop strings,
context window), streaming and the statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..models.session import PREFILL_CHUNK, Session, read_in_chunks
from ..sampling import SamplingParams
from .stats import Stats
from .step import step
from .text import TextAssembler


@dataclass
class DecodeState:
    """What a method sees: the target session, the committed tokens, the sampling settings."""

    target: Session
    committed: list[int]  # prompt + every committed new token
    params: SamplingParams
    generator: torch.Generator
    stats: Stats = field(default_factory=Stats)
    budget: int = 1  # new tokens still wanted (set by the loop before each step)
    # asked between prompt chunks, the drafter's too (set by the loop; None: nothing cancels)
    cancel: Callable[[], str | None] | None = None

    @property
    def pending(self) -> list[int]:
        """Committed tokens the target has not seen yet (fed with the next scoring call)."""
        return self.committed[len(self.target) :]

    def score(self, candidates: Sequence[int] = ()) -> torch.Tensor:
        """Feed pending + candidates to the target in one pass.

        Returns ``len(candidates) + 1`` logits rows: row i is the target's next-token logits
        after the committed text and the first i candidates.
        """
        ids = self.pending + list(candidates)
        before = self.stats.phase_seconds["target"]
        with self.stats.timed("target"):
            logits = self.target.feed(ids, rows=len(candidates) + 1)
        if not self.stats.target_calls:  # after any chunks `prefill` read before
            self.stats.prefill_seconds += self.stats.phase_seconds["target"] - before
        self.stats.target_calls += 1
        return logits


@dataclass
class Finish:
    reason: str = "length"  # "length" | "eos" | "stop" | "context", or what ``cancel`` said


def prefill(state: DecodeState, cancel: Callable[[], str | None], chunk: int = PREFILL_CHUNK) -> str | None:
    """Read the prompt into the target ``chunk`` tokens at a time, asking ``cancel`` between
    chunks; its answer (None: go on). The last prompt token stays pending, so the first step
    still scores it with the step's candidates: the same tokens reach the target in the same
    order, only split over more calls."""
    start = time.perf_counter()
    with state.stats.timed("target"):
        reason = read_in_chunks(state.target, state.pending[:-1], cancel, chunk)
    state.stats.prefill_seconds += time.perf_counter() - start
    return reason


def decode(
    state: DecodeState,
    method,
    max_new_tokens: int,
    eos_ids: frozenset[int],
    text: TextAssembler,
    finish: Finish,
    cancel: Callable[[], str | None] | None = None,
) -> Iterator[list[int]]:
    """Run ``method`` until a stop condition; yield the tokens each step commits.

    Tokens after a stop condition within one step are discarded (the target saw them only as
    unverified candidates, or as tokens nobody asked for). ``cancel`` (a server's client gone,
    its deadline passed) is asked between prompt chunks and before every step, whether or not
    the last step produced text; a non-empty answer ends generation with that finish reason.
    """
    stats = state.stats
    stats.method = method.name
    stats.prompt_tokens = len(state.committed)
    start = time.perf_counter()
    state.cancel = cancel
    if cancel is not None and (reason := prefill(state, cancel)):
        finish.reason = reason
        stats.seconds = time.perf_counter() - start
        return
    row = method.start(state)
    generated = 0
    while generated < max_new_tokens:
        if len(state.committed) >= state.target.max_length:
            finish.reason = "context"
            break
        if cancel is not None and (reason := cancel()):
            finish.reason = reason
            break
        state.budget = max_new_tokens - generated
        offered = stats.drafted
        new, n_accepted = step([row])[0]
        offered = stats.drafted - offered
        assert new, f"method {method.name} committed nothing"
        kept = []
        for token in new[: max_new_tokens - generated]:
            kept.append(token)
            if token in eos_ids:
                finish.reason = "eos"
                break
            if text.add(token):
                finish.reason = "stop"
                break
        state.committed.extend(kept)
        generated += len(kept)
        stats.accepted += min(n_accepted, len(kept))
        if offered:  # per draft position, as vLLM's spec-decode metrics count them
            stats.drafts += 1
            per = stats.accepted_per_position
            per.extend([0] * (offered - len(per)))
            for i in range(min(n_accepted, len(kept))):
                per[i] += 1
        stats.target_tokens += len(kept) - min(n_accepted, len(kept))
        stats.new_tokens = generated
        stats.seconds = time.perf_counter() - start
        yield kept
        if finish.reason in ("eos", "stop"):
            break
    stats.seconds = time.perf_counter() - start
