"""Decoding several prompts together (`Decoder.generate_batch`, `decoding.loop.decode_batch`):
each prompt's output is exactly what `generate` gives it alone, while every step scores all
unfinished prompts in one call of the target's batch (models/batch.py)."""

from __future__ import annotations

import pytest

from anydraft import Decoder
from anydraft.errors import AnydraftError
from anydraft.models.batch import Rows, SerialBatch
from tests.helpers import byte_tokenizer, tiny_llama

PROMPTS = ["abc", "the quick brown fox jumps over the lazy dog " * 6, "def f(x):", "ab ab ab ab"]


class Counting(SerialBatch):
    """A `SerialBatch` that records the rows of every call."""

    calls: list[list[int]]

    def feed_rows(self, feeds, rows):
        self.calls.append(sorted(feeds))
        return super().feed_rows(feeds, rows)


class Sizes(SerialBatch):
    """A `SerialBatch` that records each call's tokens per row into ``sizes``."""

    def __init__(self, sizes: list[dict[int, int]], *args):
        super().__init__(*args)
        self.sizes = sizes

    def feed_rows(self, feeds, rows):
        self.sizes.append({row: len(ids) for row, ids in feeds.items()})
        return super().feed_rows(feeds, rows)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def decoders(tok):
    """Fixed draft lengths: the adaptive policy chooses them from timings, and seeded sampling
    repeats its draws only where the draft lengths repeat (greedy output does either way). No
    prefix cache: each call's batch and reads are what these tests count (it has its own,
    tests/models/test_prefix.py)."""
    target, drafter = tiny_llama(len(tok), seed=0), tiny_llama(len(tok), seed=1)
    off = {"prefix_cache_mb": 0}
    return {
        "ar": Decoder(target=target, tokenizer=tok, method="ar", **off),
        "sd": Decoder(target=target, tokenizer=tok, drafter=drafter, drafter_tokenizer=tok,
                      method="sd", num_draft_tokens=4, adaptive=False, **off),
        "lookup": Decoder(target=target, tokenizer=tok, method="lookup", adaptive=False, **off),
        "auto": Decoder(target=target, tokenizer=tok, drafter=drafter, drafter_tokenizer=tok, **off),
    }


def counted(decoder, monkeypatch, model=None) -> list[list[int]]:
    """The rows of every call of ``model``'s batches (default: the target's)."""
    model = decoder.target if model is None else model
    calls: list[list[int]] = []

    def new_batch(max_rows):
        batch = Counting(model.new_session, max_rows)
        batch.calls = calls
        return batch

    monkeypatch.setattr(model, "new_batch", new_batch)
    return calls


@pytest.mark.parametrize("method", ["ar", "sd", "lookup"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 7}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}])
def test_each_prompt_gets_what_it_gets_alone(decoders, method, sampling, monkeypatch):
    decoder = decoders[method]
    calls = counted(decoder, monkeypatch)
    # one prompt stops at a stop string and leaves early; the others go on to the budget
    outs = decoder.generate_batch(PROMPTS, 20, chat=False, stop=["zz"], **sampling)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        alone = decoder.generate(prompt, 20, chat=False, stop=["zz"], **sampling)
        assert (out.token_ids, out.text, out.finish_reason) == (alone.token_ids, alone.text, alone.finish_reason)
        assert out.stats["new_tokens"] == alone.stats["new_tokens"]
    # every step scored the unfinished prompts in one call: the first call holds all four
    assert calls[0] == [0, 1, 2, 3] and len(calls) <= max(o.stats["target_calls"] for o in outs)


