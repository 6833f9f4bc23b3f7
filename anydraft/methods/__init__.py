"""Decoding methods, one proposer per file; decoding/step.py runs one step of any of them."""

from __future__ import annotations

from ..errors import AnydraftError
from .ar import Autoregressive
from .lookup import PromptLookup
from .pairing import Pairing
from .sd import SpeculativeSampling
from .slem import StringLevelExactMatch
from .slrs import StringLevelRejectionSampling
from .tli import TokenLevelIntersection


def auto_candidates(pairing: Pairing | None, greedy: bool, constrained: bool = False) -> tuple[str, ...]:
    """`auto`'s drafter methods, the usual best first: sd for a same-tokenizer pair; else for
    greedy slem (it proposes the drafter's own choice, re-tokenized: any target token,
    multi-token merges included; tli's greedy draft is the drafter's best among shared tokens
    only, so a trial of it costs more than it can win); for sampling tli (rejection sampling
    accepts far more than exact match of two independent samples) and slrs (it accepts more
    of what it drafts but cuts drafts into fewer candidates: which wins depends on the pair;
    not under a grammar, ``constrained``: constraints/grammar.py `GRAMMAR_METHODS`).
    No drafter: "ar"."""
    if pairing is None:
        return ("ar",)
    if pairing.same_tokenizer:
        return ("sd",)
    return ("slem",) if greedy else ("tli",) if constrained else ("tli", "slrs")


def choose_auto(pairing: Pairing | None, greedy: bool, budget: int = 128, constrained: bool = False) -> str:
    """`auto`'s drafter method. With a fixed draft length: the first candidate. Adaptive: the
    candidate this pair measured fastest (`Pairing.fastest`: each is tried first), and
    `factory` adds prompt lookup."""
    candidates = auto_candidates(pairing, greedy, constrained)
    if len(candidates) == 1 or not pairing.adaptive:
        return candidates[0]
    return pairing.fastest(candidates, greedy, budget)


def factory(decoder):
    """A function (method name, sampling params, new tokens wanted) -> fresh method object
    for ``decoder``."""
    pairing = Pairing.of(decoder) if decoder.drafter is not None else None
    draft = decoder.draft
    # what copies earn, like what the pair's drafts earn, outlives one generation
    estimates = decoder.estimates

    def make(name: str, params, budget: int = 128, constrained: bool = False):
        """``constrained``: the request has a grammar (`auto` leaves out what cannot take one)."""
        if name == "auto":
            # adaptive: the copy proposer joins (and alone, falls back to plain steps itself)
            name = choose_auto(pairing if decoder.auto_drafts else None, params.greedy, budget, constrained)
            if draft.adaptive:
                inner = None if name == "ar" else make(name, params)
                return PromptLookup(draft.num_draft_tokens, True, inner, estimates)
        if name == "ar":
            return Autoregressive(estimates)
        if name == "lookup":
            return PromptLookup(draft.num_draft_tokens, draft.adaptive, None, estimates)
        if name == "sd" and not pairing.same_tokenizer:
            raise AnydraftError(
                "method 'sd' needs a drafter that shares the target's tokenizer, and these two "
                "tokenizers differ: use method 'slem', 'tli', 'slrs' or 'auto'")
        return {"sd": SpeculativeSampling, "slem": StringLevelExactMatch,
                "tli": TokenLevelIntersection, "slrs": StringLevelRejectionSampling}[name](pairing)

    if draft.method == "sd":
        make("sd", None)  # fail at construction, not at the first generate
    return make
