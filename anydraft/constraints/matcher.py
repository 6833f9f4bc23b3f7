"""`Compiler`: grammars (constraints/grammar.py) compiled by llguidance for one target
tokenizer; `Constraint`: one generation's grammar state, and the mask it puts on the target's
logits.

Exactness (docs/structured-outputs.md): constrained decoding samples each token from the
target's distribution with the tokens the grammar refuses after the text so far removed and the
rest renormalised (their logits set to -inf before temperature, top-k, top-p and min-p, as
plain constrained decoding does). A step applies that mask to every row of logits it verifies
with (`Constraint.mask`): row i with the grammar advanced over the first i candidates. Every
token-level verifier (exact match, rejection sampling) is exact for any target distribution
that depends only on the text before the position, which the masked one does, so each stays
exact for the constrained distribution: a candidate the grammar refuses has probability 0 at
its row and is rejected there, and the token that replaces it, or the bonus token, is drawn
from a masked row. The grammar state advances only over committed tokens (`commit`); the
masks along a draft are computed ahead and rolled back at once.
"""

from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import torch

from ..errors import AnydraftError
from .grammar import Grammar

# llguidance's view of a tokenizer, per (its vocabulary's digest, logits width, end tokens):
# building one walks the whole vocabulary (2.4 s for Qwen2.5's 151,936 tokens on a Zen 4), and
# the server's workers each hold a copy of the same tokenizer
_tokenizers: dict[tuple, object] = {}
_building = threading.Lock()


def _digest(tokenizer) -> str:
    """What tells two tokenizers apart whatever their names (two in-memory ones share the name
    ""): the fast tokenizer's whole definition, else its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


class Compiler:
    """Grammars compiled for one target: its tokenizer, the width of its logits rows and the
    tokens that end a generation (allowed where the grammar is complete)."""

    def __init__(self, tokenizer, width: int, eos_ids: frozenset[int]):
        self.tokenizer, self.width, self.eos_ids = tokenizer, width, eos_ids
        self._key = None  # `_lltokenizer`'s, made at the first grammar

    def _lltokenizer(self):
        import llguidance.hf

        if self._key is None:
            self._key = (_digest(self.tokenizer), self.width, tuple(sorted(self.eos_ids)))
        with _building:
            if self._key not in _tokenizers:
                _tokenizers[self._key] = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.width, eos_token=sorted(self.eos_ids))
            return _tokenizers[self._key]

    def constraint(self, grammar: Grammar) -> Constraint:
        """A fresh `Constraint` of ``grammar`` (compiling a schema takes milliseconds); a grammar
        llguidance cannot compile raises `AnydraftError` with its reason."""
        from llguidance import LLMatcher

        try:
            text = grammar.llguidance()
        except (ValueError, RuntimeError) as exc:
            raise AnydraftError(f"the {grammar.kind} cannot be compiled: {exc}") from None
        matcher = LLMatcher(self._lltokenizer(), text)
        if matcher.is_error():
            raise AnydraftError(f"the {grammar.kind} cannot be compiled: {first_line(matcher.get_error())}")
        return Constraint(matcher, self.width, self.eos_ids)


def allows(bits: np.ndarray, token: int, width: int) -> bool:
    """Whether llguidance's mask ``bits`` allows ``token``."""
    return token < width and bool((bits[token >> 3] >> (token & 7)) & 1)


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


class Constraint:
    """One generation's grammar state (an llguidance matcher) over the target's token ids."""

    def __init__(self, matcher, width: int, eos_ids: frozenset[int]):
        self.matcher, self.width, self.eos_ids = matcher, width, eos_ids

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next: a bool row of the logits' width."""
        return torch.from_numpy(self._bits_per_token(self._bits()) == 1)

    def _bits(self) -> np.ndarray:
        """llguidance's mask of the next token: bit t (little-endian) set where t is allowed."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        if not bits.any():
            raise AnydraftError(f"the grammar allows no token here: {first_line(self.matcher.get_error())}")
        return bits

    def _bits_per_token(self, bits: np.ndarray) -> np.ndarray:
        return np.unpackbits(bits, count=self.width, bitorder="little")

    def mask(self, scores: torch.Tensor, candidates: list[int], argmax_only: bool = False) -> torch.Tensor:
        """``scores`` (row i: the target's logits after the first i candidates; float CPU rows,
        the step's own), masked in place and returned: every token the grammar refuses at row
        i's position at -inf, for the rows up to the first candidate the grammar refuses or
        that ends the generation (rows past it are never read: verification rejects that
        candidate at its row and stops there, and nothing follows an end). The grammar state
        is left as it was.

        ``argmax_only``: only each row's first maximum will be read (greedy, without a logit
        bias or log-probabilities); a row whose first maximum the grammar allows is left as it
        is (its masked first maximum is the same token), which saves unpacking and writing
        the vocabulary-wide mask (0.14 ms a row for Qwen2.5's 151,936 ids on the Zen 4)."""
        advanced = 0
        try:
            for i in range(len(candidates) + 1):
                bits = self._bits()
                row = scores[i].numpy()
                if not (argmax_only and allows(bits, int(row.argmax()), self.width)):
                    np.putmask(row, self._bits_per_token(bits) == 0, -np.inf)
                if i == len(candidates) or candidates[i] in self.eos_ids:
                    break
                token = candidates[i]
                if not allows(bits, token, self.width):
                    break  # refused: rejected at this row
                self._consume(token)
                advanced += 1
        finally:
            if advanced:
                self.matcher.rollback(advanced)
        return scores

    def forced(self, candidates: list[int], may_cut: bool, most: int) -> tuple[int, list[int]]:
        """How many of ``candidates`` to offer, and up to ``most`` tokens the grammar forces
        after them (llguidance's fast-forward tokens: text that no other continuation has,
        spelt in the tokens the tokenizer gives it, up to where the text that follows could
        still merge into a token). Offered: every candidate, or where ``may_cut`` those before
        the first the grammar refuses (verification rejects that one at its row; nothing after
        it is read). Nothing is forced after a refused candidate or one that ends the
        generation. The grammar state is left as it was."""
        valid = self.matcher.validate_tokens(candidates) if candidates else 0
        kept = valid if may_cut else len(candidates)
        if most <= 0 or valid < kept or any(token in self.eos_ids for token in candidates[:kept]):
            return kept, []
        if kept and not self.matcher.consume_tokens(candidates[:kept]):
            raise AnydraftError(f"the grammar refused a token: {first_line(self.matcher.get_error())}")
        try:
            return kept, self.matcher.compute_ff_tokens()[:most]
        finally:
            if kept:
                self.matcher.rollback(kept)

    def commit(self, tokens: list[int]) -> None:
        """Advance over ``tokens``, the step's committed ones (each allowed by its masked row),
        up to the first that ends the generation (what follows it is never emitted)."""
        for token in tokens:
            self._consume(token)
            if token in self.eos_ids:
                return

    def _consume(self, token: int) -> None:
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise AnydraftError(f"the grammar refused token {token}: {first_line(self.matcher.get_error())}")