def test_adaptive_greedy_too(decoders):
    outs = decoders["auto"].generate_batch(PROMPTS, 24, chat=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == decoders["ar"].generate(prompt, 24, chat=False).token_ids


def test_a_prompt_that_finishes_leaves_and_the_others_go_on(decoders, monkeypatch):
    decoder = decoders["ar"]
    stop = decoder.generate(PROMPTS[0], 30, chat=False).text[2:5]  # early in the first answer
    assert len(stop) == 3
    calls = counted(decoder, monkeypatch)
    outs = decoder.generate_batch(PROMPTS, 30, chat=False, stop=[stop])
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == decoder.generate(prompt, 30, chat=False, stop=[stop]).token_ids
    assert outs[0].finish_reason == "stop" and "length" in {o.finish_reason for o in outs}
    assert calls[0] == [0, 1, 2, 3] and 0 not in calls[-1]  # it left; the others went on


def test_bad_prompt_lists_are_refused(decoders):
    for bad in ([], "abc", None):
        with pytest.raises(AnydraftError, match="non-empty list of prompts"):
            decoders["ar"].generate_batch(bad, 5)
    with pytest.raises(AnydraftError, match="prompt is empty"):
        decoders["ar"].generate_batch(["abc", "  "], 5, chat=False)


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_one_forward_pass_for_all_rows_gives_the_same(decoders, method):
    """The tiny torch target's own batch (`TorchBatch`: one forward pass, rows packed) against
    each prompt alone, greedy and seeded sampling."""
    from anydraft.models.rows import TorchBatch

    decoder = decoders[method]
    assert isinstance(decoder.target.new_batch(2), TorchBatch)
    for sampling in ({}, {"temperature": 1.0, "seed": 5}):
        outs = decoder.generate_batch(PROMPTS, 20, chat=False, **sampling)
        for prompt, out in zip(PROMPTS, outs, strict=True):
            assert out.token_ids == decoder.generate(prompt, 20, chat=False, **sampling).token_ids


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_at_most_max_batch_rows_and_the_next_joins_as_one_leaves(decoders, method, monkeypatch):
    decoder = decoders[method]
    stop = decoder.generate(PROMPTS[0], 30, chat=False).text[2:5]  # prompt 0 leaves early
    calls = counted(decoder, monkeypatch)
    outs = decoder.generate_batch(PROMPTS, 30, chat=False, stop=[stop], max_batch=2)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == decoder.generate(prompt, 30, chat=False, stop=[stop]).token_ids
    assert calls[0] == [0, 1] and max(len(c) for c in calls) == 2
    # prompt 2 took prompt 0's row while prompt 1 was still decoding
    assert outs[0].finish_reason == "stop" and [0, 1] in calls[len(outs[0].token_ids):]
    with pytest.raises(AnydraftError, match="max_batch must be a positive integer"):
        decoder.generate_batch(PROMPTS, 5, max_batch=0)


def test_a_joining_prompt_rides_in_the_calls_of_the_rows_decoding(decoders, monkeypatch):
    """While a row decodes, a joining prompt is read inside its calls, `prefill_budget` tokens
    at a time, never in a call of its own that the row would wait for; the outputs stay exact."""
    from anydraft.planning import call as call_module

    decoder = decoders["ar"]
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[1]]  # the long prompt joins when the first leaves
    stop = decoder.generate(prompts[0], 30, chat=False).text[2:5]
    sizes: list[dict[int, int]] = []

    monkeypatch.setattr(decoder.target, "new_batch", lambda n: Sizes(sizes, decoder.target.new_session, n))
    monkeypatch.setattr(call_module, "prefill_budget", lambda curve, tokens, min_prefill: 16)
    outs = decoder.generate_batch(prompts, 30, chat=False, stop=[stop], max_batch=2)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == decoder.generate(prompt, 30, chat=False, stop=[stop]).token_ids
    # from the first call of both rows until prompt 1 (row 1) leaves, every call holds row 1:
    # the long prompt (row 0, after prompt 0 left) was read 16 tokens a call inside them
    first = next(i for i, s in enumerate(sizes) if len(s) == 2)
    last = max(i for i, s in enumerate(sizes) if 1 in s)
    assert all(1 in s for s in sizes[first:last + 1])
    assert sum(s.get(0) == 16 for s in sizes[first:last + 1]) >= 2


