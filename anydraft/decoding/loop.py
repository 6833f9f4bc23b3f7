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
        start = time.perf_counter()
        logits = self.target.feed(self.pending + list(candidates), rows=len(candidates) + 1)
        self.account(time.perf_counter() - start)
        return logits

    def account(self, seconds: float) -> None:
        """Count one target call of ``seconds`` (shared with other rows in a batched call: the
        time this sequence waited for it)."""
        self.stats.phase_seconds["target"] += seconds
        if not self.stats.target_calls:  # after any chunks `prefill` read before
            self.stats.prefill_seconds += seconds
        self.stats.target_calls += 1


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


class Generation:
    """One request's decoding: its state, its method's `Row`, the stopping rules and the
    statistics. `decode` runs one generation; `decode_batch` steps several together, so that
    one target call can score them all (issue 21)."""

    def __init__(self, state: DecodeState, method, max_new_tokens: int, eos_ids: frozenset[int],
                 text: TextAssembler, finish: Finish, cancel: Callable[[], str | None] | None = None):
        self.state, self.method, self.max_new_tokens = state, method, max_new_tokens
        self.eos_ids, self.text, self.finish, self.cancel = eos_ids, text, finish, cancel
        self.row = None  # the method's Row, once `start` read the prompt
        self.generated = 0
        self._drafted = 0  # the state's drafted count before the step `ready` allowed
        self._start = time.perf_counter()

    def start(self) -> bool:
        """Read the prompt (in chunks, when something can cancel) and start the method; False
        when cancelled during the read."""
        stats, state = self.state.stats, self.state
        stats.method = self.method.name
        stats.prompt_tokens = len(state.committed)
        self._start = time.perf_counter()
        state.cancel = self.cancel
        if self.cancel is not None and (reason := prefill(state, self.cancel)):
            self.finish.reason = reason
            self.close()
            return False
        self.row = self.method.start(state)
        return True

    def ready(self) -> bool:
        """Whether to run another step (budget left, no EOS or stop string yet, room in the
        context window, nothing cancelled); when not, the finish reason is set and the clock
        stopped."""
        state = self.state
        if self.generated >= self.max_new_tokens or self.finish.reason in ("eos", "stop"):
            pass
        elif len(state.committed) >= state.target.max_length:
            self.finish.reason = "context"
        elif self.cancel is not None and (reason := self.cancel()):
            self.finish.reason = reason
        else:
            state.budget = self.max_new_tokens - self.generated
            self._drafted = state.stats.drafted
            return True
        self.close()
        return False

    def absorb(self, new: list[int], n_accepted: int) -> list[int]:
        """Commit what a step produced up to the first stop condition; the tokens kept.

        Tokens after a stop condition within one step are discarded (the target saw them only
        as unverified candidates, or as tokens nobody asked for)."""
        assert new, f"method {self.method.name} committed nothing"
        stats, kept = self.state.stats, []
        offered = stats.drafted - self._drafted  # draft tokens the step offered the target
        for token in new[: self.max_new_tokens - self.generated]:
            kept.append(token)
            if token in self.eos_ids:
                self.finish.reason = "eos"
                break
            if self.text.add(token):
                self.finish.reason = "stop"
                break
        self.state.committed.extend(kept)
        self.generated += len(kept)
        stats.accepted += min(n_accepted, len(kept))
        if offered:  # per draft position, as vLLM's spec-decode metrics count them
            stats.drafts += 1
            per = stats.accepted_per_position
            per.extend([0] * (offered - len(per)))
            for i in range(min(n_accepted, len(kept))):
                per[i] += 1
        stats.target_tokens += len(kept) - min(n_accepted, len(kept))
        stats.new_tokens = self.generated
        self.close()
        return kept

    def close(self) -> None:
        self.state.stats.seconds = time.perf_counter() - self._start


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

    ``cancel`` (a server's client gone, its deadline passed) is asked between prompt chunks
    and before every step, whether or not the last step produced text; a non-empty answer
    ends generation with that finish reason.
    """
    generation = Generation(state, method, max_new_tokens, eos_ids, text, finish, cancel)
    if not generation.start():
        return
    while generation.ready():
        yield generation.absorb(*step([generation.row])[0])
    generation.close()


def decode_batch(generations: list[Generation]) -> None:
    """Run every generation to its end, stepping the unfinished ones together: the rows of
    one step whose targets are rows of one batch are scored in one call (`step.step`).
    A generation leaves as soon as it finishes; the others go on."""
    active = [g for g in generations if g.start()]
    while active := [g for g in active if g.ready()]:
        for g, (new, n_accepted) in zip(active, step([g.row for g in active]), strict=True):
            g.absorb(new, n_accepted)
