"""Hypothesis strategies for text that stresses tokenizer boundaries."""

from hypothesis import strategies as st

FRAGMENTS = [
    "the",
    " the",
    "The",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    "    ",
    "def foo(x):",
    "    return x",
    "+=",
    "==",
    "()",
    "{}",
    "[0]",
    "_",
    "__init__",
    "self.",
    "1",
    "23",
    "4567",
    "3.14",
    "1,000",
    "don't",
    "'s",
    " we'll",
    "'",
    '"',
    "日本語",
    "中文",
    "한국어",
    "🙂",
    "👍🏽",
    "🇫🇷",
    "e\u0301",
    "n\u0303",
    "é",
    "ñ",
    "مرحبا",
    "שלום",
    "Σ",
    "∞",
    "—",
    "…",
    "\u200b",
    "▁",
    "Ġ",
    "<0x41>",
    "<|im_end|>",
    "<eos>",
]

# Cc (controls) and Cs (surrogates) are left out: SmolLM2 cannot spell some control bytes.
CHARS = st.characters(
    codec="utf-8",
    max_codepoint=0x3FFFF,
    exclude_categories=("Cc", "Cs", "Co"),
    include_characters="\t\n",
)

text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(CHARS, max_size=4)), max_size=16).map(
    "".join
)


def splits(data_len: int):
    """Sorted cut points inside a byte string (may fall inside multi-byte characters)."""
    return st.lists(st.integers(0, data_len), max_size=8).map(sorted)