def test_prefill_budget_follows_the_cost_curve():
    from anydraft.models.session import PREFILL_CHUNK
    from anydraft.planning.call import prefill_budget
    from anydraft.planning.settings import SETTINGS

    assert prefill_budget(None, 4) == PREFILL_CHUNK  # nothing measured: a whole chunk
    assert prefill_budget(lambda n: 1.0, 4) == PREFILL_CHUNK  # flat: a chunk rides for free
    # 1.5 x T(1) = 1.515 s holds 51 tokens: 47 beside the step's 4
    assert prefill_budget(lambda n: 1.0 + 0.01 * n, 4) == 47
    assert prefill_budget(lambda n: 0.2 + 0.02 * n, 4) == SETTINGS.min_prefill  # steep: the floor
    assert prefill_budget(lambda n: 0.2 + 0.02 * n, 4, min_prefill=4) == 4  # `anydraft serve --min-read`


def steep_batch(decoder, monkeypatch, max_rows: int, min_prefill: int):
    """``(sizes, rows, batch, first)``: a `Batch` of up to ``max_rows`` rows on a steep curve
    (every token costs a call: reads beside a decoding row get the ``min_prefill`` floor),
    each call's tokens per row recorded in ``sizes``, and a first generation (``PROMPTS[0]``)
    that has read its prompt alone and decodes."""
    from anydraft.decoding import Batch

    sizes: list[dict[int, int]] = []
    monkeypatch.setattr(decoder.estimates.costs, "profile", {m: 0.1 * m for m in (1, 2, 5, 9, 17, 33)})
    rows = Rows(Sizes(sizes, decoder.target.new_session, max_rows), None)
    batch = Batch(min_prefill=min_prefill)
    first = decoder.start(PROMPTS[0], 12, rows=rows, chat=False)
    batch.join(first)
    batch.run_once()
    return sizes, rows, batch, first


def test_a_batchs_min_prefill_reaches_every_step(decoders, monkeypatch):
    """`Batch(min_prefill)` (the server's ``--min-read``) is the floor of every step's prompt
    reads: a joining prompt beside a decoding row is read that many tokens a call on a steep
    curve, and the outputs stay exact."""
    decoder = decoders["ar"]
    sizes, rows, batch, first = steep_batch(decoder, monkeypatch, 2, min_prefill=5)
    second = decoder.start(PROMPTS[2], 12, rows=rows, chat=False)
    batch.join(second)
    while batch:
        batch.run_once()
    reads = [s[second.state.target.row] for s in sizes if len(s) == 2 and s[second.state.target.row] > 1]
    assert reads and all(n == 5 for n in reads[:-1]) and reads[-1] <= 5
    for g, prompt in ((first, PROMPTS[0]), (second, PROMPTS[2])):
        assert g.result()[1].token_ids == decoder.generate(prompt, 12, chat=False).token_ids


def test_a_crowd_of_joiners_is_read_a_whole_chunk_a_call(decoders, monkeypatch):
    """Where more requests wait to join than decode, a call reads a whole `PREFILL_CHUNK` of
    their prompts whatever the curve allows; once the decoding rows are as many, the floor
    again. The outputs stay exact."""
    decoder = decoders["ar"]
    sizes, rows, batch, first = steep_batch(decoder, monkeypatch, 4, min_prefill=2)
    crowd = [decoder.start(p, 12, rows=rows, chat=False) for p in (PROMPTS[2], PROMPTS[1])]
    for g in crowd:
        batch.join(g)
    unread = {g.state.target.row: len(g.state.pending) - 1 for g in crowd}
    batch.run_once()  # one row decodes, two wait: both prompts read whole (under a chunk)
    assert {row: sizes[-1][row] for row in unread} == unread and max(unread.values()) > 2
    late = decoder.start(PROMPTS[3], 12, rows=rows, chat=False)
    batch.join(late)
    while batch:
        batch.run_once()
    reads = [s[late.state.target.row] for s in sizes if len(s) > 1 and s.get(late.state.target.row, 0) > 1]
    assert reads and reads[0] == 2  # three decode, one joins: the floor
    for g, prompt in zip([first, *crowd, late], (PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]), strict=True):
        assert g.result()[1].token_ids == decoder.generate(prompt, 12, chat=False).token_ids


