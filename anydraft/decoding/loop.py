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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..models.session import Session, close_session, read_in_chunks
from ..models.threads import host_threads
from ..planning.settings import PREFILL_CHUNK
from ..sampling import SamplingParams
from .logprobs import TokenLogprob
from .stats import Stats
from .step import RowStep, step
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
    drafter_rows: object = None  # the drafter's BatchSession to take a row of (None: a session)
    # alternatives per token whose log-probabilities each step reports (None: none are)
    top_logprobs: int | None = None
    step_logprobs: list[TokenLogprob] = field(default_factory=list)  # of the last step's tokens
    # what the output must match (constraints/grammar.py `Constraint`; None: free text)
    constraint: object = None

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

    def account_prefill(self, seconds: float) -> None:
        """Count ``seconds`` spent reading the prompt (in a call shared with other rows: the
        time this sequence waited for it)."""
        self.stats.phase_seconds["target"] += seconds
        self.stats.prefill_seconds += seconds


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]  # new tokens only (an EOS that ended generation is included)
    finish_reason: str  # "length" | "eos" | "stop" | "context", or what ``cancel`` said
    stats: dict = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None  # one per token id, where they were asked for


@dataclass
class Piece:
    """What a generation hands out at once: new text, where each run of it came from, and the
    steps that made it (for the playground's colors and timeline, issue 23)."""

    text: str = ""
    spans: list[tuple[str, str]] = field(default_factory=list)  # (text, origin); they join to `text`
    # every step since the last piece: its proposer ("draft", "copy", "plain"), the candidates
    # it offered, how many of them were kept, the tokens it committed, its seconds
    steps: list[dict] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # its tokens', where asked for


@dataclass
class Finish:
    reason: str = "length"  # "length" | "eos" | "stop" | "context", or what ``cancel`` said


def prefill(state: DecodeState, cancel: Callable[[], str | None], chunk: int = PREFILL_CHUNK,
            chunks: int | None = None) -> str | None:
    """Read the prompt into the target ``chunk`` tokens at a time (at most ``chunks`` chunks;
    None: all), asking ``cancel`` between chunks; its answer (None: go on). The last prompt
    token stays pending, so the first step still scores it with the step's candidates: the
    same tokens reach the target in the same order, only split over more calls."""
    ids = state.pending[:-1]
    if chunks is not None:
        ids = ids[: chunks * chunk]
    start = time.perf_counter()
    with state.stats.timed("target"):
        reason = read_in_chunks(state.target, ids, cancel, chunk)
    state.stats.prefill_seconds += time.perf_counter() - start
    return reason


