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
from anydraft.decoding import DecodeState, Finish, Stats, TextAssembler, decode
from anydraft.methods.pairing import Pairing
from anydraft.sampling import SamplingParams

TARGET_VOCAB = ["<eos>", "a", "b", "c", "ab", "abc", "bc"]
TARGET_MERGES = [("a", "b"), ("ab", "c"), ("b", "c")]
DRAFTER_VOCAB = ["<eos>", "a", "b", "c", "ca", "bb"]
DRAFTER_MERGES = [("c", "a"), ("b", "b")]


def toy_tokenizer(vocab, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.add_special_tokens({"eos_token": "<eos>"})
    return fast


class ToySession:
    """A `Session` whose next-token logits are a hash of the ids so far (float64)."""

    max_length = 64

    def __init__(self, vocab_size: int, salt: str, scale: float = 2.0):
        self.vocab_size = vocab_size
        self.salt = salt
        self.scale = scale
        self.ids: list[int] = []

    def __len__(self):
        return len(self.ids)

    def logits(self, ids) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.salt}:{ids}".encode()).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randn(self.vocab_size, generator=g, dtype=torch.float64) * self.scale

    def feed(self, ids, rows=None):
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
    the model) and ``target_eos=False`` (a target tokenizer without EOS) vary it."""

    def __init__(self, drafter_vocab=DRAFTER_VOCAB, drafter_merges=DRAFTER_MERGES,
                 target_width=None, drafter_width=None, target_eos=True):
        self.target_tok = toy_tokenizer(TARGET_VOCAB, TARGET_MERGES)
        self.drafter_tok = toy_tokenizer(drafter_vocab, drafter_merges)
        self.target_table = token_table(self.target_tok)
        if not target_eos:  # "<eos>" stays a special token, but nothing ends a generation
            self.target_table = dataclasses.replace(self.target_table, eos_id=None,
                                                    eos_ids=frozenset())
        self.drafter_table = token_table(self.drafter_tok)
        self.target_width = target_width or len(TARGET_VOCAB)
        self.drafter_width = drafter_width or len(drafter_vocab)

    def pairing(self, num_draft_tokens=2, drafter_salt="drafter"):
        width = self.drafter_width
        return Pairing(self.target_table, self.drafter_table, self.target_width, width,
                       lambda: ToySession(width, drafter_salt), [], num_draft_tokens)

    def exact_target_distribution(self, prompt, params, max_new_tokens) -> dict:
        """Plain sampling from the target, computed by recursion, independently of the loop."""
        session = ToySession(self.target_width, "target")
        eos = self.target_table.eos_ids
        dist = defaultdict(float)

        def walk(seq, prob):
            if len(seq) == max_new_tokens or (seq and seq[-1] in eos):
                dist[tuple(seq)] += prob
                return
            p = params.probs(session.logits(tuple(prompt + seq)))
            for t, pt in enumerate(p.tolist()):
                if pt > 0:
                    walk(seq + [t], prob * pt)

        walk([], 1.0)
        return dict(dist)

    def method_distribution(self, make_method, prompt, params, max_new_tokens) -> tuple[dict, int]:
        """Run the real decoding loop over every random path; exact output distribution."""
        dist = defaultdict(float)
        todo, paths = [[]], 0
        while todo:
            gen = Enumerator(todo.pop())
            state = DecodeState(ToySession(self.target_width, "target"), list(prompt), params, gen, Stats())
            text = TextAssembler(self.target_table.token_bytes, self.target_table.special_ids)
            out = [t for chunk in decode(state, make_method(), max_new_tokens,
                                         self.target_table.eos_ids, text, Finish()) for t in chunk]
            dist[tuple(out)] += gen.prob
            todo.extend(gen.alternatives)
            paths += 1
        return dict(dist), paths


def params(**kw) -> SamplingParams:
    return SamplingParams(**kw)