def test_an_exact_batch_reads_a_joining_prompt_as_a_request_alone(tok, monkeypatch):
    """Beside a decoding row, an exact batch reads a joining prompt `PREFILL_CHUNK` tokens a
    call, whatever `prefill_budget` allows: the pieces a request alone is read in
    (decoding/loop.py `prefill`), so its prompt positions are computed by the same calls."""
    from anydraft.decoding import Batch
    from anydraft.models.session import PREFILL_CHUNK
    from anydraft.planning import call as call_module

    decoder = Decoder(target=tiny_llama(len(tok), max_positions=1024), tokenizer=tok, method="ar",
                      prefix_cache_mb=0)
    sizes: list[dict[int, int]] = []
    monkeypatch.setattr(call_module, "prefill_budget", lambda curve, tokens, min_prefill: 5)
    rows = Rows(Sizes(sizes, decoder.target.new_session, 2, True), None)
    batch = Batch()
    first = decoder.start(PROMPTS[0], 12, rows=rows, chat=False)
    batch.join(first)
    batch.run_once()
    long_prompt = "".join(chr(97 + i * 7 % 26) for i in range(320))  # 320 tokens: two pieces
    second = decoder.start(long_prompt, 12, rows=rows, chat=False)
    batch.join(second)
    while batch:
        batch.run_once()
    reads = [s[second.state.target.row] for s in sizes if len(s) == 2 and s[second.state.target.row] > 1]
    n = len(decoder.prompt_ids(long_prompt, chat=False))
    assert reads == [PREFILL_CHUNK, n - 1 - PREFILL_CHUNK]  # the last prompt token: the first step's
    assert second.result()[1].token_ids == decoder.generate(long_prompt, 12, chat=False).token_ids


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 7}])
def test_the_drafters_of_a_batch_draft_in_one_call(decoders, sampling, monkeypatch):
    """Each drafting pass of every row drafting is one call of the drafter's batch
    (`step.draft_together`); each row drafts, and so decodes, exactly as alone."""
    decoder = decoders["sd"]
    calls = counted(decoder, monkeypatch, decoder.drafter)
    outs = decoder.generate_batch(PROMPTS, 20, chat=False, **sampling)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == decoder.generate(prompt, 20, chat=False, **sampling).token_ids
    assert calls[0] == [0, 1, 2, 3] and sum(len(c) == 4 for c in calls) >= 4  # k = 4: a pass each


def test_rows_drafting_together_are_measured_with_the_calls_backlog(decoders, monkeypatch):
    """The first pass of a drafter batch reads every drafting row's backlog: each row's step is
    measured as reading the call's whole backlog, so a row whose own backlog was one token does
    not take the others' reading for the price of a pass (it priced drafting 5x too dear)."""
    import anydraft.decoding.step as step_module
    from anydraft.planning.policy import Policy

    seen, observed = [], []
    draft_together, observe = step_module.draft_together, Policy.observe

    def spy(rows, choices, *failed):
        drafts, reads = draft_together(rows, choices, *failed)
        seen.append(({i: rows[i].drafter.caught_up for i in drafts}, reads))
        return drafts, reads

    def recording(policy, choice, step):
        observed.append(step.read)
        observe(policy, choice, step)

    monkeypatch.setattr(step_module, "draft_together", spy)
    monkeypatch.setattr(Policy, "observe", recording)
    decoders["sd"].generate_batch(PROMPTS, 12, chat=False)
    own, reads = seen[0]  # the first step: every drafter reads its prompt
    assert len(own) == 4 and min(own.values()) < 10 < max(own.values())
    assert reads == {i: 1 + sum(n - 1 for n in own.values()) for i in own}
    assert observed[:4] == list(reads.values())


