"""Draft settings: `DraftConfig`, the one frozen, validated object that the Decoder, the CLI,
the server and the bench read. Light at import time (no torch): `anydraft.options` builds the
command line options from these fields.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .errors import AnydraftError
from .planning.settings import SETTINGS

METHODS = ("ar", "lookup", "sd", "slem", "tli", "slrs", "auto")
NEEDS_DRAFTER = ("sd", "slem", "tli", "slrs")


def check_method(name, has_drafter: bool | None = None) -> str:
    """``name`` if it is a method (and, when ``has_drafter`` is given, one this decoder can
    run); else an error naming the fix."""
    if name not in METHODS:
        raise AnydraftError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    if has_drafter is False and name in NEEDS_DRAFTER:
        raise AnydraftError(f"method {name!r} needs a drafter model: pass drafter=... (CLI: --drafter)")
    return name


def is_int(value) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float, not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _help(text: str, **more) -> dict:
    """Field metadata: the help of its command line option (see anydraft/options.py)."""
    return {"help": text, **more}


@dataclass(frozen=True)
class DraftConfig:
    """How to draft. Invalid values raise `AnydraftError` at construction."""

    method: str = field(default="auto", metadata=_help(" | ".join(METHODS)))
    num_draft_tokens: int = field(default=5, metadata=_help(
        "draft length k (with adaptive drafting: the largest k it may choose), 1..64"))
    draft_confidence: float = field(default=0.0, metadata=_help(
        "stop drafting when the drafter's top probability falls below this, in [0, 1)"))
    adaptive: bool = field(default=True, metadata=_help(
        "always draft --num-draft-tokens (default: adaptive, from measured costs)",
        flag="--fixed-k"))
    drafter_context: int = field(default=SETTINGS.drafter_context, metadata=_help(
        "the drafter reads at most the prompt's last N tokens: cheaper on long prompts; "
        "adaptive drafting reads fewer, down to 16, where N cost more than a target step; "
        "0: all of it"))

    def __post_init__(self):
        def bad(msg):
            raise AnydraftError(f"invalid draft settings: {msg}")

        check_method(self.method)
        k = self.num_draft_tokens
        if not is_int(k) or not 1 <= k <= 64:
            bad(f"num_draft_tokens must be an integer in 1..64, got {k!r}")
        c = self.draft_confidence
        if not is_number(c) or not 0 <= c < 1:
            bad(f"draft_confidence must be a number in [0, 1), got {c!r}")
        if not isinstance(self.adaptive, bool):
            bad(f"adaptive must be True or False, got {self.adaptive!r}")
        n = self.drafter_context
        if not is_int(n) or n < 0:
            bad(f"drafter_context must be a non-negative integer (0: the whole prompt), got {n!r}")


def override(settings, **changes):
    """``settings`` (a frozen dataclass) with the ``changes`` that are not None, validated again."""
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(settings, **changes) if changes else settings
