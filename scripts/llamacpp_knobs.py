"""Does any llama.cpp setting flatten a model's cost curve on this machine? (issue 18)

Measures the seconds to score M tokens in one call after 200 (hardware/profile.py's `measure`)
for each GGUF given, with the thread count and the flash-attention mode varied one at a time
from anydraft's defaults (every core, llama.cpp's "auto"). Batches are at most 33 tokens here,
far below the context's n_batch = n_ubatch = 512, so those two cannot matter for
verification. Writes knobs.json and knobs.md to --out.

    .venv/bin/python scripts/llamacpp_knobs.py qwen2.5-coder-1.5b ~/.cache/anydraft/quantized/*.gguf
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from anydraft.hardware import this_machine
from anydraft.hardware.profile import SIZES, measure
from anydraft.models import llamacpp
from anydraft.models.backends import load

FLASH = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type


def settings(cores: int) -> list[tuple[int, str]]:
    """(threads, flash attention) pairs: the defaults, then one setting changed at a time."""
    return [(cores, "auto"), (1, "auto"), (cores, "off"), (cores, "on")]


def patch(flash: int, threads: int) -> None:
    """Make every llama.cpp context created from now on use ``flash`` and ``threads``."""
    lib = llamacpp._lib()
    real = getattr(lib, "_anydraft_real_params", lib.llama_context_default_params)
    lib._anydraft_real_params = real

    def params():
        p = real()
        p.flash_attn_type = flash
        return p

    lib.llama_context_default_params = params
    llamacpp._threads = lambda: threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="catalog names or .gguf paths")
    parser.add_argument("--out", default="llamacpp-knobs")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    results = []
    for spec in args.models:
        loaded = load(spec, "llamacpp", role="target")
        for threads, flash in settings(cores):
            patch(FLASH[flash], threads)
            for context in loaded.model._spare:  # contexts made with the previous setting
                context.free()
            loaded.model._spare = []
            curve = measure({"m": loaded})["m"]
            results.append({"model": Path(spec).name, "threads": threads, "flash_attn": flash,
                            "ms": {m: round(s * 1000, 1) for m, s in curve.items()}})
            print(results[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = this_machine()
    (out / "knobs.json").write_text(json.dumps({"machine": machine.lines(), "results": results}, indent=1))
    head = "| model | threads | flash attention | " + " | ".join(f"M={m}" for m in SIZES) + " | 2 tokens / 1 |"
    lines = ["# llama.cpp settings against the cost curve", "", *[f"- {line}" for line in machine.lines()],
             "- command: `.venv/bin/python scripts/llamacpp_knobs.py " + " ".join(args.models) + "`",
             "", "ms to score M tokens in one call after 200 (median of 3)", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {r['threads']} | {r['flash_attn']} | "
                     + " | ".join(f"{ms[m]:.0f}" for m in SIZES) + f" | {ms[2] / ms[1]:.2f}x |")
    (out / "knobs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
