"""Host overhead on null models (issue 39), as `anydraft.doctor.device_check.host` measures it:
Qwen2.5's 151,936 logits <- SmolLM2's 49,152, k = 5 fixed, 2 prompts x 128 tokens per method.
Row `auto`: the default method, adaptive, beside the drafter, where drafting cannot pay (issue
45): every step plain (tokens / call 1.00), yet running all that `auto` runs per step, the
policy's choice, prompt lookup's match and the drafter's bookkeeping (`never_drafting`).

    PYTHONPATH=$PWD python scripts/host_overhead.py            # one table (this checkout)
    PYTHONPATH=$PWD python scripts/host_overhead.py slem prof  # and cProfile of one method's runs
"""

import contextlib
import cProfile
import pstats
import sys

from anydraft.bench.host import host_fields
from anydraft.decoder import Decoder
from anydraft.doctor.device_check import PROMPTS, K
from anydraft.planning import policy
from anydraft.planning.estimates import Mean

CASES = (("ar", "ar", 0.0), ("slem", "slem", 0.0), ("ar T=1", "ar", 1.0), ("tli T=1", "tli", 1.0),
         ("slrs T=1", "slrs", 1.0), ("auto", "auto", 0.0))
# rows of a decoder that chooses its draft lengths (the others draft k = K every step)
ADAPTIVE = ("auto",)
TOKENS = 128
# a drafter pass as row `auto` prices it, as if measured many times: the policy then prices
# every draft length each step, as it does once a real drafter was timed
DRAFT_SECONDS, DRAFT_WEIGHT = 1e-3, 1e6


@contextlib.contextmanager
def never_drafting(decoder: Decoder):
    """``decoder``'s policy choosing a plain step every step: `best` and `probe_due` run as
    always, their answers overridden (a null drafter's and prompt lookup's drafts sometimes
    win on a null target's microsecond steps, which a slow target's steps would not repay)."""
    decoder.estimates.costs.draft = Mean(DRAFT_SECONDS, DRAFT_WEIGHT)
    best, probe_due = policy.best, policy.probe_due

    def plain_best(*args, **kwargs):
        return 0, best(*args, **kwargs)[1]

    def never_due(*args, **kwargs):
        probe_due(*args, **kwargs)
        return False

    policy.best, policy.probe_due = plain_best, never_due
    try:
        yield
    finally:
        policy.best, policy.probe_due = best, probe_due


def run(dec: Decoder, method: str, temperature: float, profile: bool) -> list[dict]:
    """The stats of one method's runs on `PROMPTS` (after a warm-up); with a cProfile if asked."""
    dec.generate(PROMPTS[0], 8, method=method, temperature=temperature, seed=0)  # warm-up
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    out = [dec.generate(p, TOKENS, method=method, temperature=temperature, seed=0).stats for p in PROMPTS]
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return out


def main(which: str = "all", profile: bool = False) -> None:
    fixed = Decoder("null:qwen2.5-0.5b", "null:smollm2-135m", num_draft_tokens=K, adaptive=False)
    adaptive = Decoder("null:qwen2.5-0.5b", "null:smollm2-135m", num_draft_tokens=K)
    runs = {}
    for label, method, temperature in CASES:
        if which != "all" and label not in (which, "ar", "ar T=1"):
            continue
        dec = adaptive if label in ADAPTIVE else fixed
        with never_drafting(dec) if label in ADAPTIVE else contextlib.nullcontext():
            runs[label] = run(dec, method, temperature, profile and label == which)
    print("| method | host ms / target call | host ms / drafted token | tokens / call |\n|---|---|---|---|")
    for label, stats in runs.items():
        base = runs["ar T=1" if "T=1" in label else "ar"]
        fields = [host_fields(s, b) for s, b in zip(stats, base, strict=True)]
        per_call = sum(f["host_ms_per_call"] for f in fields) / len(fields)
        drafted = [f["host_ms_per_drafted"] for f in fields if f["host_ms_per_drafted"] is not None]
        per_drafted = f"{sum(drafted) / len(drafted):.3f}" if drafted else "–"
        tokens = sum(s["mean_accepted"] for s in stats) / len(stats)
        print(f"| {label} | {per_call:.3f} | {per_drafted} | {tokens:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all", len(sys.argv) > 2 and sys.argv[2] == "prof")
