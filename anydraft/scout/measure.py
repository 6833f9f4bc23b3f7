"""One candidate's numbers: what a short run at a fixed draft length measures, and the speedup
the bound predicts from them.

The bound (bench/bound.py, ALGORITHMS.md section 0) prices a drafting step that offers k
candidates at k c + v_k target steps and credits it (1 - a^(k+1)) / (1 - a) tokens. Here c is
the drafter's seconds per drafted target token (a drafter of another vocabulary may spell one
of its tokens as several target tokens, or half of one), v_k = T(k+1) / T(1) is read off the
target's measured cost curve, and the translation between vocabularies adds o steps per
drafting step. Prompt lookup drafts only where the text repeats itself: a share q of its steps
draft, the others are plain steps (cost 1, one token); drafter methods draft at every step
(q = 1), where the formula is the bound itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..bench.bound import expected_tokens_per_round, per_token_acceptance

# the usual best method first (`methods.auto_candidates` for greedy): with a budget that runs
# out, each drafter and backend gets its first method measured before any gets a second
DRAFTER_METHODS = {True: ("sd",), False: ("slem", "tli", "slrs")}  # by same tokenizer
WARMUP_TOKENS = 2  # an untimed run first: the first calls of a session pay one-off costs


@dataclass
class Candidate:
    """One way to decode: ``method`` with ``drafter`` on ``backend`` (None, None for prompt
    lookup and plain decoding)."""

    method: str
    drafter: str | None = None
    backend: str | None = None

    @property
    def label(self) -> str:
        if self.drafter is None:
            return "plain decoding" if self.method == "ar" else self.method
        return f"{self.method} <- {self.drafter} ({self.backend})"


@dataclass
class Measured:
    """What a candidate's runs measured (pooled over prompts), in the target's plain steps."""

    a: float | None  # per-token acceptance (bound.per_token_acceptance)
    a_per_position: list[float]  # a_i: the i-th candidate kept, given the ones before it were
    c: float  # drafter seconds per drafted target token / T(1)
    o: float  # translation seconds per drafting step / T(1)
    q: float  # share of steps that drafted
    seconds: float  # the runs' wall time
    stats: dict = field(default_factory=dict)  # the pooled counters behind the numbers


def pooled(stats: list[dict]) -> dict:
    """The counters of several runs added up (accepted per position element by element)."""
    keys = ("new_tokens", "seconds", "target_calls", "drafter_calls", "drafted", "accepted",
            "rejected", "drafts", "draft_seconds", "translate_seconds", "prefill_seconds")
    total = {k: sum(s[k] for s in stats) for k in keys}
    width = max((len(s["accepted_per_position"]) for s in stats), default=0)
    total["accepted_per_position"] = [sum(s["accepted_per_position"][i] for s in stats
                                          if i < len(s["accepted_per_position"])) for i in range(width)]
    return total


def per_position(accepted_per_position: list[int], drafts: int) -> list[float]:
    """a_i = (drafts whose i-th candidate was kept) / (drafts whose (i-1)-th was), the chance of
    position i given the ones before it (vLLM's spec-decode metrics count the same way). A draft
    cut short offers fewer positions, so the later a_i lean low."""
    out, before = [], drafts
    for kept in accepted_per_position:
        if not before:
            break
        out.append(kept / before)
        before = kept
    return out


def measured(stats: list[dict], plain_step: float) -> Measured:
    """The numbers of a candidate's runs (``stats``: one dict per prompt), ``plain_step`` = T(1)
    the target's seconds for one plain step."""
    s = pooled(stats)
    drafted, drafts = s["drafted"], s["drafts"]
    return Measured(
        a=per_token_acceptance(s["accepted"], s["rejected"]),
        a_per_position=per_position(s["accepted_per_position"], drafts),
        c=s["draft_seconds"] / drafted / plain_step if drafted else 0.0,
        o=s["translate_seconds"] / drafts / plain_step if drafts else 0.0,
        q=drafts / s["target_calls"] if s["target_calls"] else 0.0,
        seconds=s["seconds"], stats=s)


def predict(a: float, k: int, c: float, verify: float, o: float = 0.0, q: float = 1.0) -> float:
    """The expected speedup over plain decoding: drafting steps (a share ``q``) commit
    (1 - a^(k+1)) / (1 - a) tokens for k c + v_k + o plain steps, the others one token for one
    step. With q = 1 and o = 0 this is S(a, k, c) with the measured verification cost."""
    tokens = q * expected_tokens_per_round(a, k) + (1 - q)
    return tokens / (q * (k * c + verify + o) + (1 - q))


def best_k(m: Measured, verify: list[float]) -> tuple[int, float]:
    """``(k, predicted speedup)`` at the best draft length k = 1..len(verify) (``verify[j-1]`` =
    v_j); (0, 1.0) for a candidate that never drafted (it decodes plainly)."""
    if m.a is None or not m.q:
        return 0, 1.0
    speedups = {k: predict(m.a, k, m.c, verify[k - 1], m.o, m.q) for k in range(1, len(verify) + 1)}
    k = max(speedups, key=lambda j: (speedups[j], -j))
    return k, speedups[k]


def run_prompts(decoder, method: str, prompts: list[dict], max_new_tokens: int, chat: bool) -> list[dict]:
    """Greedy runs of ``method`` on each prompt: ``{"token_ids", "stats"}`` per prompt."""
    outs = []
    for p in prompts:
        out = decoder.generate(p["prompt"], max_new_tokens=max_new_tokens, method=method, chat=chat)
        outs.append({"token_ids": out.token_ids, "stats": out.stats})
    return outs


def warm_up(decoder, method: str, prompt: dict, chat: bool) -> None:
    decoder.generate(prompt["prompt"], max_new_tokens=WARMUP_TOKENS, method=method, chat=chat)
