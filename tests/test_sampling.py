"""Sampling settings: validation and the logits transform on hand-computed examples."""

import math

import pytest
import torch

from anydraft import AnydraftError, SamplingParams
from anydraft.sampling import SAMPLE_BLOCK, inverse_cdf


def test_greedy_is_one_hot_of_argmax():
    p = SamplingParams().probs(torch.tensor([0.1, 3.0, -1.0]))
    assert p.tolist() == [0.0, 1.0, 0.0]


def test_temperature_top_k_top_p_min_p_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))
    # temperature 1: softmax gives back the probabilities
    torch.testing.assert_close(SamplingParams(temperature=1.0).probs(logits),
                               torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))
    # top_k=2 keeps 0.5 and 0.25 -> 2/3, 1/3
    torch.testing.assert_close(SamplingParams(temperature=1.0, top_k=2).probs(logits),
                               torch.tensor([2 / 3, 1 / 3, 0, 0, 0]))
    # top_p=0.8: 0.5 + 0.25 = 0.75 < 0.8, so 0.15 is needed too -> /0.9
    torch.testing.assert_close(SamplingParams(temperature=1.0, top_p=0.8).probs(logits),
                               torch.tensor([0.5, 0.25, 0.15, 0, 0]) / 0.9)
    # top_p=0.75 is reached exactly by the first two
    torch.testing.assert_close(SamplingParams(temperature=1.0, top_p=0.75).probs(logits),
                               torch.tensor([2 / 3, 1 / 3, 0, 0, 0]))
    # min_p=0.2: threshold 0.1 keeps 0.5, 0.25, 0.15
    torch.testing.assert_close(SamplingParams(temperature=1.0, min_p=0.2).probs(logits),
                               torch.tensor([0.5, 0.25, 0.15, 0, 0]) / 0.9)
    # temperature 0.5 squares the probabilities before normalising
    sq = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]) ** 2
    torch.testing.assert_close(SamplingParams(temperature=0.5).probs(logits), sq / sq.sum())


def test_batched_rows_are_independent():
    logits = torch.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    p = SamplingParams(temperature=1.0, top_k=1).probs(logits)
    assert p.tolist() == [[0, 0, 1], [1, 0, 0]]


@pytest.mark.parametrize("kwargs", [
    {"temperature": -0.1}, {"temperature": math.nan}, {"temperature": "hot"}, {"top_p": 0.0},
    {"top_p": 1.5}, {"top_k": -1}, {"top_k": 2.5}, {"min_p": 1.0}, {"min_p": -0.1},
    {"seed": -3}, {"temperature": math.inf},
])
def test_invalid_settings_are_rejected_with_the_field_name(kwargs):
    with pytest.raises(AnydraftError) as err:
        SamplingParams(**kwargs)
    assert next(iter(kwargs)) in str(err.value)


def test_seeded_generator_is_reproducible():
    p = torch.full((50,), 1 / 50)
    draws = [torch.multinomial(p, 5, generator=SamplingParams(seed=3).generator()).tolist()
             for _ in range(2)]
    assert draws[0] == draws[1]


@pytest.mark.parametrize("temperature", [1e-6, 1e-38, 1e-46, 5e-324])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tiny_temperatures_are_greedy_exactly(temperature, dtype):
    # issue 42: logits / 1e-38 overflowed to inf, softmax made nan and the request a 500;
    # 1e-46 rounds to 0 in float32. The limit t -> 0 is the greedy one-hot, exactly.
    logits = torch.tensor([[3.0, 20.5, -1.0, 20.0], [-50.0, -60.0, -40.0, -45.0]], dtype=dtype)
    params = SamplingParams(temperature=temperature)
    p = params.probs(logits)
    assert p.tolist() == SamplingParams().probs(logits).tolist()
    assert [params.choose(row, params.generator()) for row in logits] == [1, 2]


def test_a_tiny_temperature_splits_an_exact_tie_evenly():
    # the limit of softmax(x / t) over a tie of the top logits is uniform over the tie
    p = SamplingParams(temperature=1e-30).probs(torch.tensor([1.0, 7.0, 7.0, -2.0]))
    assert p.tolist() == [0.0, 0.5, 0.5, 0.0]


