"""A cross-vocabulary drafter reads the text committed after steps it did not draft only when a
draft or an exact backlog count needs it (`Drafter.sync`): it must give exactly what reading
each commit at once gives, the same tokens, the same feeds of its session, the same drafts and
the same answers to the policy (`behind_up_to`), whatever the schedule of drafts and commits."""

import random

import pytest
import torch

from anydraft.bridge import token_table
from anydraft.decoding.stats import Stats
from anydraft.methods import drafter as drafter_module
from anydraft.methods.drafter import Drafter

TEXT = ("def résumé(path):\n    \"\"\"Read   the file — twice.\"\"\"\n\twith open(path) as f:\n"
        "        return f.read() + '日本語'  # ok?\n\n\nprint(résumé('a.txt'))  " * 2)
TOY_TEXT = "aéaaééa" * 30  # the rich toy pair's alphabet (tests/methods/toys.py)
CONTEXT = 12  # the drafter's context: small, so backlogs are cut and counts clamp


class Recording:
    """A drafter session that logs what it is fed; its logits favour the drafter's own
    encoding of ``truth`` at the position (so some drafts are kept), else a hash of the ids."""

    batch, exact, max_length = None, False, 1 << 16

    def __init__(self, vocab_size: int, truth: list[int]):
        self.vocab_size, self.truth = vocab_size, truth
        self.cache: list[int] = []
        self.fed: list[list[int]] = []

    def __len__(self):
        return len(self.cache)

    def feed(self, ids, rows=None):
        self.fed.append(list(ids))
        out = []
        for t in ids:
            self.cache.append(int(t))
            n = len(self.cache)
            wrong = hash(tuple(self.cache[-3:])) % 4 == 0 or n >= len(self.truth)
            best = hash(tuple(self.cache)) % self.vocab_size if wrong else self.truth[n]
            logits = torch.zeros(self.vocab_size)
            logits[best] = 1.0
            out.append(logits)
        return torch.stack(out[-(rows or len(ids)):])

    def rollback(self, n):
        del self.cache[n:]


class Eager(Drafter):
    """Reads every commit at once, as every drafter did before `sync`."""

    def commit(self, new, kept):
        super().commit(new, kept)
        self.sync()


def _pair(target_tok, drafter_tok, seed: int, text: str):
    target, drafter = token_table(target_tok), token_table(drafter_tok)
    bos = [drafter.bos_id] if drafter.bos_id is not None else []
    data = text.encode()
    truth = bos + drafter.encode_bytes(data)
    prompt = drafter.encode_bytes(data[:20])
    answer = target.encode_bytes(data[20:])
    made = []
    for cls in (Eager, Drafter):
        session = Recording(len(drafter), truth)
        made.append(cls(session, drafter, bos + prompt, Stats(), target_table=target,
                        head=len(bos), context=CONTEXT))
    return made, answer, random.Random(seed)


def _run(target_tok, drafter_tok, seed: int, text: str = TEXT) -> int:
    """Drive an eager and a lazy drafter through one schedule of drafts and commits of
    ``text``; the most commits the lazy one kept unread at once."""
    (eager, lazy), answer, rng = _pair(target_tok, drafter_tok, seed, text)
    most_unread, pos = 0, 0
    while pos < len(answer):
        if rng.random() < 0.2:  # a drafting step: a draft of k after a read of `read`
            k, read = rng.randint(1, 4), rng.choice([0, 0, 4])
            got = [d.propose(k, lambda logits: torch.softmax(logits, -1), True, None, 0.0, read=read)[0]
                   for d in (eager, lazy)]
            assert got[0] == got[1]
            assert eager.caught_up == lazy.caught_up
        elif rng.random() < 0.3:  # a step the drafter sat out, proposing nothing
            for d in (eager, lazy):
                d.propose(0, lambda logits: torch.softmax(logits, -1), True, None, 0.0)
        for most in (rng.choice([0, 4, 16, 64]),):  # what the policy asks each step
            assert eager.behind_up_to(most) == lazy.behind_up_to(most)
        n = rng.randint(1, 3)
        new = answer[pos:pos + n]
        pos += n
        kept = rng.randint(0, len(new) - 1)  # ignored across vocabularies
        eager.commit(new, kept)
        lazy.commit(new, kept)
        most_unread = max(most_unread, len(lazy.unread))
        assert not eager.unread
    assert lazy.session.fed == eager.session.fed
    assert lazy.session.cache == eager.session.cache
    assert lazy.ids == eager.ids
    return most_unread


@pytest.mark.parametrize("seed", range(6))
def test_reading_commits_later_reads_them_as_at_once_toys(seed):
    from tests.methods.toys import rich_tokenizers

    assert _run(*rich_tokenizers(), seed, TOY_TEXT) > 1


@pytest.mark.parametrize("seed", range(4))
def test_reading_commits_later_reads_them_as_at_once_real_pair(seed):
    """Qwen2.5's tokens committed, SmolLM2 drafting (issue 45's pair), on code with runs of
    spaces and tabs, multi-byte characters cut across tokens, and a long plain stretch."""
    from anydraft.models.loading import load_tokenizer
    from tests.conftest import require_model

    target = load_tokenizer(require_model("qwen2.5-coder-0.5b"))
    drafter = load_tokenizer(require_model("smollm2-135m"))
    assert _run(target, drafter, seed) > 1


def test_unread_commits_are_bounded(monkeypatch):
    """Past `MAX_UNREAD` commits the drafter reads them: the work of one catch-up is bounded."""
    from tests.methods.toys import rich_tokenizers

    monkeypatch.setattr(drafter_module, "MAX_UNREAD", 3)
    (_, lazy), answer, _ = _pair(*rich_tokenizers(), 0, TOY_TEXT)
    for t in answer[:7]:
        lazy.commit([t], 0)
        assert len(lazy.unread) < 3
