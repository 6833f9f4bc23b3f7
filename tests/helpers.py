"""Small, fast building blocks for unit tests: a byte-level tokenizer and tiny random models."""

from __future__ import annotations

import functools

import torch


@functools.cache
def byte_tokenizer():
    """A byte-level BPE tokenizer with a few merges, ChatML specials and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "def f(x):\n    return x + 1",
              "hello world, hello there", "speculative decoding is lossless"] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


def tiny_llama(vocab_size: int, seed: int = 0, max_positions: int = 256, layers: int = 2):
    """A randomly initialised 2-layer llama: real transformers code paths, millisecond steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, eos_token_id=2, bos_token_id=0,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    # sharpen the random logits so greedy output is not a near-tie lottery
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def save_tiny_pair(root) -> tuple:
    """Two tiny llamas with the byte tokenizer saved under ``root``: (target dir, drafter dir)."""
    tok = byte_tokenizer()
    for name, seed in (("target", 0), ("drafter", 1)):
        tiny_llama(len(tok), seed=seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root / "target", root / "drafter"