@pytest.mark.parametrize("copies", [2, 6])
def test_drafters_of_one_call_share_their_prompt_reads(decoders, monkeypatch, copies):
    """Adaptive rows that join together do not each have their drafters read as much of their
    prompts as alone in one step (every row would wait for all the reads): they share one
    read's worth (at most the drafter's context, 64 tokens), each at least PROBE_READ, so
    that more readers than it holds take turns; outputs equal plain decoding alone."""
    import anydraft.decoding.step as step_module
    from anydraft.planning import call as call_module
    from anydraft.planning.policy import Choice, Policy
    from anydraft.planning.settings import SETTINGS

    PROBE_READ = SETTINGS.probe_read

    prompts = ["the quick brown fox jumps over the lazy dog " * 2] * copies + PROMPTS[1:3]
    alone = [decoders["ar"].generate(prompt, 16, chat=False).token_ids for prompt in prompts]
    # every row wants 2 drafts each step, whatever the timings say
    monkeypatch.setattr(Policy, "choose", lambda self, state, drafter=None, match=0: Choice(
        "draft", 2, 64, self.draft, True))
    monkeypatch.setattr(call_module, "allocate", lambda bids: [bid.choice.k for bid in bids])
    monkeypatch.setattr(call_module, "read_size", lambda costs, context: 64)  # a read's worth
    monkeypatch.setattr(SETTINGS, "evidence", 0.0)  # every row drafts from the first step
    reads, readers = [], set()
    choose = step_module.plan

    def spy(rows, groups):
        choices = choose(rows, groups)
        long = [(row, c) for row, c in zip(rows, choices, strict=True)
                if c.proposer == "draft" and c.k and row.drafter.behind > PROBE_READ]
        reads.append([c.read for _, c in long])
        readers.update(id(row) for row, _ in long)
        return choices

    monkeypatch.setattr(step_module, "plan", spy)
    outs = decoders["auto"].generate_batch(prompts, 16, chat=False)
    assert [out.token_ids for out in outs] == alone
    # three read at once, 64 // 3 tokens each; of seven, 64 // PROBE_READ = 4 read at once,
    # PROBE_READ each, and the other three next
    assert reads[0] == ([64 // 3] * 3 if copies == 2 else [PROBE_READ] * 4)
    assert len(readers) == copies + 1 and all(sum(r) <= 64 for r in reads)


def test_rows_of_one_call_draft_one_at_a_time_on_little_evidence_and_wait_once():
    """`_confirm`: while the pair's first-position acceptance rests on fewer than `evidence`
    observations, one adaptive row of a call drafts (a probe's lucky drafts would otherwise
    have every row draft at once); with enough evidence, all keep their drafts; fixed draft
    lengths are never cut. `_wait_once`: rows that sat out count one step towards a probe."""
    from types import SimpleNamespace

    from anydraft.planning import call as call_module
    from anydraft.planning.estimates import Acceptance, Mean
    from anydraft.planning.policy import Choice
    from anydraft.planning.settings import SETTINGS

    def rows_choices(weight, adaptive=(True, True, True)):
        acc = Acceptance()
        acc.positions = [Mean(0.9, weight)]
        rows = [SimpleNamespace(policy=SimpleNamespace(adaptive=a)) for a in adaptive]
        return acc, rows, [Choice("draft", 4, 0, acc, True) for _ in rows]

    acc, rows, choices = rows_choices(SETTINGS.evidence / 2)
    call_module._confirm(rows, choices, [0, 1, 2])
    assert [c.k for c in choices] == [4, 0, 0] and choices[1].waited == (acc,)
    acc, rows, choices = rows_choices(SETTINGS.evidence)
    call_module._confirm(rows, choices, [0, 1, 2])
    assert [c.k for c in choices] == [4, 4, 4]
    acc, rows, choices = rows_choices(0.0, adaptive=(True, False, True))
    call_module._confirm(rows, choices, [0, 1, 2])
    assert [c.k for c in choices] == [4, 4, 0]

    other = Acceptance()
    choices = [Choice("plain", 0, waited=(acc,)), Choice("copy", 2, waited=(acc, other)),
               Choice("plain", 0, waited=(acc, other))]
    call_module._wait_once(choices, [0, 1, 2])
    assert [c.waited for c in choices] == [(acc,), (other,), ()]


class Poisoned:
    """Sampling settings whose distributions fail after ``after`` of them (a row's own failure:
    its verifier, or its drafter's sampling, raises in a step shared with other rows)."""

    def __init__(self, params, after: int):
        self.params, self.left = params, after

    def __getattr__(self, name):
        return getattr(self.params, name)

    def probs(self, logits):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("probability tensor contains inf/nan")
        return self.params.probs(logits)

    def choose(self, logits, generator):
        from anydraft.sampling import SamplingParams

        return SamplingParams.choose(self, logits, generator)  # through the poisoned `probs`


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_a_row_that_fails_ends_alone_and_the_others_go_on(decoders, method):
    """Issue 42: one request's failure in a shared step failed every row of the batch."""
    from anydraft.decoding import Batch
    from anydraft.sampling import SamplingParams

    decoder = decoders[method]
    params = SamplingParams(temperature=1.0, seed=11)
    rows, batch = decoder.new_rows(len(PROMPTS)), Batch()
    generations = [decoder.start(p, 20, rows=rows, chat=False, sampling=params) for p in PROMPTS]
    generations[1].state.params = Poisoned(params, after=3)
    for g in generations:
        batch.join(g)
    while batch:
        batch.run_once()  # raises nothing: the failure is the row's
    with pytest.raises(RuntimeError, match="inf/nan"):
        generations[1].result()
    assert generations[1].finish.reason == "error"
    for i in (0, 2, 3):
        alone = decoder.generate(PROMPTS[i], 20, chat=False, sampling=params)
        assert generations[i].result()[1].token_ids == alone.token_ids


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_n_completions_of_each_prompt_are_rows_of_one_batch(decoders, method, monkeypatch):
    """``n``: each prompt's completions decode together, completion j with its own seed
    (`SamplingParams.for_choice`), each what `generate` gives alone with that seed, the
    first with the request's; their log-probabilities as alone."""
    from anydraft.sampling import SamplingParams

    decoder = decoders[method]
    calls = counted(decoder, monkeypatch)
    params = SamplingParams(temperature=1.0, seed=11)
    outs = decoder.generate_batch(PROMPTS[:2], 12, chat=False, sampling=params, n=3, logprobs=1)
    assert len(outs) == 6 and calls[0] == [0, 1, 2, 3, 4, 5]
    for i, out in enumerate(outs):
        alone = decoder.generate(PROMPTS[i // 3], 12, chat=False, logprobs=1,
                                 sampling=params.for_choice(i % 3))
        assert out.token_ids == alone.token_ids
        assert [e.token for e in out.logprobs] == out.token_ids
        assert [e.logprob for e in out.logprobs] == pytest.approx([e.logprob for e in alone.logprobs], abs=1e-5)
    assert outs[0].token_ids == decoder.generate(PROMPTS[0], 12, chat=False, sampling=params).token_ids
    assert len({tuple(o.token_ids) for o in outs[:3]}) == 3  # distinct streams
    with pytest.raises(AnydraftError, match="n must be a positive integer"):
        decoder.generate_batch(PROMPTS, 5, n=0)



@pytest.mark.parametrize("fails", ["method", "drafter"])
def test_a_request_that_fails_to_start_gives_its_rows_back(decoders, fails, monkeypatch):
    """A generation whose method or drafter cannot be made leaves no row taken, without
    waiting for the garbage collector (issue 61: its rows stayed taken, and a full batch
    answered "all rows are taken")."""
    import gc

    from anydraft.decoding import Batch
    from anydraft.methods import pairing

    decoder = decoders["sd"]
    rows = decoder.new_rows(1)
    broken = {"method": (decoder, "_method_factory"), "drafter": (pairing, "Drafter")}[fails]

    def fail(*args, **kwargs):
        raise RuntimeError("cannot start")

    gc.disable()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(*broken, fail)
            if fails == "method":
                with pytest.raises(RuntimeError, match="cannot start"):
                    decoder.start(PROMPTS[0], 4, rows=rows, chat=False)
            else:  # the drafter starts once the prompt is read: the generation fails alone
                generation, batch = decoder.start(PROMPTS[0], 4, rows=rows, chat=False), Batch()
                batch.join(generation)
                while batch:
                    batch.run_once()
                with pytest.raises(RuntimeError, match="cannot start"):
                    generation.result()
        assert not rows.target.lengths and not rows.drafter.lengths
    finally:
        gc.enable()
    generation = decoder.start(PROMPTS[0], 4, rows=rows, chat=False)
    batch = Batch()
    batch.join(generation)
    while batch:
        batch.run_once()
    assert generation.result()[1].token_ids == decoder.generate(PROMPTS[0], 4, chat=False).token_ids
