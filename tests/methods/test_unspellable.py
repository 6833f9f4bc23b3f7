"""A drafter that drafts a byte the target's vocabulary cannot spell (issue 19): SmolLM2 has no
token for 0x04 (nor 0x06, 0x13, 0xF1, ...), Gemma-3 can draft `<0x04>`. The draft is cut at
that byte; greedy output stays the target's own. (The toy version, with every random path:
tests/methods/test_exhaustive.py.)"""

import types

import pytest
import torch

from anydraft import Decoder, methods
from anydraft.bridge import token_table
from anydraft.decoding import Stats
from anydraft.methods import StringLevelExactMatch, StringLevelRejectionSampling
from anydraft.methods.pairing import Pairing
from anydraft.models.loading import load_tokenizer
from anydraft.sampling import SamplingParams
from tests.conftest import require_llamacpp, require_model

TARGET, DRAFTER = "smollm2-135m", "gemma3-270m"


class Drafts:
    """A drafter stand-in that drafts a fixed list of its own ids."""

    def __init__(self, ids):
        self.ids = ids

    def propose(self, k, to_probs, greedy, generator, confidence, stop_ids=(), read=0):
        return self.ids[:k], [torch.zeros(1)] * len(self.ids[:k])


@pytest.fixture(scope="module")
def tables():
    require_model(TARGET)
    require_model(DRAFTER)
    return token_table(load_tokenizer(TARGET)), token_table(load_tokenizer(DRAFTER))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method", [StringLevelExactMatch, StringLevelRejectionSampling])
def test_the_draft_is_cut_at_the_first_unspellable_byte(tables, method, temperature):
    target, drafter = tables
    assert target.byte_ids[0x04] is None and drafter.byte_ids[0x04] is not None
    pairing = Pairing(target, drafter, len(target), len(drafter), None, [])
    committed = target.encode("Say hello")
    state = types.SimpleNamespace(params=SamplingParams(temperature=temperature), generator=None, stats=Stats(),
                                  committed=committed, budget=100,
                                  target=types.SimpleNamespace(max_length=1000))
    drafts = drafter.encode(" there") + [drafter.byte_ids[0x04]] + drafter.encode(" friend")
    proposal = method(pairing).propose(state, Drafts(drafts), len(drafts), 0)
    assert target.decode_bytes(proposal.candidates) == b" there"
    # an unspellable first byte: nothing to propose, no error
    proposal = method(pairing).propose(state, Drafts([drafter.byte_ids[0xF1]]), 1, 0)
    assert proposal.candidates == []


class Biased:
    """A drafter session whose every third row makes `<0x04>` its argmax."""

    batch = None
    exact = False

    def __init__(self, session, token):
        self.session, self.token, self.rows = session, token, 0
        self.vocab_size, self.max_length = session.vocab_size, session.max_length

    def __len__(self):
        return len(self.session)

    def feed(self, ids, rows=None):
        out = self.session.feed(ids, rows)
        for row in out:
            self.rows += 1
            if self.rows % 3 == 0:
                row[self.token] = row.max() + 10
        return out

    def rollback(self, n):
        self.session.rollback(n)


@pytest.fixture(scope="module")
def biased_decoder(tables):
    """SmolLM2 target, Gemma-3 drafter (llama.cpp: both load in a second), and the target's
    own greedy output."""
    require_llamacpp()
    dec = Decoder(target=TARGET, drafter=DRAFTER, backend="llamacpp", drafter_backend="llamacpp",
                  num_draft_tokens=4, adaptive=False)
    new_session = dec.drafter.new_session
    token = tables[1].byte_ids[0x04]
    dec.drafter.new_session = lambda: Biased(new_session(), token)
    dec._method_factory = methods.factory(dec)  # the pairing reads the drafter's sessions
    return dec, dec.generate(PROMPT, max_new_tokens=MAX_NEW, method="ar").token_ids


PROMPT, MAX_NEW = "List three fruits.", 12


@pytest.mark.real
@pytest.mark.parametrize("method", ["slem", "slrs", "auto"])  # greedy slrs and auto are slem
def test_a_real_drafter_drafting_0x04_leaves_greedy_output_unchanged(biased_decoder, method):
    dec, want = biased_decoder
    out = dec.generate(PROMPT, max_new_tokens=MAX_NEW, method=method)
    assert out.token_ids == want
    assert out.stats["drafted"] > 0  # the drafts before each <0x04> were still proposed