class Generation:
    """One request's decoding: its state, its method's `Row`, the stopping rules, the text and
    the statistics. A `Batch` runs it, alone or beside others (one target call then scores
    them all, issue 21): `start`, then while `ready`: one step and `absorb`; `delta` hands out
    new text as it comes, `result` the whole output once `done`."""

    def __init__(self, state: DecodeState, method, max_new_tokens: int, eos_ids: frozenset[int],
                 text: TextAssembler, finish: Finish, cancel: Callable[[], str | None] | None = None,
                 keep: Callable | None = None):
        self.state, self.method, self.max_new_tokens = state, method, max_new_tokens
        self.eos_ids, self.text, self.finish, self.cancel = eos_ids, text, finish, cancel
        # ``keep(session, ids, usable)`` takes the target's cache when the generation leaves,
        # for a later prompt that starts alike (models/prefix.py; None: it is freed)
        self.keep = keep
        self.row = None  # the method's Row, once `start` read the prompt
        self.prompt_tokens = len(state.committed)
        self.generated = 0
        self.done = False
        self.error: Exception | None = None  # what ended it, where it failed (`fail`)
        self._start = self._stepped = time.perf_counter()
        self._steps: list[dict] = []  # steps not yet handed out by `piece`
        self.logprobs: list[TokenLogprob] = []  # of every kept token, where asked for
        self._logprobs_out = 0  # of them handed out by `piece`

    def start(self, chunks: int | None = None) -> bool:
        """Read the prompt and start the method; whether it started. The prompt is read in
        chunks when something can cancel (asked before each chunk: False and `done` when it
        answers), when ``chunks`` limits this call to that many (False, not done, while
        some is left), or when the target is exact (models/exact.py `reads`: its prompt is read
        in the same pieces on every path, never with the first step); else with the first
        step. ``chunks=0`` reads nothing: a batch's steps read the prompt (`step`'s
        ``joining``), and this only asks ``cancel`` and starts the method once all is read."""
        stats, state = self.state.stats, self.state
        if not stats.prompt_tokens:  # the first call
            stats.method = self.method.name
            stats.prompt_tokens = self.prompt_tokens
            stats.cached_tokens = len(state.target)  # a kept cache's prefix (models/prefix.py)
            self._start = time.perf_counter()
            state.cancel = self.cancel
        if self.cancel is not None or chunks is not None or state.target.exact:
            cancel = self.cancel or (lambda: None)
            if reason := (cancel() if chunks == 0 else prefill(state, cancel, chunks=chunks)):
                self.finish.reason = reason
                self.close()
                self.done = True
                return False
            if len(state.pending) > 1:
                return False
        self.row = self.method.start(state)
        return True

    def ready(self) -> bool:
        """Whether to run another step (budget left, no EOS or stop string yet, room in the
        context window, nothing cancelled); when not, the finish reason is set and the clock
        stopped."""
        state = self.state
        if self.done:
            return False
        if self.generated >= self.max_new_tokens or self.finish.reason in ("eos", "stop"):
            pass
        elif len(state.committed) >= state.target.max_length:
            self.finish.reason = "context"
        elif self.cancel is not None and (reason := self.cancel()):
            self.finish.reason = reason
        else:
            state.budget = self.max_new_tokens - self.generated
            self._stepped = time.perf_counter()
            return True
        self.close()
        self.done = True
        return False

    def absorb(self, result: RowStep) -> list[int]:
        """Commit what a step produced up to the first stop condition; the tokens kept.

        Tokens after a stop condition within one step are discarded (the target saw them only
        as unverified candidates, or as tokens nobody asked for). Each token's origin goes to
        the text: an accepted candidate is its proposer's ("draft" or "copy"), a token a
        grammar forced "grammar", the step's last token the target's own."""
        new, n_accepted, offered, proposer = result.tokens, result.accepted, result.offered, result.proposer
        forced = range(n_accepted, n_accepted + result.forced)
        assert new, f"method {self.method.name} committed nothing"
        stats, kept = self.state.stats, []
        for i, token in enumerate(new[: self.max_new_tokens - self.generated]):
            kept.append(token)
            if token in self.eos_ids:
                self.finish.reason = "eos"
                break
            origin = proposer if i < n_accepted else "grammar" if i in forced else "target"
            if self.text.add(token, origin):
                self.finish.reason = "stop"
                break
        self.state.committed.extend(kept)
        if self.state.top_logprobs is not None:
            self.logprobs += self.state.step_logprobs[: len(kept)]
        self.generated += len(kept)
        stats.accepted += min(n_accepted, len(kept))
        if offered:  # per draft position, as vLLM's spec-decode metrics count them
            stats.drafts += 1
            per = stats.accepted_per_position
            per.extend([0] * (offered - len(per)))
            for i in range(min(n_accepted, len(kept))):
                per[i] += 1
        n_forced = len(forced[: max(0, len(kept) - n_accepted)])
        stats.forced += n_forced
        stats.target_tokens += len(kept) - min(n_accepted, len(kept)) - n_forced
        stats.new_tokens = self.generated
        self.close()
        self._steps.append({"proposer": proposer if offered else "plain", "offered": offered,
                            "accepted": min(n_accepted, len(kept)), "forced": n_forced,
                            "tokens": len(kept),
                            "seconds": round(time.perf_counter() - self._stepped, 6)})
        return kept

    def close(self) -> None:
        self.state.stats.seconds = time.perf_counter() - self._start

    def fail(self, error: Exception) -> None:
        """End this generation with ``error`` (its step failed; the others of its batch go
        on): `result` raises it."""
        self.error, self.finish.reason = error, "error"
        self.close()
        self.done = True

    def leave(self) -> None:
        """Free the target's and the drafter's rows or caches now (a batch's rows go to the next
        request); the target's goes to ``keep`` where there is one and the generation did not
        fail, with the committed tokens it holds, all of them usable by a later sequence, or
        on an exact target only the prompt's whole `PREFILL_CHUNK` pieces: what a later
        prompt's read computes alike (models/exact.py `reads`), where the answer's tokens
        were scored in steps of other sizes."""
        drafter = self.row.drafter if self.row is not None else None
        close_session(drafter.session if drafter is not None else None)
        target, committed = self.state.target, self.state.committed
        if self.keep is None or self.error is not None:
            close_session(target)
            return
        held = min(len(target), len(committed))
        usable = (self.prompt_tokens - 1) // PREFILL_CHUNK * PREFILL_CHUNK if target.exact else held
        self.keep(target, committed[:held], min(held, usable))

    def delta(self) -> str:
        """New text since the last call (never half a UTF-8 character or a possible stop string)."""
        return self.piece().text

    def piece(self) -> Piece:
        """`delta` with its origins and the steps since the last piece; steps that showed no
        text yet wait for the next piece with text, so a stream that sends only pieces with
        text loses none. Once done, everything left: held-back text, an incomplete character at
        the very end as U+FFFD, and the last steps."""
        if self.done:
            self.text.finish()
        spans = self.text.delta_spans(final=self.done)
        if not spans and not self.done:
            return Piece()
        steps, self._steps = self._steps, []
        logprobs, self._logprobs_out = self.logprobs[self._logprobs_out:], len(self.logprobs)
        return Piece("".join(text for text, _ in spans), spans, steps, logprobs)

    def result(self) -> tuple[str, GenerationOutput]:
        """Once done: the text not yet handed out by `delta`, and the whole output; raises
        what failed it, if something did."""
        if self.error is not None:
            raise self.error
        text = self.text.finish()
        tail = self.text.delta(final=True)
        return tail, GenerationOutput(
            text, self.state.committed[self.prompt_tokens:], self.finish.reason,
            self.state.stats.as_dict(), None if self.state.top_logprobs is None else self.logprobs)


