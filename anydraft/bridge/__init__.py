"""Vocabulary bridge: the only place that knows two tokenizers differ (see DESIGN.md)."""

from .vocab import (
    TokenTable,
    UnspellableBytes,
    build_token_table,
    same_tokenizer,
    split_utf8,
    token_table,
)

__all__ = ["TokenTable", "UnspellableBytes", "build_token_table", "same_tokenizer", "split_utf8", "token_table"]
