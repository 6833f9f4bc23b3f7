"""Log-probabilities (OpenAI's ``logprobs``): each committed token's, every method, exactly what
plain decoding reports for the same tokens: the target's processed distribution at the token's
position, read off the call that verified it."""

import math

import pytest
import torch

from anydraft.decoding import DecodeState, Finish, Generation, Stats, decode_batch
from anydraft.decoding.logprobs import TokenLogprob, token_logprobs
from anydraft.methods.ar import Autoregressive
from anydraft.sampling import SamplingParams

TOP = 3
# float32 logits of one position scored in calls of different lengths (the prompt alone, or
# with a step's candidates) differ by ~1e-5 (sums in another order): measured up to 1.9e-5 in
# log-probability on SmolLM2 at temperature 0.8, 7e-6 greedy. The report itself is exact
# (1e-12 on the toys, in float64).
FLOAT32_NOISE = 5e-5


def reference(session_logits, params, prompt, tokens, top=TOP):
    """Plain decoding's report: each token's position scored on its own."""
    logits = torch.stack([session_logits(tuple(prompt + tokens[:i])) for i in range(len(tokens))])
    return token_logprobs(params, logits, tokens, top)


def assert_logprobs_equal(got, want, tol):
    assert [g.token for g in got] == [w.token for w in want]
    for g, w in zip(got, want, strict=True):
        assert math.isfinite(g.logprob) and abs(g.logprob - w.logprob) <= tol, (g, w)
        assert len(g.top) == len(w.top)
        wanted = dict(w.top)
        for (gi, gv), (wi, wv) in zip(g.top, w.top, strict=True):
            assert abs(gv - wv) <= tol, (g.top, w.top)
            # the same alternative at each rank, but two that tie (within tol) may swap, and
            # one left out may tie the last one kept: its log-probability is wanted's there
            assert gi == wi or abs(wanted.get(gi, w.top[-1][1]) - gv) <= tol, (g.top, w.top)


def test_the_comparison_tells_a_wrong_alternative_from_a_tie():
    """`assert_logprobs_equal` once passed whatever ids the alternatives had (issue 61)."""
    want = [TokenLogprob(0, -0.5, [(0, -0.5), (1, -1.0), (2, -2.0)])]
    with pytest.raises(AssertionError):  # 1 and 2 swapped, their log-probabilities not
        assert_logprobs_equal([TokenLogprob(0, -0.5, [(0, -0.5), (2, -1.0), (1, -2.0)])], want, 1e-12)
    ties = [TokenLogprob(0, -0.5, [(0, -0.5), (1, -1.0), (2, -1.0)])]
    assert_logprobs_equal([TokenLogprob(0, -0.5, [(0, -0.5), (2, -1.0), (1, -1.0)])], ties, 1e-12)
    # an alternative left out of the reference, tied with its last
    assert_logprobs_equal([TokenLogprob(0, -0.5, [(0, -0.5), (1, -1.0), (3, -2.0)])], want, 1e-12)


@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.7, top_k=4),
                                      dict(temperature=0.0), dict(temperature=1.2, logit_bias={4: 2.0})],
                         ids=str)
@pytest.mark.parametrize("method", ["ar", "lookup", "sd", "slem", "tli", "slrs"])
def test_every_method_reports_the_targets_own_logprobs(toys, method, settings):
    params = SamplingParams(**settings)
    make = toys.make(method, num_draft_tokens=3)
    prompt, accepted = [1, 2, 1, 2], 0
    for seed in range(8):  # draws that accept, reject and stop at an EOS or a stop string
        state = DecodeState(toys.target_session(), list(prompt), params,
                            torch.Generator().manual_seed(seed), Stats(), top_logprobs=TOP)
        gen = Generation(state, make(), 8, toys.target_table.eos_ids, toys._text(["bcb"]), Finish())
        decode_batch([gen])
        tokens = state.committed[len(prompt):]
        assert len(gen.logprobs) == len(tokens) > 0
        want = reference(toys.target_session().logits, params, prompt, tokens)
        assert_logprobs_equal(gen.logprobs, want, 1e-12)
        assert gen.result()[1].logprobs == gen.logprobs
        accepted += state.stats.accepted
    # drafted tokens were reported (copies of this toy text are kept too rarely to count on)
    assert method in ("ar", "lookup") or accepted > 0


