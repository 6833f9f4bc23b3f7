"""`anydraft demo`: plain decoding vs anydraft, side by side, on the built-in prompts."""

from __future__ import annotations

import sys

from .errors import AnydraftError
from .models import catalog
from .prompts import builtin_prompts


def run_demo(args) -> int:
    from .decoder import Decoder

    if args.n < 1 or args.max_new_tokens < 1:
        raise AnydraftError("--n and --max-new-tokens must be at least 1")

    for name in (args.target, args.drafter):
        if name in catalog.CATALOG and not catalog.CATALOG[name].installed:
            catalog.install(name, progress=lambda m: print(m, file=sys.stderr))
    dec = Decoder(target=args.target, drafter=args.drafter, method=args.method, dtype=args.dtype,
                  drafter_dtype=args.drafter_dtype, backend=args.target_backend,
                  drafter_backend=args.drafter_backend, device=args.device,
                  progress=lambda m: print(m, file=sys.stderr))
    prompts = [p for p in builtin_prompts() if p["category"] == "code"][: max(1, args.n // 2)]
    prompts += [p for p in builtin_prompts() if p["category"] != "code"][: args.n - len(prompts)]
    methods = ["ar"] if dec.drafter is None else ["ar", dec.draft.method]
    from .hardware import this_machine

    print("\n".join(this_machine().lines()))
    drafter = "none" if dec.drafter is None else f"{args.drafter} ({dec.drafter.path})"
    print(f"target {args.target} ({dec.target.path}), drafter {drafter}, method {args.method}, greedy, "
          f"{args.max_new_tokens} new tokens\n")
    header = f"| {'prompt':<12} | {'method':<11} | {'tokens':>6} | {'seconds':>7} | {'tok/s':>6} | {'speedup':>7} | identical |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for method in methods:  # warm-up: first forward passes read the weights from disk
        dec.generate(prompts[0]["prompt"], max_new_tokens=4, method=method)
    differed, slower = False, 0
    for p in prompts:
        base = None
        for method in methods:
            out = dec.generate(p["prompt"], max_new_tokens=args.max_new_tokens, method=method)
            s = out.stats
            base = base or out
            speedup = base.stats["seconds"] / s["seconds"]
            same = "yes" if out.token_ids == base.token_ids else "NO"
            differed = differed or same == "NO"
            slower += speedup < 1
            print(f"| {p['id']:<12} | {s['method']:<11} | {s['new_tokens']:>6} | {s['seconds']:>7.2f} "
                  f"| {s['tokens_per_s']:>6.1f} | {speedup:>6.2f}x | {same:<9} |", flush=True)
    if differed:
        print(f"\nNO: a target on {dec.target.path} can round a position scored inside a batch "
              "differently than alone, so near ties can flip (README, guarantees); "
              "--target-backend torch --dtype float32 gives identical output.")
    if slower:
        print(why_slower(args.target, dec.target, slower, len(prompts)))
    print(f"\nlast output ({prompts[-1]['id']}):\n{out.text}")
    return 0


def why_slower(spec: str, target, slower: int, prompts: int) -> str:
    """One line on why anydraft was slower than plain decoding somewhere, from the target's
    measured cost curve (cached by ``auto``; measured now otherwise)."""
    from .models.auto import curve_of

    curve = curve_of(spec, target, target.backend)
    return (f"\nslower than plain decoding on {slower} of {prompts} prompts: here ({target.path}) the "
            f"target scores 9 tokens for {curve[9] / curve[1]:.1f}x the cost of one, so a draft pays "
            "only when nearly all of it is accepted; the adaptive policy then mostly decodes "
            "plainly, and the gap is what finding that out cost, plus timing noise. Speculation "
            "pays where verification is flat (a GPU, a CPU with native bfloat16 or AMX): "
            "`anydraft doctor` shows the curves.")
