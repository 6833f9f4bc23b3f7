"""Host overhead on null models (issue 39), as `anydraft.hardware.device_check.host` measures it:
Qwen2.5's 151,936 logits <- SmolLM2's 49,152, k = 5 fixed, 2 prompts x 128 tokens per method.

    PYTHONPATH=$PWD python scripts/host_overhead.py            # one table (this checkout)
    PYTHONPATH=$PWD python scripts/host_overhead.py slem prof  # and cProfile of one method's runs
"""

import cProfile
import pstats
import sys

from anydraft.bench.host import host_fields
from anydraft.decoder import Decoder
from anydraft.hardware.device_check import PROMPTS, K

CASES = (("ar", "ar", 0.0), ("slem", "slem", 0.0), ("ar T=1", "ar", 1.0), ("tli T=1", "tli", 1.0),
         ("slrs T=1", "slrs", 1.0))
TOKENS = 128


def main(which: str = "all", profile: bool = False) -> None:
    dec = Decoder("null:qwen2.5-0.5b", "null:smollm2-135m", num_draft_tokens=K, adaptive=False)
    runs = {}
    for label, method, temperature in CASES:
        if which != "all" and label not in (which, "ar", "ar T=1"):
            continue
        dec.generate(PROMPTS[0], 8, method=method, temperature=temperature, seed=0)  # warm-up
        profiler = cProfile.Profile() if profile and label == which else None
        if profiler:
            profiler.enable()
        runs[label] = [dec.generate(p, TOKENS, method=method, temperature=temperature, seed=0).stats
                       for p in PROMPTS]
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
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
