"""Vocabulary bridge: the only place that knows two tokenizers differ (docs/architecture.md)."""

from .intersection import VocabIntersection, intersect
from .report import format_pair_report, pair_report
from .translate import continue_tokens, resync, spellable
from .vocab import (
    TokenTable,
    UnspellableBytes,
    build_token_table,
    same_tokenizer,
    split_utf8,
    token_table,
)

__all__ = [
    "TokenTable",
    "UnspellableBytes",
    "VocabIntersection",
    "build_token_table",
    "continue_tokens",
    "format_pair_report",
    "intersect",
    "pair_report",
    "resync",
    "same_tokenizer",
    "spellable",
    "split_utf8",
    "token_table",
]
