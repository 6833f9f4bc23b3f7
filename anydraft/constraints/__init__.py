"""Constrained decoding (issue 63): what a request's output must match, and the mask it puts on
the target's distribution at every position a step scores.

- grammar.py: `Grammar`, what the output must match (a JSON schema, any JSON object, a regex
  or a Lark grammar);
- matcher.py: `Compiler` (grammars compiled by llguidance for the target's tokenizer) and
  `Constraint`, one generation's grammar state and the mask it puts on the target's logits.

Why llguidance (scripts/grammar_mask_time.py, docs/structured-outputs.md): on the catalog's
tokenizers both it and xgrammar mask a token in microseconds (a target step takes tens of
milliseconds), llguidance compiles a schema 4-10x faster and rolls a draft back for less, and
its wheel has no dependency; xgrammar's pulls in triton and a tensor runtime.
"""

from .grammar import Grammar

__all__ = ["Grammar"]
