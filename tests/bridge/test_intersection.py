import pytest
import torch

from anydraft.bridge import intersect, token_table

# MODELS.md: token strings after mapping space markers (A, B, shared).
PUBLISHED = {
    ("smollm2-135m", "gemma3-270m"): 46_138,
    ("smollm2-135m", "qwen2.5-coder-0.5b"): 39_234,
    ("gemma3-270m", "qwen2.5-coder-0.5b"): 95_934,
}


@pytest.mark.real
@pytest.mark.parametrize("pair", list(PUBLISHED))
def test_overlap_matches_models_md(real_tables, pair):
    """Ours counts byte-identical non-special tokens plus EOS and BOS mapped by role. Measured:
    SmolLM2/Gemma 46,147 (+0.02%), SmolLM2/Qwen 39,236 (+0.01%), Gemma/Qwen 95,970 (+0.04%):
    byte-fallback pieces (<0xNN>) meeting byte-level single-byte tokens and the two role
    pairs account for the small surplus."""
    a, b = (real_tables[n] for n in pair)
    for target, drafter in ((a, b), (b, a)):
        inter = intersect(target, drafter)
        assert abs(inter.size - PUBLISHED[pair]) / PUBLISHED[pair] < 0.01
        print(pair, inter.size)
        check_one_to_one(target, drafter, inter)


def check_one_to_one(target, drafter, inter):
    d2t, t2d = inter.drafter_to_target, inter.target_to_drafter
    mapped = (d2t >= 0).nonzero().flatten().tolist()
    assert len(mapped) == inter.size == int((t2d >= 0).sum())
    for d in mapped:
        t = int(d2t[d])
        assert int(t2d[t]) == d
        if d in drafter.special_ids or t in target.special_ids:
            assert (d, t) in {(drafter.eos_id, target.eos_id), (drafter.bos_id, target.bos_id)}
        else:
            assert drafter.token_bytes[d] == target.token_bytes[t]


@pytest.mark.real
def test_special_tokens_map_by_role_only(real_tables):
    smol, qwen, gemma = (
        real_tables[n] for n in ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")
    )
    inter = intersect(qwen, smol)
    # same spelling "<|im_end|>" in both, but that is not why it maps: roles do
    assert int(inter.drafter_to_target[smol.eos_id]) == qwen.eos_id
    assert int(inter.drafter_to_target[smol.bos_id]) == qwen.bos_id
    assert int(inter.drafter_to_target[0]) == -1  # SmolLM2 <|endoftext|>: no role match left
    inter = intersect(gemma, qwen)
    assert int(inter.drafter_to_target[qwen.eos_id]) == gemma.eos_id
    assert int(inter.drafter_to_target[qwen.bos_id]) == gemma.bos_id
    im_start = qwen.encode("<|im_start|>")[0]
    assert int(inter.drafter_to_target[im_start]) == -1


@pytest.mark.real
def test_padded_vocab_and_same_tokenizer(real_tokenizers):
    q05, q15 = (
        token_table(real_tokenizers[n]) for n in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    )
    inter = intersect(q15, q05, target_vocab_size=151_936 + 64, drafter_vocab_size=151_936 + 128)
    assert inter.identity and inter.size == 151_936
    assert inter.drafter_to_target.shape == (151_936 + 128,) and inter.target_to_drafter.shape == (
        152_000,
    )
    assert int(inter.drafter_to_target[-1]) == -1 and not bool(inter.drafter_mask[-1])


def test_synthetic_pair(synthetic_tables):
    bpe, sp = synthetic_tables["byte-bpe"], synthetic_tables["sentencepiece"]
    inter = intersect(bpe, sp, target_vocab_size=len(bpe) + 7)
    check_one_to_one(bpe, sp, inter)
    # "<0x54>" and "T" spell the same byte: only the piece the tokenizer emits is mapped
    a = sp.encode("T")
    assert len(a) == 1 and a[0] not in sp.fallback_ids
    assert int(inter.drafter_to_target[a[0]]) == bpe.encode("T")[0]
    fb = sp.fallback_ids & {i for i, b in enumerate(sp.token_bytes) if b == b"T"}
    assert fb and all(int(inter.drafter_to_target[i]) == -1 for i in fb)


def test_logits_narrower_than_the_tokenizers_leave_the_ids_past_them_unmapped(synthetic_tables):
    """A tokenizer longer than its model's logits: ids past the logits can be neither drafted
    nor scored, so they take no part (tli masks the logits with the first `width` entries)."""
    bpe, sp = synthetic_tables["byte-bpe"], synthetic_tables["sentencepiece"]
    full = intersect(bpe, sp)
    t_width, d_width = len(bpe) - 50, len(sp) - 300
    inter = intersect(bpe, sp, target_vocab_size=t_width, drafter_vocab_size=d_width)
    assert inter.drafter_to_target.shape == (len(sp),) and inter.target_to_drafter.shape == (len(bpe),)
    d2t = inter.drafter_to_target
    assert not bool(inter.drafter_mask[d_width:].any()) and int(d2t.max()) < t_width
    kept = (full.drafter_to_target >= 0) & (full.drafter_to_target < t_width)
    kept[d_width:] = False
    assert torch.equal(inter.drafter_mask, kept) and 0 < inter.size < full.size
    same = intersect(bpe, bpe, target_vocab_size=t_width, drafter_vocab_size=t_width + 9)
    assert same.identity and same.size == t_width
