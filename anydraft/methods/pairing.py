"""What every drafter-based method needs about a (target, drafter) pair, built once per Decoder."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..bridge import same_tokenizer, token_table
from ..bridge.intersection import intersect
from ..models.batch import RowView
from ..models.session import Session, close_session
from ..planning.cost import best
from ..planning.estimates import Estimates
from ..planning.policy import Policy
from ..planning.settings import SETTINGS
from .drafter import Drafter
from .row import Row
from .verify import Proposal

# drafter settings kept for the biased settings of recent generations (`drafter_params`): a
# server's requests with the same bias share them; more than this many biases start afresh
DRAFTER_PARAMS_KEPT = 64


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
    drafter_context: int = SETTINGS.drafter_context  # backlog tokens (the drafter's) it reads; 0: all
    estimates: Estimates = field(default_factory=Estimates)  # what the pair's steps cost and earn

    @classmethod
    def of(cls, decoder) -> Pairing:
        drafter = decoder.drafter
        tok = drafter.tokenizer
        bos = tok.bos_token_id
        probe = tok.encode("x", add_special_tokens=True)
        draft = decoder.draft
        return cls(decoder.table, token_table(tok), target_vocab_size=decoder.target.logits_width,
                   drafter_vocab_size=drafter.logits_width, new_drafter_session=drafter.new_session,
                   drafter_bos=[bos] if bos is not None and probe[:1] == [bos] else [],
                   num_draft_tokens=draft.num_draft_tokens, confidence=draft.draft_confidence,
                   adaptive=draft.adaptive, drafter_context=draft.drafter_context,
                   estimates=decoder.estimates)

    @functools.cached_property
    def same_tokenizer(self) -> bool:
        return same_tokenizer(self.target_table, self.drafter_table)

    @functools.cached_property
    def intersection(self):
        return intersect(self.target_table, self.drafter_table, self.target_vocab_size,
                         self.drafter_vocab_size)

    @functools.cached_property
    def target_eos(self) -> int | None:
        """The target id a drafted EOS becomes: the tokenizer's EOS, else any id that ends a
        generation; None when the target has none (a drafted EOS is then not proposed)."""
        table = self.target_table
        return table.eos_id if table.eos_id is not None else min(table.eos_ids, default=None)

    @functools.cached_property
    def _drafter_params(self) -> dict:
        return {}  # a generation's settings -> its drafter's (`drafter_params`, asked every step)

    def drafter_params(self, params):
        """The sampling settings a drafter of another vocabulary drafts with: the target's,
        with the logit bias (keyed by target ids) moved to the drafter ids that spell the same
        tokens (`intersection`); a biased token the drafter cannot spell alike is drafted
        unbiased. Any proposal keeps a method exact, since every verifier forms p from the
        target's own logits (`SamplingParams.probs`); carrying the bias only spares drafts the
        target would reject (a token banned with -100, drafted again and again)."""
        if not params.logit_bias:
            return params
        cache = self._drafter_params
        if params not in cache:
            if len(cache) >= DRAFTER_PARAMS_KEPT:
                cache.clear()
            to_drafter = self.intersection.target_to_drafter
            cache[params] = replace(params, logit_bias=[
                (int(to_drafter[t]), v) for t, v in params.logit_bias
                if t < len(to_drafter) and to_drafter[t] >= 0])
        return cache[params]

    def scorable(self, candidates: list[int]) -> list[int]:
        """``candidates`` up to the first id the target has no logits row for (a tokenizer
        longer than the model's vocabulary): the target could neither score nor emit it."""
        for i, t in enumerate(candidates):
            if not 0 <= t < self.target_vocab_size:
                return candidates[:i]
        return candidates

    def new_drafter(self, state, same_ids: bool) -> Drafter:
        """A drafter session reading the prompt: the same ids, or the prompt's text re-encoded.

        With ``drafter_context`` > 0 it reads only the prompt's last ``drafter_context`` tokens
        (after its BOS, if any), and later backlogs likewise (`Drafter.propose`; adaptive
        drafting may read fewer: planning/cost.py `read_size`): a long prompt costs the drafter less to
        read (llama.cpp reads ~3 ms a token here) for a slightly worse-informed draft.
        Lossless like any proposal."""
        prompt = list(state.committed)
        bos = self.target_table.bos_id
        head = prompt[:1] if prompt and prompt[0] == bos else []
        body = prompt[len(head):]
        if not same_ids:
            text = self.target_table.decode_bytes(body).decode("utf-8", errors="replace")
            head, body = list(self.drafter_bos), self.drafter_table.encode(text)
        rows = getattr(state, "drafter_rows", None)  # a test's bare state has none
        session = self.new_drafter_session() if rows is None else RowView(rows)
        try:
            return Drafter(session, self.drafter_table, head + body, state.stats,
                           target_table=None if same_ids else self.target_table, head=len(head),
                           context=self.drafter_context, cancel=state.cancel, width=self.drafter_vocab_size)
        except BaseException:  # the row goes back to the batch now, not when the GC finds it
            close_session(session)
            raise

    def start(self, state, proposer) -> Row:
        """One generation of a drafter method: its drafter, reading the prompt, and its policy
        (adaptive estimates are kept per pair, per method and greedy or not)."""
        greedy = state.params.greedy
        policy = Policy(self.num_draft_tokens, self.adaptive, self.estimates, greedy,
                        self.estimates.of(proposer.name, greedy), context=self.drafter_context)
        return Row(state, policy, draft_proposer=proposer, drafter=self.new_drafter(state, proposer.same_ids))

    def fastest(self, candidates: tuple[str, ...], greedy: bool, budget: int) -> str:
        """The method expected to commit the most tokens per second on this pair, from what its
        drafting steps measured so far. A candidate seen for fewer than `Settings.trial_steps` drafting
        steps is tried first, in the order given (put the usual best first)."""
        rates = {}
        for method in candidates:
            acceptance = self.estimates.acceptance.get((method, greedy))
            if acceptance is None or acceptance.steps < SETTINGS.trial_steps:
                return method
            rates[method] = best(self.num_draft_tokens, self.estimates.costs, acceptance, budget=budget)[1]
        if None in rates.values():
            return candidates[0]
        return max(candidates, key=rates.get)


class DrafterMethod:
    """A method that drafts with the drafter model (sd, slem, tli, slrs). It says what its
    drafter drafts with (``draft_args(state)``: the ``to_probs, greedy, generator,
    confidence, stop_ids`` of `Drafter.draft_passes`) and what the drafts propose (``finish(state,
    drafts, qs)``: a `Proposal`), so that the drafters of a batch can draft together
    (decoding/step.py)."""

    same_ids = False  # whether the drafter reads the target's own ids

    def __init__(self, pairing: Pairing):
        self.pairing = pairing

    def start(self, state) -> Row:
        return self.pairing.start(state, self)

    def propose(self, state, drafter, k: int, read: int) -> Proposal:
        return self.finish(state, *drafter.propose(k, *self.draft_args(state), read))
