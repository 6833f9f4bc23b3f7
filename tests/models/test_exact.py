"""Exact scoring (models/exact.py, docs/exact.md): a position's logits are bitwise equal to the
same position scored alone, one token per call, whatever its call: a draft of any length,
beside other rows of a batch (reading prompts or scoring drafts), after the same prompt read,
on 1 or 2 threads. And so greedy output of every method, alone and in a batch, is
token-identical to plain decoding."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft import Decoder
from anydraft.errors import AnydraftError
from anydraft.models import threads
from anydraft.models.loaded import LoadedModel
from anydraft.models.rows import TorchBatch
from tests.conftest import require_llamacpp, require_model
from tests.helpers import tiny_llama

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))


def alone(new_session, prompt: list[int], cont: list[int]) -> list[torch.Tensor]:
    """Each of ``cont``'s positions scored one token per call after ``prompt``: plain decoding."""
    session = new_session()
    session.feed(prompt, 1)
    return [session.feed([t], 1)[0] for t in cont]


def in_calls(batch, prompt: list[int], cont: list[int], drafts: list[int], mates: int,
             rng: random.Random, vocab: int) -> list[torch.Tensor]:
    """``cont``'s positions scored in calls of ``drafts[i] + 1`` tokens in ``batch``, beside
    ``mates`` other rows that read random tokens or score random drafts in every call; the
    prompt read in one piece, as alone (every path reads a prompt in the same pieces)."""
    row, others = batch.add_row(), [batch.add_row() for _ in range(mates)]

    def noise():
        return {o: [rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for o in others}

    feeds = {row: prompt} | noise()
    batch.feed_rows(feeds, {r: 1 if r == row else rng.choice([1, len(ids)]) for r, ids in feeds.items()})
    got, at, i = [], 0, 0
    while at < len(cont):
        chunk = cont[at:at + drafts[i % len(drafts)] + 1]
        feeds = {row: chunk} | noise()
        wanted = {r: len(ids) if r == row else rng.choice([1, len(ids)]) for r, ids in feeds.items()}
        got += list(batch.feed_rows(feeds, wanted)[row])
        at, i = at + len(chunk), i + 1
    return got


def check(exact: LoadedModel, seed: int, drafts: list[int], mates: int, vocab: int) -> None:
    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
    cont = [rng.randrange(vocab) for _ in range(10)]
    ref = alone(exact.new_session, prompt, cont)
    got = in_calls(exact.new_batch(mates + 1), prompt, cont, drafts, mates, rng, vocab)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(request):
    model = tiny_llama(300, max_positions=1024).to(getattr(torch, request.param))
    return LoadedModel("tiny", model, None, request.param).make_exact()


@SETTINGS
@given(seed=st.integers(0, 10**6), drafts=st.lists(st.integers(0, 12), min_size=1, max_size=4),
       mates=st.integers(0, 3), threads_now=st.sampled_from([1, 2]))
def test_torch_positions_score_alike_in_any_call(tiny, monkeypatch_threads, seed, drafts, mates, threads_now):
    monkeypatch_threads(threads_now)
    check(tiny, seed, drafts, mates, 300)


class Shifty(torch.nn.Linear):
    """A layer whose rows change with the rows of its call, as a kernel chosen by M may."""

    def forward(self, x):
        return super().forward(x) + len(x) * 1e-3


def test_a_layer_whose_rows_change_with_the_call_keeps_its_tiles():
    """`uniform` says no for such a layer, and `TiledLinear` then multiplies tiles of `TILE`
    rows: a row's result stays what it is alone; a plain layer (uniform here or not) agrees
    with its tiles either way."""
    from anydraft.models import exact as exact_scoring

    shifty, plain = Shifty(16, 8), torch.nn.Linear(16, 8)
    assert not exact_scoring.uniform(shifty)
    x = torch.randn(21, 16)
    for layer in (shifty, plain):
        wrapped = exact_scoring.TiledLinear(layer)
        with torch.inference_mode(), exact_scoring.tiled():
            got = wrapped(x)
            alone = torch.cat([wrapped(x[i:i + 1]) for i in range(len(x))])
        assert torch.equal(got, alone)


@pytest.fixture
def monkeypatch_threads(monkeypatch):
    """Set the free cores a non-exact call would take (an exact one takes the process's)."""
    return lambda n: monkeypatch.setattr(threads, "free_cores", lambda: n)


def test_without_exact_the_shape_of_a_call_changes_the_logits():
    """The reason for all this, on the tiny model: float32 logits of one position differ
    between a call of 1 token and one of 9 (plain TorchBatch, not exact)."""
    model = tiny_llama(300, max_positions=1024)
    cont = list(range(10, 19))
    plain = TorchBatch(model, 1)
    row = plain.add_row()
    together = plain.feed_rows({row: cont}, {row: 9})[row]
    plain.rollback(row, 0)
    one = [plain.feed_rows({row: [t]}, {row: 1})[row][0] for t in cont]
    assert not all(torch.equal(a, b) for a, b in zip(one, together, strict=True))


def test_paths_that_cannot_score_exactly_are_refused_by_name():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    loaded = LoadedModel("gemma-like", Gemma3ForCausalLM(config).eval(), None, "float32")
    with pytest.raises(AnydraftError, match="exact scoring is not available.*runs on the torch backend"):
        loaded.make_exact()
    with pytest.raises(AnydraftError, match="exact must be True, False or .auto."):
        Decoder("null:smollm2-135m", exact="yes")


# -- real models ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_bf16():
    from anydraft.models.backends import load

    require_model("smollm2-135m")
    return load("smollm2-135m", "torch", dtype="bfloat16").make_exact()


@pytest.mark.real
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), drafts=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       mates=st.integers(0, 2))
def test_smollm2_bfloat16_positions_score_alike_in_any_call(smollm2_bf16, seed, drafts, mates):
    check(smollm2_bf16, seed, drafts, mates, 49152)


