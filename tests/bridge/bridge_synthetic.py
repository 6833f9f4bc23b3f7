"""Small tokenizers trained in the test run, so the suite also covers tokenizer shapes the
catalog lacks (Metaspace pre-tokenizer with word splits, dummy prefix, tiny vocabularies)."""

from __future__ import annotations

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n",
    "Don't stop; we'll see what they've done in 2024, 1,000 times.",
    "日本語の文章と中文句子。 Café naïve résumé",
    "  indented\n\tline with tab\n\n\nblank lines   end",
]


def _wrap(tok, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def make_byte_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return _wrap(tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")


def make_sentencepiece(prepend_scheme: str = "never"):
    """SentencePiece-style BPE: spaces as "▁", Metaspace word splits, byte fallback."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="never", split=True
    )
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tj = json.loads(tok.to_str())
    vocab = tj["model"]["vocab"]
    for b in range(256):  # byte-fallback pieces, as SentencePiece models carry them
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tj["model"]["byte_fallback"] = True
    tj["model"]["fuse_unk"] = True
    tok = Tokenizer.from_str(json.dumps(tj))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=prepend_scheme, split=True
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return _wrap(tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