def test_masked_logits_stay_impossible_at_any_temperature():
    logits = torch.tensor([-math.inf, 0.5, 2.0, -math.inf])
    for temperature in (1e-38, 0.7, 100.0):
        p = SamplingParams(temperature=temperature).probs(logits)
        assert p[0] == 0 and p[3] == 0 and torch.isfinite(p).all()
        assert float(p.sum()) == pytest.approx(1.0)


def test_logit_bias_is_added_to_the_logits_first():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    params = SamplingParams(temperature=1.0, logit_bias={2: math.log(2.0)})
    torch.testing.assert_close(params.probs(logits), torch.tensor([0.4, 0.2, 0.4]))
    # then the temperature: t=0.5 squares the biased probabilities
    params = SamplingParams(temperature=0.5, logit_bias={2: math.log(2.0)})
    torch.testing.assert_close(params.probs(logits), torch.tensor([4 / 9, 1 / 9, 4 / 9]))
    # greedy takes the argmax of the biased logits; -100 bans a token
    greedy = SamplingParams(logit_bias={0: -100})
    assert greedy.choose(logits, None) == 1 and greedy.probs(logits).tolist() == [0, 1, 0]
    # ids past the logits (a narrower drafter's) are skipped; the logits are left as they were
    assert SamplingParams(logit_bias={7: 5.0}).biased(logits).tolist() == logits.tolist()


def test_logit_bias_is_a_sorted_hashable_value():
    a = SamplingParams(logit_bias={5: 1, 2: -3.5})
    assert a.logit_bias == ((2, -3.5), (5, 1.0))
    assert a == SamplingParams(logit_bias=[(2, -3.5), (5, 1.0)]) and hash(a) == hash(
        SamplingParams(logit_bias=((5, 1.0), (2, -3.5))))


@pytest.mark.parametrize("bias, fix", [
    ({1: 100.5}, "[-100, 100]"), ({1: math.nan}, "[-100, 100]"), ({1: math.inf}, "[-100, 100]"),
    ({-1: 1.0}, "token ids"), ({"7": 1.0}, "token ids"), ({True: 1.0}, "token ids"),
    ({1: "1"}, "[-100, 100]"), ([(1, 2.0), (1, 3.0)], "twice"), ("1=2", "map token ids"),
    (dict.fromkeys(range(2000), 1.0), "at most 1024"),
])
def test_a_bad_logit_bias_is_rejected_naming_the_fix(bias, fix):
    with pytest.raises(AnydraftError, match="logit_bias") as err:
        SamplingParams(logit_bias=bias)
    assert fix in str(err.value)


def test_logit_bias_ids_must_be_the_models():
    SamplingParams(logit_bias={9: 1.0}).check_vocabulary(10)
    with pytest.raises(AnydraftError, match=r"token id 10, but the model has ids 0\.\.9"):
        SamplingParams(logit_bias={10: 1.0}).check_vocabulary(10)


@pytest.mark.parametrize("width", [5, SAMPLE_BLOCK, 3 * SAMPLE_BLOCK + 7])
def test_inverse_cdf_gives_each_token_its_share_of_the_unit_interval(width):
    """Evenly spaced points u of [0, 1) land on token i in proportion to p_i (to one point),
    never on a token of probability 0, at a block's edges and past the last full block too."""
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(width, generator=gen) * (torch.rand(width, generator=gen) < 0.5)
    p[0] = p[-1] = 0.0
    p[min(width - 2, SAMPLE_BLOCK - 1)] = 0.5  # a heavy token at a block's end
    points = 20_000
    counts = torch.zeros(width)
    for j in range(points):
        counts[inverse_cdf(p, (j + 0.5) / points)] += 1
    assert torch.all(counts[p == 0] == 0)
    assert torch.all((counts - p / p.sum() * points).abs() <= 1.0 + 1e-6)
    assert p[inverse_cdf(p, 0.0)] > 0 and p[inverse_cdf(p, 1 - 2**-53)] > 0
