"""`RequestOptions`: the one place for the options `Decoder.generate`, `stream`,
`generate_batch` and `start` share, checked once."""

import dataclasses

import pytest

from anydraft import AnydraftError, SamplingParams
from anydraft.request import RequestOptions


def test_keyword_arguments_become_one_checked_value():
    hot = SamplingParams(temperature=1.0, top_p=0.9)
    options = RequestOptions.of(12, sampling=hot, seed=3, stop="\n", chat=False, logprobs=2)
    assert options.sampling == SamplingParams(temperature=1.0, top_p=0.9, seed=3)
    assert options.stop == ("\n",) and options.max_new_tokens == 12 and not options.chat
    assert RequestOptions.of(stop=["a", "b"]).stop == ("a", "b")
    assert RequestOptions.of(temperature=None).sampling == SamplingParams()  # None: as it is
    assert RequestOptions.of() == RequestOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.chat = True


@pytest.mark.parametrize("kwargs,match", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": True}, "max_new_tokens"),
    ({"stop": [3]}, "stop"), ({"stop": 3}, "stop"), ({"method": "magic"}, "unknown method"),
    ({"logprobs": 21}, "logprobs"), ({"top_p": 0}, "top_p"),
])
def test_each_bad_option_is_an_error_naming_it(kwargs, match):
    with pytest.raises(AnydraftError, match=match):
        RequestOptions.of(**kwargs)


def test_an_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="temprature"):
        RequestOptions.of(temprature=1.0)
