"""`RequestOptions`: what one request asks of a `Decoder` besides its prompt, in one place.

`Decoder.generate`, `stream`, `generate_batch` and `start` take these as keyword arguments
and build one `RequestOptions` from them (`RequestOptions.of`), which checks them once; the
server builds one per HTTP request. Light at import time (no torch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from .config import check_method, is_int, override
from .constraints.grammar import GRAMMAR_METHODS, Grammar
from .errors import AnydraftError
from .sampling import MAX_TOP_LOGPROBS, SamplingParams

# keyword arguments that override one field of ``sampling`` (`RequestOptions.of`)
SAMPLING_SHORTCUTS = frozenset(f.name for f in dataclasses.fields(SamplingParams))


@dataclass(frozen=True)
class RequestOptions:
    """A request's settings. Invalid values raise `AnydraftError` at construction (whether
    ``method`` needs a drafter, and ``sampling``'s logit bias against the vocabulary, are
    checked by the decoder that runs it).

    ``sampling``: default greedy. ``chat``: the prompt is a chat (a string is one user message)
    read through the target's chat template. ``stop``: strings that end the text before them.
    ``method``: None, the decoder's own. ``logprobs`` (None: none): each token's
    log-probability under the target's processed distribution and that many top alternatives
    (0..20), as plain decoding reports them. ``special_in_content``: special tokens typed in
    chat messages act as control tokens (chat.py; by default they are text). ``grammar``
    (None: free text): what the output must match (constraints/grammar.py `Grammar`: a JSON
    schema, any JSON object, a regex, a Lark grammar), sampled from the target's distribution
    restricted to what the grammar allows."""

    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    chat: bool = True
    stop: tuple[str, ...] = ()  # a string or a list of strings is taken too
    method: str | None = None
    logprobs: int | None = None
    special_in_content: bool = False
    grammar: Grammar | None = None

    def __post_init__(self):
        max_new = self.max_new_tokens
        if not is_int(max_new) or max_new < 1:
            raise AnydraftError(f"max_new_tokens must be a positive integer, got {max_new!r}")
        stop = _stop_strings(self.stop)
        object.__setattr__(self, "stop", stop)
        if self.method is not None:
            check_method(self.method)
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise AnydraftError("grammar must be an anydraft.constraints.Grammar, e.g. "
                                "Grammar('json_schema', schema), or None")
        if self.grammar is not None and self.method == "slrs":
            raise AnydraftError(GRAMMAR_METHODS)
        logprobs = self.logprobs
        if logprobs is not None and (not is_int(logprobs) or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise AnydraftError(f"logprobs must be None or an integer in 0..{MAX_TOP_LOGPROBS} "
                                f"(alternatives per token), got {logprobs!r}")

    @classmethod
    def of(cls, max_new_tokens: int = 128, *, sampling: SamplingParams | None = None,
           **options) -> RequestOptions:
        """The options of keyword arguments: the fields above, ``sampling`` None for greedy, and
        ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``, ``logit_bias`` ({target
        token id: bias in [-100, 100]}) overriding single fields of ``sampling`` (None: as it is)."""
        shortcuts = {name: options.pop(name) for name in SAMPLING_SHORTCUTS & options.keys()}
        params = override(sampling or SamplingParams(), **shortcuts)
        return cls(max_new_tokens, params, **options)


def _stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise AnydraftError("stop must be a string or a list of strings")
    return tuple(stop)