def test_no_logprobs_asked_none_kept(toys):
    state = DecodeState(toys.target_session(), [1], SamplingParams(), torch.Generator(), Stats())
    gen = Generation(state, Autoregressive(), 4, toys.target_table.eos_ids, toys._text([]), Finish())
    decode_batch([gen])
    assert gen.logprobs == [] and state.step_logprobs == [] and gen.result()[1].logprobs is None


def test_greedy_reports_the_models_own_distribution_with_the_bias():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    got = token_logprobs(SamplingParams(), logits, [0], 2)[0]
    assert got.logprob == pytest.approx(math.log(0.5)) and [i for i, _ in got.top] == [0, 1]
    # sampling: the processed distribution; what top-k cut is not an alternative
    got = token_logprobs(SamplingParams(temperature=1.0, top_k=1), logits, [0], 3)[0]
    assert got.logprob == 0.0 and got.top == [(0, 0.0)]


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(temperature=0.8, top_k=40, seed=1),
                                      dict(temperature=0.0, logit_bias={13: 3.0})], ids=str)
def test_every_method_reports_plain_decodings_logprobs_on_a_real_model(real_model, settings):
    """SmolLM2 in float32: the log-probabilities each method reports for its tokens, drafted
    ones read off the verifying call, are plain decoding's (one position a call), to float32's
    noise between calls of different lengths."""
    from anydraft import Decoder
    from anydraft.models.loading import load_tokenizer
    from tests.methods.test_greedy_real import mixed_prompts

    target = "smollm2-135m"
    model = real_model(target)
    drafters = {"ar": None, "lookup": None, "sd": (target, "float32"),
                "slem": ("gemma3-270m", "bfloat16"), "tli": ("gemma3-270m", "bfloat16"),
                "slrs": ("gemma3-270m", "bfloat16")}
    params = SamplingParams(**settings)
    prompt = mixed_prompts()[3]
    if params.greedy:  # every greedy verifier is exact match: one of each kind of drafter
        drafters = {m: drafters[m] for m in ("ar", "sd", "slem")}
    for method, drafter in drafters.items():
        dec = Decoder(target=model, tokenizer=load_tokenizer(target), adaptive=False,
                      drafter=None if drafter is None else real_model(*drafter),
                      drafter_tokenizer=None if drafter is None else load_tokenizer(drafter[0]))
        out = dec.generate(prompt, max_new_tokens=16, method=method, sampling=params, logprobs=2)
        assert method in ("ar", "lookup") or out.stats["accepted"] > 0, method
        # plain decoding's calls: the whole prompt, then one token a call
        session, ids = dec.target.new_session(), dec.prompt_ids(prompt)
        logits = torch.cat([session.feed(ids, rows=1)] +
                           [session.feed([t], rows=1) for t in out.token_ids[:-1]])
        want = token_logprobs(params, logits, out.token_ids, 2)
        assert_logprobs_equal(out.logprobs, want, FLOAT32_NOISE)


def test_the_cli_prints_them_with_json(tmp_path, capsys):
    import json

    from anydraft.cli import main
    from tests.helpers import byte_tokenizer, tiny_llama

    tok = byte_tokenizer()
    tiny_llama(len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    argv = ["generate", "--target", str(tmp_path), "--dtype", "float32", "--prompt", "hello",
            "--max-new-tokens", "4", "--method", "ar", "--logit-bias", "104=-100"]
    assert main([*argv, "--json", "--logprobs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e[0] for e in out["logprobs"]] == out["token_ids"] and 104 not in out["token_ids"]
    assert all(len(e[2]) == 2 and e[1] <= 0 for e in out["logprobs"])
    assert main([*argv, "--logprobs", "2"]) == 2 and "add --json" in capsys.readouterr().err
