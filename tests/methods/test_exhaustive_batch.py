"""Two rows stepping together, by exhaustive enumeration (issue 21).

One `Enumerator` drives both rows' draws, so every combination of them is taken with its exact
probability. The rows' targets are rows of one `SerialBatch` (through `RowView`), so each step
scores both in one `feed_rows` call; the rows differ in prompt, method and sampling settings,
and the second leaves early. The joint law of the two outputs must be the product of the
target's exact laws (1e-9): each row exact, and the rows independent."""

import dataclasses
from collections import defaultdict

import pytest
import torch

from anydraft.decoding import DecodeState, Finish, Generation, Stats, decode_batch
from anydraft.methods import (
    SpeculativeSampling,
    StringLevelExactMatch,
    StringLevelRejectionSampling,
    TokenLevelIntersection,
)
from anydraft.methods.ar import Autoregressive
from anydraft.methods.lookup import PromptLookup
from anydraft.models.batch import RowView, SerialBatch
from tests.methods.test_exhaustive import assert_same_distribution
from tests.methods.toys import TARGET_VOCAB, Enumerator, ToySession, params


@pytest.fixture(autouse=True)
def one_thread():
    """Thousands of ops on 7-entry tensors: a second thread only waits for a busy core (10 ms
    a softmax instead of 2 us on a loaded 2-core machine; test_statistical.py does the same)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Counting(SerialBatch):
    """A `SerialBatch` that records the rows of every call."""

    def __init__(self, new_session, max_rows, calls):
        super().__init__(new_session, max_rows)
        self.calls = calls

    def feed_rows(self, feeds, rows):
        self.calls.append(sorted(feeds))
        return super().feed_rows(feeds, rows)


def make(toys, name):
    """A fresh-method factory; draft length fixed at 2 (adaptive k would depend on timings)."""
    pairing = toys.pairing(num_draft_tokens=2)
    if name == "sd":  # same vocabulary, another model
        pairing = dataclasses.replace(
            pairing, drafter_table=toys.target_table, drafter_vocab_size=len(TARGET_VOCAB),
            new_drafter_session=lambda: ToySession(len(TARGET_VOCAB), "drafter", scale=1.0))
    return {"ar": Autoregressive, "lookup": lambda: PromptLookup(2, adaptive=False),
            "sd": lambda: SpeculativeSampling(pairing), "slem": lambda: StringLevelExactMatch(pairing),
            "tli": lambda: TokenLevelIntersection(pairing),
            "slrs": lambda: StringLevelRejectionSampling(pairing)}[name]


def batch_distribution(toys, rows, generators=lambda gen: [gen, gen]):
    """`decode_batch` of ``rows`` ((method, prompt, settings, max new tokens) each) over every
    random path: the exact joint law of the outputs, and each path's target calls (their rows).
    ``generators``: the rows' generators, given the path's enumerator."""
    dist, calls_per_path, todo = defaultdict(float), [], [[]]
    methods = [make(toys, name) for name, _, _, _ in rows]
    while todo:
        gen = Enumerator(todo.pop())
        calls = []
        batch = Counting(toys.target_session, len(rows), calls)
        generations = [
            Generation(DecodeState(RowView(batch), list(prompt), params(**settings), g, Stats()),
                       method(), n, toys.target_table.eos_ids, toys._text(()), Finish())
            for (_, prompt, settings, n), method, g in zip(rows, methods, generators(gen), strict=True)]
        decode_batch(generations)
        outs = tuple(tuple(g.state.committed[len(prompt):])
                     for g, (_, prompt, _, _) in zip(generations, rows, strict=True))
        dist[outs] += gen.prob
        calls_per_path.append(calls)
        todo.extend(gen.alternatives)
    return dict(dist), calls_per_path


def product(toys, rows) -> dict:
    """The joint law of independent rows, each sampled from the target alone (by recursion)."""
    (_, p1, s1, n1), (_, p2, s2, n2) = rows
    first = toys.exact_target_distribution(p1, params(**s1), n1)
    second = toys.exact_target_distribution(p2, params(**s2), n2)
    return {(a, b): pa * pb for a, pa in first.items() for b, pb in second.items()}


TOP_P = dict(temperature=1.3, top_p=0.8)
MIN_P = dict(temperature=1.0, min_p=0.1)
TOP_K = dict(temperature=0.7, top_k=4)
CASES = {  # (first row, second row): the second wants fewer tokens and leaves early
    "tli+slrs": (("tli", [1], TOP_P, 3), ("slrs", [2, 3], MIN_P, 2)),
    "ar+slem": (("ar", [3], TOP_P, 3), ("slem", [1, 2], MIN_P, 2)),
    "lookup+sd": (("lookup", [1, 2, 3, 1, 2], MIN_P, 3), ("sd", [3], TOP_P, 2)),
    "greedy slem+tli": (("slem", [1], dict(temperature=0.0), 3), ("tli", [2], TOP_K, 2)),
}


@pytest.mark.parametrize("rows", CASES.values(), ids=CASES.keys())
def test_two_rows_together_are_each_exact_and_independent(toys, rows):
    got, calls_per_path = batch_distribution(toys, rows)
    want = product(toys, rows)
    assert len(calls_per_path) >= len(want)  # every joint outcome was reached
    assert_same_distribution(got, want)
    # both rows were scored in one call from the first step; on some paths the first row went
    # on alone after the second left
    assert all(calls[0] == [0, 1] for calls in calls_per_path)
    assert any([0] in calls for calls in calls_per_path)


class Recording:
    """The first row's generator: the enumerator, each draw kept for the second row."""

    def __init__(self, gen):
        self.gen, self.draws = gen, []

    def sample(self, probs):
        self.draws.append(self.gen.sample(probs))
        return self.draws[-1]

    def bernoulli(self, p):
        self.draws.append(self.gen.bernoulli(p))
        return self.draws[-1]


class Replaying:
    """The second row's generator: its i-th draw is the first row's i-th (as if both rows were
    seeded alike). The first row draws first in every step."""

    def __init__(self, recording):
        self.recording, self.i = recording, 0

    def sample(self, probs):
        self.i += 1
        return self.recording.draws[self.i - 1]

    bernoulli = sample


def test_rows_seeded_alike_are_caught(toys):
    """The harness must be able to fail where only independence is wrong: two `ar` rows on one
    prompt whose draws repeat each other are each exact, but their joint law is not the
    product (it is the diagonal)."""
    rows = (("ar", [1], TOP_K, 2), ("ar", [1], TOP_K, 2))

    def alike(gen):
        first = Recording(gen)
        return [first, Replaying(first)]

    got, _ = batch_distribution(toys, rows, alike)
    assert all(a == b for a, b in got)
    for i in range(2):  # each row alone is still the target's law
        marginal = defaultdict(float)
        for outs, prob in got.items():
            marginal[outs[i]] += prob
        assert_same_distribution(marginal, toys.exact_target_distribution([1], params(**TOP_K), 2))
    with pytest.raises(AssertionError):
        assert_same_distribution(got, product(toys, rows))
