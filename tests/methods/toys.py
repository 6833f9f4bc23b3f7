"""Toy models and tokenizers small enough to enumerate every random outcome exactly.

Two tokenizers over the alphabet {a, b, c}, each non-injective (the string "ab" is both
[ab] and [a, b] for the target; "ca" is [ca] and [c, a] for the drafter), with different
vocabularies. Toy "models" are sessions whose logits are a fixed pseudo-random function of
the token ids so far: any function will do, losslessness must hold for all of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict

import torch

from anydraft.bridge import token_table
from anydraft.decoding import DecodeState, Finish, Generation, Stats, TextAssembler, decode_batch
from anydraft.methods.pairing import Pairing
from anydraft.sampling import SamplingParams

TARGET_VOCAB = ["<eos>", "a", "b", "c", "ab", "abc", "bc"]
TARGET_MERGES = [("a", "b"), ("ab", "c"), ("b", "c")]
DRAFTER_VOCAB = ["<eos>", "a", "b", "c", "ca", "bb"]
DRAFTER_MERGES = [("c", "a"), ("b", "b")]


# A richer pair over {a, é} (é = bytes C3 A9, "Ã" and "©" as GPT-2 stand-ins): multi-byte
# characters split across tokens, special tokens that are not EOS, BOS in both, two target ids
# that spell "é" (the BPE token and an added one, which the tokenizer emits), a drafter token
# that starts with a continuation byte ("©a"), and tokens the other side cannot spell whole.
RICH_TARGET_VOCAB = ["<eos>", "<bos>", "<sp>", "a", "Ã", "©", "Ã©", "aÃ©"]
RICH_TARGET_MERGES = [("Ã", "©"), ("a", "Ã©")]
RICH_DRAFTER_VOCAB = ["<eos>", "<bos>", "a", "Ã", "©", "Ã©", "©a", "aa"]
RICH_DRAFTER_MERGES = [("Ã", "©"), ("a", "a"), ("©", "a")]


def rich_tokenizers():
    """(target, drafter) of the richer pair."""
    target = toy_tokenizer(RICH_TARGET_VOCAB, RICH_TARGET_MERGES, ("<eos>", "<bos>", "<sp>"),
                           added=("é",), bos="<bos>")
    drafter = toy_tokenizer(RICH_DRAFTER_VOCAB, RICH_DRAFTER_MERGES, ("<eos>", "<bos>"),
                            bos="<bos>")
    return target, drafter


def toy_tokenizer(vocab, merges, specials=("<eos>",), added=(), bos=None):
    """Byte-level BPE over ``vocab`` (GPT-2 stand-ins: "Ã" is byte 0xC3, "©" 0xA9); the first
    of ``specials`` is EOS, ``bos`` (one of them) BOS; ``added``: plain added tokens, matched
    on the text first (an added "é" spells what "Ã©" spells: two ids, the same bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=specials[0], bos_token=bos)
    fast.add_special_tokens({"eos_token": specials[0],
                             "additional_special_tokens": list(specials[1:])})
    if added:
        fast.add_tokens(list(added))
    return fast


class ToySession:
    """A `Session` whose next-token logits are a hash of the ids so far (float64)."""

    batch = None
    exact = False

    def __init__(self, vocab_size: int, salt: str, scale: float = 2.0, max_length: int = 64):
        self.vocab_size = vocab_size
        self.salt = salt
        self.scale = scale
        self.max_length = max_length
        self.ids: list[int] = []

    def __len__(self):
        return len(self.ids)

    def logits(self, ids) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.salt}:{ids}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randn(self.vocab_size, generator=g, dtype=torch.float64) * self.scale

    def feed(self, ids, rows=None):
        assert len(self.ids) + len(ids) <= self.max_length, "fed beyond the context window"
        assert all(0 <= t < self.vocab_size for t in ids), "an id without a logits row"
        rows = len(ids) if rows is None else rows
        out = []
        for t in ids:
            self.ids.append(int(t))
            out.append(self.logits(tuple(self.ids)))
        return torch.stack(out[-rows:])

    def rollback(self, n):
        del self.ids[n:]


class Enumerator:
    """A stand-in for torch.Generator that follows a script of choices and records the
    probability of the path taken and the untaken alternatives at new decision points."""

    def __init__(self, script):
        self.script = list(script)
        self.pos = 0
        self.prob = 1.0
        self.alternatives: list[list] = []  # new decision points: untaken scripts

    def _choose(self, options):  # options: [(value, prob)] with prob > 0
        if self.pos < len(self.script):
            value = self.script[self.pos]
            prob = dict(options)[value]
        else:
            (value, prob), rest = options[0], options[1:]
            self.alternatives.extend(self.script[: self.pos] + [v] for v, _ in rest)
            self.script.append(value)
        self.pos += 1
        self.prob *= prob
        return value

    def sample(self, probs):
        return self._choose([(i, float(p)) for i, p in enumerate(probs.tolist()) if p > 0])

    def bernoulli(self, p):
        return self._choose([(v, w) for v, w in ((True, p), (False, 1 - p)) if w > 0])


