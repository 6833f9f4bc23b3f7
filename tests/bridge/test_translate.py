"""Exactness of translation between tokenizers: the heart of the bridge suite."""

import random

import pytest
from bridge_strategies import text
from bridge_synthetic import make_sentencepiece
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.bridge import continue_tokens, resync, token_table

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
REAL = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]
SYN = ["byte-bpe", "sentencepiece"]


@pytest.fixture(scope="module")
def tables(request, synthetic_tables):
    out = dict(synthetic_tables)
    if request.config.getoption("-m", default="") != "not real":
        out.update(request.getfixturevalue("real_tables"))
    return out


def stream(table, data: bytes, cuts) -> list[int]:
    """Translate ``data`` arriving in pieces (cut at byte offsets), committing as a decoding
    loop would: committed tokens are never revisited."""
    committed: list[int] = []
    prev = 0
    for c in [*cuts, len(data)]:
        toks = continue_tokens(table, committed, data[prev:c])
        assert table.decode_bytes(toks) == data[prev:c]
        committed += toks
        prev = c
    return committed


def check_pair(tables, src_name, dst_name, s, cuts_seed):
    src, dst = tables[src_name], tables[dst_name]
    data = s.encode()
    src_ids = src.encode_bytes(data)
    # drafter tokens -> bytes -> target tokens, in random chunks of drafter tokens
    rng = random.Random(cuts_seed)
    dst_ids: list[int] = []
    i = 0
    while i < len(src_ids):
        j = i + rng.randint(1, 4)
        dst_ids += continue_tokens(dst, dst_ids, src.decode_bytes(src_ids[i:j]))
        i = j
    assert dst.decode_bytes(dst_ids) == data
    # whole text at once is the target's own (canonical) encoding wherever that is byte-exact
    whole = continue_tokens(dst, [], data)
    assert dst.decode_bytes(whole) == data
    if dst.decode_bytes(dst.encode(s)) == data:
        assert whole == dst.encode(s)
    # random byte cuts, inside multi-byte characters too: same bytes, nothing lost
    cuts = sorted(rng.sample(range(len(data) + 1), min(6, len(data) + 1)))
    assert dst.decode_bytes(stream(dst, data, cuts)) == data


@SETTINGS
@given(s=text, seed=st.integers(0, 10**6), pair=st.sampled_from([(a, b) for a in SYN for b in SYN]))
def test_translate_exact_synthetic(tables, s, seed, pair):
    check_pair(tables, *pair, s, seed)


@pytest.mark.real
@SETTINGS
@given(
    s=text,
    seed=st.integers(0, 10**6),
    pair=st.sampled_from(
        [(a, b) for a in REAL for b in REAL if a != b] + [("byte-bpe", "gemma3-270m")]
    ),
)
def test_translate_exact_real(tables, s, seed, pair):
    check_pair(tables, *pair, s, seed)


def _check_join(t, prefix: bytes, data: bytes) -> bool:
    whole = t.encode_bytes(prefix + data)
    pos = k = 0
    while pos < len(prefix):
        pos += len(t.token_bytes[whole[k]])
        k += 1
    if pos != len(prefix):
        return False  # canonical token straddles the join: no continuation can equal it
    assert continue_tokens(t, whole[:k], data) == whole[k:]
    return True


@SETTINGS
@given(ctx=text, s=text, name=st.sampled_from(REAL + SYN))
def test_lookbehind_matches_whole_encoding(tables, ctx, s, name):
    """Evidence for the adaptive lookbehind: continuing a canonically encoded context gives
    exactly the tail of the canonical encoding of context + text whenever that encoding has
    a token boundary at the join; a long context before it changes nothing."""
    if name not in tables:
        return
    t = tables[name]
    _check_join(t, ctx.encode(), s.encode())
    _check_join(t, b"filler text, " * 40 + ctx.encode(), s.encode())


@SETTINGS
@given(
    ctx=text,
    drafted=text,
    accepted=st.integers(0, 200),
    tail=text,
    name=st.sampled_from(REAL + SYN),
)
def test_resync_invariant(tables, ctx, drafted, accepted, tail, name):
    if name not in tables:
        return
    t = tables[name]
    context = t.encode_bytes(ctx.encode())
    draft = continue_tokens(t, context, drafted.encode())
    dbytes = t.decode_bytes(draft)
    new = dbytes[: min(accepted, len(dbytes))] + tail.encode()
    n_keep, feed = resync(t, context, draft, new)
    assert 0 <= n_keep <= len(draft)
    assert t.decode_bytes(draft[:n_keep] + feed) == new
    if new == dbytes:
        assert (n_keep, feed) == (len(draft), [])


def test_dummy_prefix_sentencepiece_stays_exact():
    """Llama-2 style "▁" dummy prefix: mid-text re-encoding must not invent a space."""
    t = token_table(make_sentencepiece("first"))
    assert t.dummy_prefix
    data = b"The quick brown fox. Don't stop!"
    assert t.decode_bytes(stream(t, data, [3, 4, 10, 17])) == data
    assert t.decode_bytes(continue_tokens(t, t.encode_bytes(b"The"), b"quick")) == b"quick"

