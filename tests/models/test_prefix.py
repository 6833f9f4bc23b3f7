"""The prefix cache (models/prefix.py, issue 57): caches kept after a generation, handed to a
later sequence that starts alike, within a budget; on batch rows (models/batch.py), on a
decoder's own sessions and through `Decoder.generate`/`generate_batch`, exact where the target
scores exactly."""

from __future__ import annotations

import pytest

from anydraft.models.batch import RowView, SerialBatch
from anydraft.models.prefix import PrefixCache, common_prefix, default_prefix_cache_mb
from anydraft.planning.settings import PREFILL_CHUNK
from tests.conftest import require_llamacpp, require_model

A = list(range(100, 140))  # a conversation's first turn (40 tokens)


def test_the_longest_usable_prefix_is_taken_and_a_token_is_left_to_read():
    dropped = []
    cache = PrefixCache(1000, dropped.append)
    assert cache.put("a", A, usable=40) and cache.put("b", A[:10] + [1, 2, 3], usable=13)
    assert cache.put("c", A, usable=8)  # an exact cache: only its first 8 are usable
    assert cache.take(A + [7, 8], fresh_free=True) == ("a", 40)
    assert cache.take(A[:11], fresh_free=True) == ("b", 10)  # 11 asked: 10 held, one to read
    assert cache.take(A, fresh_free=True) is None  # "c": 8 usable of the 40 it holds
    assert cache.take(A, fresh_free=False) == ("c", 8)
    assert not cache.kept and not dropped  # taken caches are the caller's, not dropped


def test_a_short_match_keeps_the_cache_while_a_fresh_one_is_free():
    cache = PrefixCache(1000, lambda handle: None)
    cache.put("turn", A, usable=40)
    other = A[:12] + [9] * 30  # another conversation sharing a 12-token system prompt
    assert cache.take(other, fresh_free=True) is None  # 12 of 40: it may serve its own next turn
    assert cache.take(other, fresh_free=False) == ("turn", 12)  # nothing free: better than nothing
    assert cache.take([5, 6, 7], fresh_free=False) is None  # nothing shared


def test_the_budget_gives_up_the_least_recently_kept():
    dropped = []
    cache = PrefixCache(100, dropped.append)
    assert not cache.put("huge", A * 3, usable=120)  # alone over the budget: the caller frees it
    assert not cache.put("nothing", A, usable=0)
    for name in "abc":
        assert cache.put(name, A, usable=40)
    assert dropped == ["a"] and list(cache.kept) == ["b", "c"]
    assert cache.put("d", A, usable=40, cost=90)  # a session of its own counts its whole context
    assert dropped == ["a", "b", "c"] and list(cache.kept) == ["d"]


def test_helpers():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    assert 0 < default_prefix_cache_mb() <= 1024


class Lengths:
    """A session that keeps only its length."""

    vocab_size, max_length = 300, 512

    def __init__(self):
        self.n = 0

    def __len__(self):
        return self.n

    def feed(self, ids, rows=None):
        import torch

        self.n += len(ids)
        return torch.zeros(rows or len(ids), self.vocab_size)

    def rollback(self, n):
        self.n = n


def test_batch_rows_are_kept_taken_and_given_up():
    batch = SerialBatch(Lengths, max_rows=2)
    batch.keep_tokens = 100
    view = RowView(batch, A)
    view.feed(A + [1, 2])  # the answer's tokens, two past what its output kept
    view.keep(A + [1], usable=41)
    assert batch.rows_taken() == 1 and batch.length(view.row) == 41  # cut to what it holds
    warm = RowView(batch, A + [1, 5, 6])
    assert warm.row == view.row and len(warm) == 41  # reads only [5, 6]
    warm.close()
    # every row taken by kept ones: the least recently kept is given up for a fresh row
    first, second = RowView(batch, A), RowView(batch, [9] * 5)
    first.feed(A), second.feed([9] * 5)
    first.keep(A, 40), second.keep([9] * 5, 5)
    fresh = RowView(batch, [7] * 30)
    assert fresh.row == first.row and len(fresh) == 0 and list(batch.prefixes.kept) == [second.row]
    batch.keep_tokens = 0  # off: a row that leaves is removed
    fresh.feed([7] * 30)
    fresh.keep([7] * 30, 30)
    assert batch.rows_taken() == 1


@pytest.fixture(scope="module")
def smollm2():
    require_llamacpp()
    return require_model("smollm2-135m")