class Toys:
    """A target and a drafter toy. The defaults are the pair above; ``drafter_vocab`` (merges
    over its own tokens), the logits widths (wider: padded; narrower: a tokenizer longer than
    the model) and ``target_eos=False`` (a target tokenizer without EOS) vary it; ``target``
    and ``drafter`` replace a tokenizer whole; ``context``: the target's window."""

    def __init__(self, drafter_vocab=DRAFTER_VOCAB, drafter_merges=DRAFTER_MERGES,
                 target_width=None, drafter_width=None, target_eos=True, target=None,
                 drafter=None, context=64):
        self.target_tok = target or toy_tokenizer(TARGET_VOCAB, TARGET_MERGES)
        self.drafter_tok = drafter or toy_tokenizer(drafter_vocab, drafter_merges)
        self.target_table = token_table(self.target_tok)
        if not target_eos:  # "<eos>" stays a special token, but nothing ends a generation
            self.target_table = dataclasses.replace(self.target_table, eos_id=None,
                                                    eos_ids=frozenset())
        self.drafter_table = token_table(self.drafter_tok)
        self.target_width = target_width or len(self.target_table)
        self.drafter_width = drafter_width or len(self.drafter_table)
        self.context = context

    def pairing(self, num_draft_tokens=2, drafter_salt="drafter"):
        width, bos = self.drafter_width, self.drafter_table.bos_id
        return Pairing(self.target_table, self.drafter_table, self.target_width, width,
                       lambda: ToySession(width, drafter_salt), [] if bos is None else [bos],
                       num_draft_tokens)

    def make(self, method: str, num_draft_tokens: int = 2):
        """A function making a fresh ``method`` ("ar", "lookup", "sd", "slem", "tli", "slrs")
        on this pair; sd's drafter is another model with the target's own vocabulary."""
        from anydraft.methods import (
            SpeculativeSampling,
            StringLevelExactMatch,
            StringLevelRejectionSampling,
            TokenLevelIntersection,
        )
        from anydraft.methods.ar import Autoregressive
        from anydraft.methods.lookup import PromptLookup

        pairing = self.pairing(num_draft_tokens)
        if method == "sd":
            width = len(self.target_table)
            pairing = dataclasses.replace(
                pairing, drafter_table=self.target_table, drafter_vocab_size=width,
                new_drafter_session=lambda: ToySession(width, "drafter", scale=1.0))
        if method in ("ar", "lookup"):
            return {"ar": Autoregressive, "lookup": lambda: PromptLookup(num_draft_tokens, False)}[method]
        cls = {"sd": SpeculativeSampling, "slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
               "slrs": StringLevelRejectionSampling}[method]
        return lambda: cls(pairing)

    def target_session(self) -> ToySession:
        return ToySession(self.target_width, "target", max_length=self.context)

    def _text(self, stop):
        return TextAssembler(self.target_table.token_bytes, self.target_table.special_ids, stop)

    def constraint(self, grammar):
        """A fresh grammar state of ``grammar`` (constraints/grammar.py) over the target's ids."""
        from anydraft.constraints.matcher import Compiler

        return Compiler(self.target_tok, self.target_width, self.target_table.eos_ids).constraint(grammar)

    def exact_target_distribution(self, prompt, params, max_new_tokens, stop=(), grammar=None) -> dict:
        """Plain sampling from the target, computed by recursion, independently of the loop:
        a sequence ends at max_new_tokens, an EOS, a completed stop string (its last token
        kept) or a full context window. ``grammar``: plain constrained sampling, the tokens
        the grammar refuses after the sequence so far at -inf before ``params`` apply."""
        session = self.target_session()
        eos = self.target_table.eos_ids
        dist = defaultdict(float)

        def stopped(seq):
            text = self._text(stop)
            return any(text.add(t) for t in seq)

        def walk(seq, prob):
            if (len(seq) == max_new_tokens or (seq and seq[-1] in eos) or stopped(seq)
                    or len(prompt) + len(seq) >= self.context):
                dist[tuple(seq)] += prob
                return
            logits = session.logits(tuple(prompt + seq))
            if grammar is not None:  # a fresh state over the sequence: no rollback involved
                state = self.constraint(grammar)
                state.commit(seq)
                logits = logits.masked_fill(~state.allowed(), float("-inf"))
            p = params.probs(logits)
            for t, pt in enumerate(p.tolist()):
                if pt > 0:
                    walk(seq + [t], prob * pt)

        walk([], 1.0)
        return dict(dist)

    def method_distribution(self, make_method, prompt, params, max_new_tokens,
                            stop=(), grammar=None) -> tuple[dict, int]:
        """Run the real decoding loop over every random path; exact output distribution."""
        dist = defaultdict(float)
        todo, paths = [[]], 0
        while todo:
            gen = Enumerator(todo.pop())
            state = DecodeState(self.target_session(), list(prompt), params, gen, Stats(),
                                constraint=None if grammar is None else self.constraint(grammar))
            decode_batch([Generation(state, make_method(), max_new_tokens,
                                     self.target_table.eos_ids, self._text(stop), Finish())])
            dist[tuple(state.committed[len(prompt):])] += gen.prob
            todo.extend(gen.alternatives)
            paths += 1
        return dict(dist), paths


def params(**kw) -> SamplingParams:
    return SamplingParams(**kw)
