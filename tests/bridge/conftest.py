"""Tokenizers for the bridge tests: the real catalog ones (loaded once per session) and the
synthetic ones of `bridge_synthetic`."""

from __future__ import annotations

import pytest
from bridge_synthetic import make_byte_bpe, make_sentencepiece

from anydraft.bridge import token_table

REAL = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def synthetic_tables():
    return {
        "byte-bpe": token_table(make_byte_bpe()),
        "sentencepiece": token_table(make_sentencepiece()),
    }


def _load(name):
    """The tokenizer of a catalog model; a model not installed skips, or fails where
    ANYDRAFT_REQUIRE_MODELS=1 demands every model (`make test`)."""
    from anydraft.models.loading import load_tokenizer
    from tests.conftest import require_model

    return load_tokenizer(require_model(name))


@pytest.fixture(scope="session")
def real_tokenizers():
    return {name: _load(name) for name in (*REAL, "qwen2.5-coder-1.5b")}


@pytest.fixture(scope="session")
def real_tables(real_tokenizers):
    return {name: token_table(real_tokenizers[name]) for name in REAL}
