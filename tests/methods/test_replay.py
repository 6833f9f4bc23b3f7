"""The replay proposer (methods/replay.py): drafts at a known acceptance, output still plain."""

import pytest

from anydraft import Decoder
from anydraft.doctor.device_check import generate_replayed
from anydraft.errors import AnydraftError
from anydraft.methods import replay
from tests.models.test_synthetic import require_tokenizers

CROSS = ("synthetic:qwen2.5-7b:tiny", "synthetic:smollm2-135m:tiny")
SAME = ("synthetic:qwen2.5-7b:tiny", "synthetic:qwen2.5-0.5b:tiny")
N = 40


@pytest.fixture(scope="module")
def decoders():
    require_tokenizers(*CROSS, *SAME)
    return {pair: Decoder(*pair, device="cpu", num_draft_tokens=5, adaptive=False)
            for pair in (CROSS, SAME)}


@pytest.mark.parametrize("pair, method", [(SAME, "sd"), (CROSS, "slem"), (CROSS, "tli"),
                                          (CROSS, "slrs")])
def test_replay_is_plain_decoding_and_accepts_as_asked(decoders, pair, method):
    decoder = decoders[pair]
    rates = {}
    for a in (0.0, 0.6, 1.0):
        out, plain = generate_replayed(decoder, "Write a haiku", N, method, a)
        assert out.token_ids == plain.token_ids, (method, a)  # the real verifier judged
        assert out.stats["method"] == f"{method} (replay a={a:g})"
        rates[a] = out.stats["acceptance_rate"]
    assert rates[0.0] < 0.1 and rates[0.0] < rates[0.6] < rates[1.0]  # acceptance follows a
    if method == "sd":  # the same vocabulary: every replayed token is the target's
        assert rates[1.0] == 1.0 and rates[0.0] == 0.0


def test_replay_refuses_sampling_and_a_bad_a(decoders):
    decoder = decoders[CROSS]
    with pytest.raises(AnydraftError, match="greedy"):
        generation = decoder.start("Write a haiku", 8, method="slem", temperature=1.0)
        replay.Replay(generation.method, [1, 2], 0.8).start(generation.state)
    with pytest.raises(AnydraftError, match=r"\[0, 1\]"):
        replay.Replay(decoder.start("Write a haiku", 8, method="slem").method, [1], 1.5)
