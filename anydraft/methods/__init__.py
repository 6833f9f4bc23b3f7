"""Decoding methods, one file each. A method = a proposer + a verifier (see decoding/loop.py)."""

from __future__ import annotations

from ..errors import AnydraftError
from .ar import Autoregressive

METHODS = ("ar", "sd", "slem", "tli", "auto")
NEEDS_DRAFTER = ("sd", "slem", "tli")


def check(name: str, has_drafter: bool) -> str:
    """Validate a method name against the configuration; clear error naming the fix."""
    if name not in METHODS:
        raise AnydraftError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    if name in NEEDS_DRAFTER and not has_drafter:
        raise AnydraftError(f"method {name!r} needs a drafter model: pass drafter=... (CLI: --drafter)")
    return name


def factory(decoder):
    """A function method name -> fresh method object (one per generation) for ``decoder``."""

    def make(name: str):
        if name == "ar" or (name == "auto" and decoder.drafter is None):
            return Autoregressive()
        raise AnydraftError(f"method {name!r} is not available yet")

    return make