class Batch:
    """Generations stepping together (continuous batching, issue 21): each `run_once` starts the
    generations that joined since the last one, then runs ONE step of every unfinished
    generation, in which the rows whose targets are rows of one `BatchSession` are scored in
    one target call (`step.step`). A joining prompt is read at once while nothing else decodes;
    otherwise a part of it rides in each step's call (planning/call.py `prefill`), so that it
    does not stall the others. A generation whose own work fails ends alone (`Generation.fail`, reported
    done); only a failure of a shared call raises from `run_once`. A generation joins whenever it likes and leaves as soon as it finishes or
    is cancelled; its target row is freed then. ``min_prefill``: the fewest prompt tokens a step
    reads for joining generations (default `Settings.min_prefill`; planning/call.py
    `prefill_budget`)."""

    def __init__(self, min_prefill: int | None = None):
        self.min_prefill = min_prefill
        self.joining: list[Generation] = []
        self.active: list[Generation] = []

    def __len__(self) -> int:
        return len(self.joining) + len(self.active)

    def join(self, generation: Generation) -> None:
        self.joining.append(generation)

    def run_once(self) -> list[tuple[Generation, bool]]:
        """One step of the batch: each generation that made news, with whether it is done.
        torch works single-threaded in it but for the models' calls (models/threads.py)."""
        with host_threads():
            return self._run_once()

    def _run_once(self) -> list[tuple[Generation, bool]]:
        chunks = 0 if self.active else None  # 0: read in the step's call
        news = [(g, True) for g in self.joining if not _alone(g, g.start, chunks) and g.done]
        self.active += [g for g in self.joining if g.row is not None]
        self.joining = [g for g in self.joining if g.row is None and not g.done]
        news += [(g, True) for g in self.active if not _alone(g, g.ready)]
        self.active = [g for g in self.active if g.row is not None and not g.done]
        if self.active:
            results = step([g.row for g in self.active], [g.state for g in self.joining], self.min_prefill)
            for g, result in zip(self.active, results, strict=True):
                if isinstance(result, Exception):
                    g.fail(result)
                else:
                    _alone(g, g.absorb, result)
                news.append((g, not _alone(g, g.ready)))  # finished: reported now, not a step later
            self.active = [g for g in self.active if not g.done]
        for g, done in news:
            if done:
                g.leave()
        return news

    def clear(self) -> list[Generation]:
        """Drop every generation (after a failed step), freeing their rows; the dropped ones."""
        dropped, self.joining, self.active = self.joining + self.active, [], []
        for g in dropped:
            g.keep = None  # the failed call may have left its caches in no known state
            g.leave()
        return dropped


def _alone(generation: Generation, work: Callable, *args):
    """``work(*args)``, where what it raises fails ``generation`` alone (None then)."""
    try:
        return work(*args)
    except Exception as exc:  # noqa: BLE001 - this generation's failure, not its batch's
        generation.fail(exc)
        return None


def decode_batch(generations: list[Generation]) -> None:
    """Run every generation to its end, stepping the unfinished ones together."""
    batch = Batch()
    for g in generations:
        batch.join(g)
    while batch:
        batch.run_once()
