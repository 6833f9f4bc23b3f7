"""`Grammar`: what a request's output must match (light at import time: no torch; the
request options hold it). constraints/matcher.py compiles it and masks with it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import AnydraftError

KINDS = ("json_schema", "json_object", "regex", "lark")
# JSON laid out one way, on one line with a space after each separator (``{"a": 1, "b": [2,
# 3]}``, Python's ``json.dumps`` and chat templates' ``tojson``, which models read most): with
# any whitespace allowed, a small or unsure model can spend its whole budget on newlines (seen
# with a random model: 40 tokens of "\r\n  " and no value); with none (``{"a":1}``), a model
# that wants ``": "`` takes the token ``",`` and opens its strings with a comma (seen on
# Qwen2.5-Coder-0.5B: ``{"title":", Android app crashes"}``). A schema's own "x-guidance"
# settings take precedence
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# string-level rejection sampling weighs every tokenization of a drafted string, each with its
# own grammar state: not built; every token-level method is exact under a grammar
GRAMMAR_METHODS = ("method 'slrs' does not take a grammar yet: use 'auto', 'sd', 'slem', 'tli', "
                   "'lookup' or 'ar'")


@dataclass(frozen=True)
class Grammar:
    """``kind``: "json_schema" (``source``: the schema, JSON text or a dict), "json_object"
    (any JSON object; no source), "regex" or "lark" (llguidance's Lark dialect, which takes
    GBNF-style rules too). Malformed input raises `AnydraftError` here; a schema that parses
    but cannot be compiled raises when a decoder compiles it (constraints/matcher.py `Compiler.constraint`)."""

    kind: str
    source: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise AnydraftError(f"unknown grammar kind {self.kind!r}: use one of {', '.join(KINDS)}")
        source = self.source
        if self.kind == "json_schema":
            if not isinstance(source, str):
                source = json.dumps(source)
            try:
                schema = json.loads(source)
            except ValueError as exc:
                raise AnydraftError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise AnydraftError("a JSON schema is an object (or true/false), "
                                    f"got {type(schema).__name__}")
            object.__setattr__(self, "source", source)
        elif self.kind == "json_object":
            object.__setattr__(self, "source", "")
        elif not isinstance(source, str) or not source:
            raise AnydraftError(f"a {self.kind} grammar needs its text (a non-empty string)")

    def llguidance(self) -> str:
        """This grammar in llguidance's own form."""
        from llguidance import LLMatcher

        if self.kind in ("json_object", "json_schema"):
            schema = self.source if self.kind == "json_schema" else '{"type": "object"}'
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        return LLMatcher.grammar_from_lark(self.source)
