import pytest
from bridge_strategies import text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anydraft.bridge import UnspellableBytes, same_tokenizer, split_utf8, token_table

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _all_tables(real_tables, synthetic_tables):
    return {**real_tables, **synthetic_tables}


@pytest.mark.real
def test_real_table_facts(real_tables, real_tokenizers):
    smol, gemma, qwen = (
        real_tables[n] for n in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")
    )
    assert (smol.kind, gemma.kind, qwen.kind) == ("byte-bpe", "sentencepiece", "byte-bpe")
    assert smol.eos_ids == {0, 2} and smol.eos_id == 2
    assert (
        gemma.eos_ids == {1, 106} and gemma.eos_id == 1 and gemma.bos_id == 2 and gemma.pad_id == 0
    )
    assert qwen.eos_ids == {151643, 151645} and qwen.eos_id == 151645
    assert len(qwen) == 151936
    assert gemma.token_bytes[138] == b"  " and gemma.token_bytes[107] == b"\n"
    assert gemma.decode_bytes(gemma.byte_ids[0xE2 : 0xE2 + 1]) == b"\xe2"
    # encode never adds BOS, even where the tokenizer's own call does (Gemma)
    assert real_tokenizers["gemma3-270m"].encode("hi")[0] == 2
    for t in real_tables.values():
        ids = t.encode("hello world")
        assert t.bos_id not in ids and t.decode_bytes(ids) == b"hello world"
    assert qwen.encode("<|im_end|>") == [151645]
    # ids past the vocabulary (padded logit rows) spell nothing instead of failing
    assert smol.decode_bytes([len(smol) + 5]) == b""


@pytest.mark.real
def test_token_bytes_agree_with_decode(real_tables, real_tokenizers):
    """token_bytes comes from the tokenizer's structure; decode must agree wherever decode is
    lossless (whole characters, not byte-fallback pieces)."""
    for name, t in real_tables.items():
        tok = real_tokenizers[name]
        for i in range(0, len(t), 97):
            try:
                want = t.token_bytes[i].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if i not in t.fallback_ids:
                assert (
                    tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                    == want
                ), (name, i)


@pytest.mark.real
def test_same_tokenizer_on_catalog(real_tokenizers):
    names = list(real_tokenizers)
    for a in names:
        for b in names:
            want = a == b or {a, b} == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
            assert same_tokenizer(real_tokenizers[a], real_tokenizers[b]) == want, (a, b)


def test_smollm2_like_missing_bytes_raise(synthetic_tables):
    # every tokenizer here can spell every byte; the error path is exercised on a fake gap
    t = synthetic_tables["byte-bpe"]
    assert all(i is not None for i in t.byte_ids)
    import dataclasses

    gap = dataclasses.replace(t, byte_ids=(None,) * 256)
    with pytest.raises(UnspellableBytes):
        gap.encode_bytes(b"\xff")


@SETTINGS
@given(data=st.binary(max_size=40), name=st.sampled_from(["byte-bpe", "sentencepiece"]))
def test_encode_bytes_any_bytes_synthetic(synthetic_tables, data, name):
    t = synthetic_tables[name]
    assert t.decode_bytes(t.encode_bytes(data)) == data


@pytest.mark.real
@SETTINGS
@given(
    s=text,
    junk=st.binary(max_size=3),
    name=st.sampled_from(["gemma3-270m", "qwen2.5-coder-0.5b", "smollm2-135m"]),
)
def test_encode_bytes_exact_real(real_tables, s, junk, name):
    t = real_tables[name]
    if name == "smollm2-135m":  # it has no token for 21 byte values
        junk = bytes(b for b in junk if t.byte_ids[b] is not None)
    data = junk + s.encode() + junk
    ids = t.encode_bytes(data)
    assert t.decode_bytes(ids) == data
    if t.decode_bytes(t.encode(s)) == s.encode():  # byte-faithful text: same as the tokenizer
        assert t.encode_bytes(s.encode()) == t.encode(s)


@settings(max_examples=200, deadline=None)
@given(s=st.text(max_size=12), cut=st.integers(0, 60))
def test_split_utf8_streams_exactly(s, cut):
    data = s.encode("utf-8", "replace")
    cut = min(cut, len(data))
    head, held = split_utf8(data[:cut])
    rest, held2 = split_utf8(held + data[cut:])
    assert held2 == b"" and head + rest == data.decode("utf-8")
    assert len(held) < 4


def test_table_is_cached(synthetic_tables):
    t = synthetic_tables["byte-bpe"]
    assert token_table(t) is t


def test_a_missing_tokenizer_fails_where_every_model_is_required(monkeypatch):
    """`make test` sets ANYDRAFT_REQUIRE_MODELS=1: the real-tokenizer tests must then fail, not
    skip, when a catalog model is missing."""
    from anydraft.models import catalog
    from tests.bridge.conftest import _load

    monkeypatch.setattr(type(catalog.CATALOG["gemma3-270m"]), "installed", property(lambda self: False))
    monkeypatch.setenv("ANYDRAFT_REQUIRE_MODELS", "1")
    with pytest.raises(pytest.fail.Exception, match="gemma3-270m is not installed"):
        _load("gemma3-270m")
    monkeypatch.delenv("ANYDRAFT_REQUIRE_MODELS")
    with pytest.raises(pytest.skip.Exception):
        _load("gemma3-270m")
