"""Statistics of one generation. The loop owns them so every method is measured alike."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

PHASES = ("draft", "target", "translate")


@dataclass
class Stats:
    method: str = "ar"
    new_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of them, held by a kept cache before the request (models/prefix.py)
    seconds: float = 0.0
    target_calls: int = 0
    drafter_calls: int = 0
    drafted: int = 0  # draft tokens offered to the target (in target tokens)
    accepted: int = 0  # of those, how many the target accepted (and the output kept)
    rejected: int = 0  # drafting steps that ended at a rejected candidate
    drafts: int = 0  # steps that offered the target at least one draft token
    accepted_per_position: list = field(default_factory=list)  # [i]: drafts whose token i was kept
    forced: int = 0  # tokens a grammar forced, offered after the candidates and kept
    # tokens the target chose itself: new_tokens = accepted + forced + target_tokens
    target_tokens: int = 0
    prefill_seconds: float = 0.0  # the target's first call: it reads the prompt
    # inside the drafter's model calls (part of the draft phase, which also holds the drafting
    # bookkeeping): with the target phase, the model time; the rest of the wall time is the host's
    drafter_model_seconds: float = 0.0
    phase_seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def timed(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[phase] += time.perf_counter() - start

    def as_dict(self) -> dict:
        other = max(0.0, self.seconds - sum(self.phase_seconds.values()))
        return {
            "method": self.method,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.new_tokens / self.seconds if self.seconds > 0 else 0.0,
            "target_calls": self.target_calls,
            "drafter_calls": self.drafter_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "drafts": self.drafts,
            "accepted_per_position": list(self.accepted_per_position),
            "forced": self.forced,
            "target_tokens": self.target_tokens,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            # tokens committed per target forward pass (1.0 for plain decoding)
            "mean_accepted": self.new_tokens / self.target_calls if self.target_calls else 0.0,
            "draft_seconds": self.phase_seconds["draft"],
            "target_seconds": self.phase_seconds["target"],
            "translate_seconds": self.phase_seconds["translate"],
            "prefill_seconds": self.prefill_seconds,
            "drafter_model_seconds": self.drafter_model_seconds,
            # everything but the models' calls: anydraft's own work (bench/host.py)
            "host_seconds": max(0.0, self.seconds - self.phase_seconds["target"]
                                - self.drafter_model_seconds),
            "other_seconds": other,
        }
