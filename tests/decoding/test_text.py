"""Stop strings: the text ends before the EARLIEST match of any stop, whatever their order."""

import itertools

import pytest

from anydraft.decoding import TextAssembler

TOKENS = [b"x", b"a", b"bc", b"\xc3", b"\xa9", b"<|im_end|>"]  # 5: a special token


def feed(stops, ids):
    text = TextAssembler(TOKENS, frozenset({5}), stops)
    for i in ids:
        if text.add(i):
            break
    return text


@pytest.mark.parametrize("stops", list(itertools.permutations(["bc", "ab", "c"])), ids=str)
def test_the_earliest_match_wins_in_any_order(stops):
    text = feed(list(stops), [0, 1, 2, 0])
    assert text.stopped and text.text == "x" and text.finish() == "x"


def test_a_stop_inside_one_token_and_one_across_tokens():
    assert feed(["b", "xab"], [0, 1, 2]).text == ""  # "xab" starts before "b" (in "bc")
    assert feed(["c", "ab"], [0, 1, 2]).text == "x"
    assert feed(["é", "a"], [0, 3, 4, 1]).text == "x"  # a character completed by its 2nd byte
    assert feed(["a", "é"], [0, 3, 4, 1]).text == "x"
    assert not feed(["im_end"], [0, 5, 1]).stopped  # special tokens spell no text


def test_the_stream_holds_back_a_possible_stop_and_never_shows_a_later_one():
    text = TextAssembler(TOKENS, frozenset(), ["bc", "ab"])
    shown = ""
    for i in [0, 1, 2, 0]:
        text.add(i)
        shown += text.delta()
        if text.stopped:
            break
    shown += text.delta(final=True)
    assert shown == "x" and text.stopped