@pytest.fixture(scope="module")
def qwen_llamacpp():
    import os

    from anydraft.models.llamacpp import LlamaCppModel
    from anydraft.models.loading import resolve

    require_llamacpp()
    source = resolve(require_model("qwen2.5-coder-0.5b"))
    # a short context: every row of a test batch allocates one
    model = LlamaCppModel(source.name, os.path.join(source.path, source.gguf_file), context=512)
    return LoadedModel(source.name, model, None)


@pytest.mark.real
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), drafts=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       mates=st.integers(0, 1))
def test_llamacpp_positions_score_alike_in_any_call(qwen_llamacpp, monkeypatch_threads, seed, drafts, mates):
    """Qwen2.5-0.5B's GGUF, whose plain sessions round with the size of a call (below)."""
    exact = LoadedModel(qwen_llamacpp.name, qwen_llamacpp.model, None).make_exact()
    monkeypatch_threads(1 + seed % 2)
    check(exact, seed, drafts, mates, 151_000)


@pytest.mark.real
def test_llamacpp_plain_sessions_round_with_the_call(qwen_llamacpp):
    rng = random.Random(0)
    prompt, cont = [rng.randrange(151_000) for _ in range(20)], [rng.randrange(151_000) for _ in range(6)]
    ref = alone(qwen_llamacpp.new_session, prompt, cont)
    session = qwen_llamacpp.new_session()
    session.feed(prompt, 1)
    assert not all(torch.equal(a, b) for a, b in zip(ref, session.feed(cont), strict=True))


PROMPTS = ["Write a Python function that reverses a string.", "def fibonacci(n):"]


@pytest.mark.real
@pytest.mark.parametrize("target_backend", ["torch", "llamacpp"])
def test_greedy_output_of_every_method_is_plain_decoding(target_backend):
    """SmolLM2 exact (bfloat16 torch, or its GGUF on llama.cpp) with a SmolLM2 drafter on the
    other backend: every method, alone and in a batch of two, gives plain decoding's tokens."""
    require_model("smollm2-135m")
    if target_backend == "llamacpp":
        require_llamacpp()
    drafter_backend = "llamacpp" if target_backend == "torch" else "torch"
    dec = Decoder("smollm2-135m", "smollm2-135m", backend=target_backend,
                  dtype="bfloat16" if target_backend == "torch" else "auto",
                  drafter_backend=drafter_backend, exact=True,
                  drafter_dtype="float32" if drafter_backend == "torch" else None)
    plain = [dec.generate(p, max_new_tokens=20, method="ar").token_ids for p in PROMPTS]
    for method in ("lookup", "sd", "slem", "tli", "slrs"):
        assert [dec.generate(p, max_new_tokens=20, method=method).token_ids for p in PROMPTS] == plain, method
        batch = dec.generate_batch(PROMPTS, max_new_tokens=20, method=method)
        assert [out.token_ids for out in batch] == plain, method
    assert [out.token_ids for out in dec.generate_batch(PROMPTS, max_new_tokens=20, method="ar")] == plain


LONG = ("Explain, step by step and with an example for each, how a hash map handles collisions, "
        "how it grows, and what its operations cost. ") * 12  # ~300 tokens: two prompt pieces


@pytest.mark.real
@pytest.mark.parametrize("path", ["llamacpp", "torch"])
def test_every_method_scores_each_position_as_plain_decoding_after_a_long_prompt(path):
    """Exact, a prompt longer than one `PREFILL_CHUNK` (and than llama.cpp's `SPLIT_KEYS`):
    each method, alone and in a batch beside a short prompt, commits plain decoding's tokens
    with plain decoding's log-probabilities, bit for bit, so every position was scored as
    plain decoding scored it (tokens alone would hide a difference away from near ties).
    llama.cpp: Qwen2.5-0.5B's GGUF, whose calls of 4 or more tokens run other kernels (above);
    torch: SmolLM2 in bfloat16. The drafter is the target itself: every draft is accepted,
    so verifications are long."""
    if path == "llamacpp":
        require_llamacpp()
    name = "qwen2.5-coder-0.5b" if path == "llamacpp" else "smollm2-135m"
    require_model(name)
    dec = Decoder(name, name, backend=path, dtype="bfloat16" if path == "torch" else "auto",
                  drafter_backend="llamacpp" if path == "llamacpp" else "torch", exact=True)
    prompts = [LONG, "def fibonacci(n):"]

    def seen(outs):
        return [(o.token_ids, [t.logprob for t in o.logprobs]) for o in outs]

    opts = dict(max_new_tokens=16, logprobs=0, chat=False)
    plain = seen(dec.generate(p, method="ar", **opts) for p in prompts)
    for method in ("sd", "lookup"):
        assert seen(dec.generate(p, method=method, **opts) for p in prompts) == plain, method
        assert seen(dec.generate_batch(prompts, method=method, **opts)) == plain, method