def test_a_warm_turn_reads_only_its_new_tokens_and_exact_output_is_identical(smollm2):
    """llama.cpp, exact: the second turn holds the first turn's whole prompt pieces (a multiple of
    PREFILL_CHUNK) and answers token for token as a cold decoder; not exact, it holds the whole
    shared prefix, answer included."""
    from anydraft import Decoder

    first = "Summarize this log in one line.\n" + "\n".join(f"line {i}: worker {i % 7} ok" for i in range(60))
    warm_dec = Decoder(smollm2, backend="llamacpp", exact=True)
    cold_dec = Decoder(smollm2, backend="llamacpp", exact=True, prefix_cache_mb=0)
    turn1 = warm_dec.generate(first, 12, temperature=0, chat=False)
    assert turn1.stats["cached_tokens"] == 0 and turn1.stats["prompt_tokens"] > PREFILL_CHUNK
    second = first + turn1.text + "\nAnd in one word?"
    warm, cold = (d.generate(second, 12, temperature=0, chat=False) for d in (warm_dec, cold_dec))
    assert warm.stats["cached_tokens"] == PREFILL_CHUNK * ((turn1.stats["prompt_tokens"] - 1) // PREFILL_CHUNK)
    assert cold.stats["cached_tokens"] == 0
    assert warm.token_ids == cold.token_ids, (warm.text, cold.text)

    loose = Decoder(smollm2, backend="llamacpp", exact=False)
    again = loose.generate(first, 12, temperature=0, chat=False)
    then = loose.generate(first + again.text + "\nAnd in one word?", 4, temperature=0, chat=False)
    assert then.stats["cached_tokens"] >= again.stats["prompt_tokens"]  # the prompt and more


def test_generate_batch_keeps_its_rows_across_calls(smollm2):
    from anydraft import Decoder

    dec = Decoder(smollm2, backend="llamacpp", exact=False)
    prompts = [f"Tell me about the number {n}, with care and in detail." for n in (3, 4)]
    first = dec.generate_batch(prompts, 6, temperature=0, chat=False)
    assert [o.stats["cached_tokens"] for o in first] == [0, 0]
    later = dec.generate_batch([p + o.text + " More." for p, o in zip(prompts, first, strict=True)], 4,
                               temperature=0, chat=False)
    assert all(o.stats["cached_tokens"] >= f.stats["prompt_tokens"] for o, f in zip(later, first, strict=True))
    off = Decoder(smollm2, backend="llamacpp", exact=False, prefix_cache_mb=0)
    off.generate_batch(prompts, 2, temperature=0, chat=False)
    assert off.generate_batch(prompts, 2, temperature=0, chat=False)[0].stats["cached_tokens"] == 0


def test_a_failed_generation_keeps_nothing():
    from anydraft.decoding.loop import Generation

    class Session:
        exact, closed = False, False

        def __len__(self):
            return 5

        def close(self):
            self.closed = True

    kept = []
    g = Generation.__new__(Generation)
    g.row, g.prompt_tokens, g.keep = None, 5, lambda *a: kept.append(a)
    g.state = type("S", (), {"target": Session(), "committed": [1, 2, 3, 4, 5, 6]})()
    g.error = RuntimeError("its step failed")
    g.leave()
    assert g.state.target.closed and not kept
    g.state.target, g.error = Session(), None
    g.leave()
    assert kept and kept[0][1:] == ([1, 2, 3, 4, 5], 5)


@pytest.mark.parametrize("engine", ["llamacpp", "ik"])
def test_a_shared_system_prompt_is_copied_into_a_fresh_row(smollm2, engine):
    """llama.cpp's unified cache: a new conversation sharing only a kept row's system prompt
    starts a fresh row holding that prompt (no read), scores as a cold row does (to the
    rounding of a batch, tests/models/test_llamacpp_batch.py), and the kept row still serves
    its own conversation's next turn."""
    require_llamacpp(engine)
    from anydraft.models.engines import ENGINES
    from anydraft.models.llamacpp import LlamaCppBatch, LlamaCppModel
    from anydraft.models.loading import resolve
    from tests.models.test_batch import same
    from tests.models.test_llamacpp_batch import MARGIN, TOL

    source = resolve(smollm2)
    model = LlamaCppModel(source.name, f"{source.path}/{source.gguf_file}", context=512, engine=ENGINES[engine])
    batch = LlamaCppBatch(model, max_rows=3)
    batch.keep_tokens = 10_000
    system, a, b = list(range(200, 230)), list(range(300, 340)), list(range(400, 430))
    first = RowView(batch, system + a)
    first.feed(system + a, 1)
    first.keep(system + a, len(system + a))
    warm = RowView(batch, system + b)
    assert warm.row != first.row and len(warm) == len(system)  # copied, not taken: 30 of 70
    got = warm.feed(b, len(b))
    cold = RowView(batch)
    same(got, cold.feed(system + b, len(b)), TOL, MARGIN)
    warm.close(), cold.close()
    again = RowView(batch, system + a + [7, 8])
    assert again.row == first.row and len(again) == len(system + a)  # its own turn, whole
