"""Decoding methods, one file each. A method = a proposer + a verifier (see decoding/loop.py)."""

from __future__ import annotations

from ..errors import AnydraftError
from .ar import Autoregressive
from .lookup import PromptLookup
from .pairing import Pairing
from .policy import Costs
from .sd import SpeculativeSampling
from .slem import StringLevelExactMatch
from .slrs import StringLevelRejectionSampling
from .tli import TokenLevelIntersection

METHODS = ("ar", "lookup", "sd", "slem", "tli", "slrs", "auto")
NEEDS_DRAFTER = ("sd", "slem", "tli", "slrs")


def check(name: str, has_drafter: bool) -> str:
    """Validate a method name against the configuration; clear error naming the fix."""
    if name not in METHODS:
        raise AnydraftError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    if name in NEEDS_DRAFTER and not has_drafter:
        raise AnydraftError(f"method {name!r} needs a drafter model: pass drafter=... (CLI: --drafter)")
    return name


def choose_auto(pairing: Pairing | None, greedy: bool) -> str:
    """`auto`'s drafter method: sd for a same-tokenizer pair; else slem for greedy (it proposes
    any target token, multi-token merges included), tli for sampling (rejection sampling
    accepts far more than exact match of two independent samples). No drafter: "ar".
    With adaptive drafting `auto` adds prompt lookup (see `factory`)."""
    if pairing is None:
        return "ar"
    if pairing.same_tokenizer:
        return "sd"
    return "slem" if greedy else "tli"


def factory(decoder):
    """A function (method name, sampling params) -> fresh method object for ``decoder``."""
    pairing = Pairing.of(decoder) if decoder.drafter is not None else None
    # prompt lookup's estimates, like the pairing's, outlive one generation
    costs = pairing.costs if pairing is not None else Costs()
    lookup_acceptance: dict = {}

    def lookup(inner=None):
        return PromptLookup(costs, lookup_acceptance, decoder.num_draft_tokens, decoder.adaptive, inner)

    def make(name: str, params):
        if name == "auto":
            # adaptive: the copy proposer joins (and alone, falls back to plain steps itself)
            name = choose_auto(pairing, params.greedy)
            if decoder.adaptive:
                return lookup(None if name == "ar" else make(name, params))
        if name == "ar":
            return Autoregressive()
        if name == "lookup":
            return lookup()
        if name == "sd" and not pairing.same_tokenizer:
            raise AnydraftError(
                "method 'sd' needs a drafter that shares the target's tokenizer, and these two "
                "tokenizers differ: use method 'slem', 'tli', 'slrs' or 'auto'")
        return {"sd": SpeculativeSampling, "slem": StringLevelExactMatch,
                "tli": TokenLevelIntersection, "slrs": StringLevelRejectionSampling}[name](pairing)

    if decoder.method == "sd":
        make("sd", None)  # fail at construction, not at the first generate
    return make
