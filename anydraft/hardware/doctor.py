"""`anydraft doctor`: this machine, each model's measured cost curves, and what `auto` chooses."""

from __future__ import annotations

import json
import sys

from . import profile
from .machine import this_machine

LLAMACPP = "llama.cpp (GGUF as shipped)"  # the path name doctor prints


def _llamacpp_curve(spec: str, remeasure: bool, progress) -> dict[int, float] | None:
    """The llama.cpp cost curve of a GGUF model (None when llama.cpp cannot run it here)."""
    if not profile.llamacpp_runs(spec):
        return None
    return profile.curves(spec, "llamacpp", ("gguf",), "cpu", progress, remeasure)[0]["gguf"]


def report(models: list[str], device: str = "auto", progress=None, remeasure: bool = False,
           compile: bool = False) -> dict:
    from ..models.loading import resolve_device

    device = resolve_device(device)  # curves are keyed by "cpu" or "cuda", never "auto"
    machine = this_machine()
    out = {"machine": machine.lines(), "native_bf16": machine.native_bf16, "device": device,
           "models": {}}
    for spec in models:
        paths = profile.torch_paths(spec, device, compile)
        curves = profile.curves(spec, "torch", paths, device, progress, remeasure)[0]
        best = profile.fastest(curves)
        paths = {f"torch {d}": c for d, c in curves.items()}
        llama = _llamacpp_curve(spec, remeasure, progress)
        if llama is not None:
            paths[LLAMACPP] = llama
        as_target, as_drafter = (
            LLAMACPP if llama and profile.prefer_llamacpp(role, llama, curves[best]) else f"torch {best}"
            for role in ("target", "drafter"))
        out["models"][spec] = {
            "curves_ms": {path: {m: round(s * 1e3, 2) for m, s in c.items()} for path, c in paths.items()},
            "tokens_per_s": {path: round(profile.rate(c), 2) for path, c in paths.items()},
            "dtype_auto": best,
            "backend_auto": {"target": as_target, "drafter": as_drafter},
        }
    return out


def print_report(data: dict) -> None:
    print("\n".join(data["machine"]))
    print(f"device: {data['device']} (torch models; llama.cpp runs on the CPU)")
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
        auto = m["backend_auto"]
        print(f"backend auto -> as a target: {auto['target']} (the same rule); as a drafter: "
              f"{auto['drafter']} (the cheaper one-token step)")


def cmd_doctor(args) -> int:
    models = [m for m in (args.target, args.drafter) if m]
    data = report(models, args.device, None if args.json else (lambda m: print(m, file=sys.stderr)),
                  args.remeasure, args.compile)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print_report(data)
    return 0
