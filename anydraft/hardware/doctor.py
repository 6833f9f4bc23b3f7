"""`anydraft doctor`: this machine, each model's measured cost curves, and what `auto` chooses."""

from __future__ import annotations

import json
import sys

from . import profile
from .machine import this_machine


def _llamacpp_curve(spec: str, remeasure: bool, progress) -> dict[int, float] | None:
    """The llama.cpp cost curve of a GGUF model (None when not a GGUF or not installed)."""
    import importlib.util

    from ..models.loading import resolve

    if importlib.util.find_spec("llama_cpp") is None or resolve(spec).gguf_file is None:
        return None
    return profile.curves(spec, "llamacpp", ("gguf",), "cpu", progress, remeasure)[0]["gguf"]


def report(models: list[str], device: str = "cpu", progress=None, remeasure: bool = False) -> dict:
    machine = this_machine()
    out = {"machine": machine.lines(), "native_bf16": machine.native_bf16, "models": {}}
    for spec in models:
        curves = profile.curves(spec, "torch", profile.candidates(device), device, progress, remeasure)[0]
        best = profile.fastest(curves)
        paths = {f"torch {d}": c for d, c in curves.items()}
        llama = _llamacpp_curve(spec, remeasure, progress)
        if llama is not None:
            paths["llama.cpp (GGUF as shipped)"] = llama
        out["models"][spec] = {
            "curves_ms": {path: {m: round(s * 1e3, 2) for m, s in c.items()} for path, c in paths.items()},
            "tokens_per_s": {path: round(profile.rate(c), 2) for path, c in paths.items()},
            "dtype_auto": best,
        }
    return out


def print_report(data: dict) -> None:
    print("\n".join(data["machine"]))
    for spec, m in data["models"].items():
        sizes = next(iter(m["curves_ms"].values())).keys()
        print(f"\n{spec}: ms to score M tokens in one call after {profile.CONTEXT} tokens")
        print("| path | " + " | ".join(f"M={s}" for s in sizes) + " | best tokens/s |")
        print("|---|" + "---|" * (len(sizes) + 1))
        for path, curve in m["curves_ms"].items():
            print(f"| {path} | " + " | ".join(f"{v:.1f}" for v in curve.values())
                  + f" | {m['tokens_per_s'][path]:.1f} |")
        print(f"dtype auto -> {m['dtype_auto']}: the most expected tokens per second at the prior "
              "acceptance (0.5 per token), over plain and speculative steps")
        if "llama.cpp (GGUF as shipped)" in m["tokens_per_s"]:
            print(f"fastest path here: {max(m['tokens_per_s'], key=m['tokens_per_s'].get)} (pass --target-backend/--drafter-backend "
                  "llamacpp to use llama.cpp; its quantized weights are a different model)")


def cmd_doctor(args) -> int:
    models = [m for m in (args.target, args.drafter) if m]
    data = report(models, args.device, None if args.json else (lambda m: print(m, file=sys.stderr)),
                  args.remeasure)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print_report(data)
    return 0
