"""Sampling exactness by exhaustive enumeration: every random path of the real decoding loop,
weighted by its exact probability, gives the target's own distribution over outputs (1e-9)."""

import pytest

from anydraft.methods import (
    SpeculativeSampling,
    StringLevelExactMatch,
    StringLevelRejectionSampling,
    TokenLevelIntersection,
)
from anydraft.methods.ar import Autoregressive
from tests.methods.toys import params

PROMPT = [1]  # "a"
MAX_NEW = 3  # 2 draft tokens, then the target's own: up to 3 tokens per step


def max_new(settings):
    """Untruncated sampling branches on every token: one token fewer keeps it to seconds."""
    return MAX_NEW - 1 if settings == dict(temperature=1.0) else MAX_NEW


def assert_same_distribution(got: dict, want: dict):
    assert abs(sum(got.values()) - 1) < 1e-9
    for seq in set(got) | set(want):
        assert abs(got.get(seq, 0.0) - want.get(seq, 0.0)) < 1e-9, seq


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=4), dict(temperature=1.3, top_p=0.8),
            dict(temperature=1.0, min_p=0.1), dict(temperature=0.0)]


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
@pytest.mark.parametrize("method", ["ar", "slem", "tli", "slrs"])
def test_cross_vocabulary_methods_are_exact(toys, method, settings):
    if method in ("slem", "slrs") and settings == dict(temperature=1.0):
        pytest.skip("105k random paths (40 s); covered under the truncated settings")
    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    pairing = toys.pairing(num_draft_tokens=2)
    make = {"ar": Autoregressive, "slem": lambda: StringLevelExactMatch(pairing),
            "tli": lambda: TokenLevelIntersection(pairing),
            "slrs": lambda: StringLevelRejectionSampling(pairing)}[method]
    got, paths = toys.method_distribution(make, PROMPT, p, max_new(settings))
    assert paths >= len(want)  # every outcome of the target was reached
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", SETTINGS[1:], ids=str)  # plain t=1: slow, same verifier as tli
def test_sd_is_exact_with_a_same_vocabulary_drafter(toys, settings):
    """Same vocabulary, different model: the drafter is a target-vocabulary toy, other salt."""
    import dataclasses

    from tests.methods.toys import TARGET_VOCAB, ToySession

    p = params(**settings)
    want = toys.exact_target_distribution(PROMPT, p, max_new(settings))
    pairing = dataclasses.replace(
        toys.pairing(num_draft_tokens=2), drafter_table=toys.target_table,
        drafter_vocab_size=len(TARGET_VOCAB),
        new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    got, _ = toys.method_distribution(lambda: SpeculativeSampling(pairing), PROMPT, p, max_new(settings))
    assert_same_distribution(got, want)


@pytest.mark.parametrize("settings", [SETTINGS[1], SETTINGS[4]], ids=str)
@pytest.mark.parametrize("method", ["slem", "tli", "slrs", "sd"])
def test_a_drafter_reading_only_the_prompts_end_is_exact(toys, method, settings):
    """--drafter-context: the drafter reads the last token of the prompt "abc" and what follows."""
    import dataclasses
    import types

    from tests.methods.toys import TARGET_VOCAB, ToySession

    prompt = [1, 2, 3]  # "a", "b", "c"
    p = params(**settings)
    want = toys.exact_target_distribution(prompt, p, max_new(settings))
    pairing = dataclasses.replace(toys.pairing(num_draft_tokens=2), drafter_context=1)
    if method == "sd":
        pairing = dataclasses.replace(
            pairing, drafter_table=toys.target_table, drafter_vocab_size=len(TARGET_VOCAB),
            new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    state = types.SimpleNamespace(committed=prompt, stats=None)
    assert pairing.new_drafter(state, same_ids=method == "sd").behind == 1  # "c" in both vocabularies
    make = {"slem": StringLevelExactMatch, "tli": TokenLevelIntersection,
            "slrs": StringLevelRejectionSampling, "sd": SpeculativeSampling}[method]
    got, _ = toys.method_distribution(lambda: make(pairing), prompt, p, max_new(settings))
    assert_same_distribution(got, want)


def test_a_drafter_behind_by_more_than_its_context_reads_only_the_end():
    """After plain steps the drafter's backlog is cut to its last ``context`` tokens after the
    head (BOS); its cache restarts there. A short backlog is read whole, as before."""
    import torch

    from anydraft.decoding.stats import Stats
    from anydraft.methods.drafter import Drafter

    class Recorder:
        max_length, vocab_size = 100, 4

        def __init__(self):
            self.cache, self.fed = [], []

        def __len__(self):
            return len(self.cache)

        def feed(self, ids, rows=None):
            self.cache += ids
            self.fed.append(list(ids))
            return torch.zeros(len(ids), 4)

        def rollback(self, n):
            del self.cache[n:]

    session = Recorder()
    drafter = Drafter(session, None, [9, 1, 2, 3], Stats(), head=1, context=2)
    assert drafter.behind == 3  # BOS + the last 2
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[0] == [9, 2, 3]
    drafter.commit([1, 0], 1)  # a short backlog after the draft was kept
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [1, 0] and session.cache == [9, 2, 3, 1, 0]
    drafter.commit([3, 3, 2, 2, 1], 0)  # plain steps committed 5 tokens it did not draft
    assert drafter.behind == 2  # the head is still in the cache
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [2, 1] and session.cache == [9, 2, 1] and drafter.ids == [9, 2, 1]
    drafter.commit([3, 3, 2], 0)
    drafter.trim(1)  # a probe's shorter read
    drafter.propose(1, lambda logits: torch.tensor([0.0, 1.0, 0, 0]), True, None, 0.0)
    assert session.fed[-1] == [2] and session.cache == [9, 2] and drafter.ids == [9, 2]


def test_a_wrong_verifier_is_caught(toys):
    """The harness must be able to fail: accepting every draft gives the drafter's law."""
    import anydraft.methods.tli as tli

    p = params(temperature=1.0)
    want = toys.exact_target_distribution(PROMPT, p, 2)
    pairing = toys.pairing(num_draft_tokens=2)
    original = tli.verify_rejection

    def accept_all(p_, q_, candidates, generator):
        return len(candidates), original(p_[len(candidates):], q_[:0], [], generator)[1]

    tli.verify_rejection = accept_all
    try:
        got, _ = toys.method_distribution(lambda: TokenLevelIntersection(pairing), PROMPT, p, 2)
    finally:
        tli.verify_rejection = original
    with pytest.raises(AssertionError):
        assert_same_distribution(got, want)
