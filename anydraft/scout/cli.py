"""`anydraft scout`: light at import time (argparse only); the work is imported in `cmd_scout`."""

from __future__ import annotations

import json
import re
import sys

from ..errors import AnydraftError
from ..models.engines import BACKENDS

HELP = """Find the fastest way to decode a target on this machine: each candidate drafter x
backend x method (sd where the tokenizer matches, slem/tli/slrs otherwise, and prompt lookup)
is measured on a few prompts (acceptance per draft position, drafter cost, translation
overhead; the target's cost curve), its speedup predicted with the bound S(a, k, c) at its best
k, and the best three confirmed beside plain decoding, within --budget. Prints a ranked table,
writes JSON (--json), and saves the winner for `--drafter auto` (Decoder(drafter="auto"))."""

METHODS = ("sd", "slem", "tli", "slrs", "lookup")


def register(sub) -> None:
    s = sub.add_parser("scout", help="find the fastest drafter, backend and method for a target here",
                       description=HELP)
    s.add_argument("--target", required=True, help="catalog name, hub id, directory or .gguf")
    which = s.add_mutually_exclusive_group()
    which.add_argument("--drafters", default=None, metavar="A,B,C", help="comma list of drafters")
    which.add_argument("--installed", action="store_true",
                       help="every installed catalog model smaller than the target")
    s.add_argument("--backends", default="torch,llamacpp",
                   help="comma list: the backends each drafter is tried on (llamacpp, ik: GGUF only)")
    s.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma list of the methods to try (default {','.join(METHODS)})")
    s.add_argument("--target-backend", default="auto", choices=("auto", *BACKENDS),
                   help="the target's backend (auto: the faster here, as Decoder chooses)")
    s.add_argument("--dtype", default="auto", help="the target's dtype on torch (auto: the fastest here)")
    s.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    s.add_argument("--dataset", default="builtin", help="builtin | spec-bench | PATH.jsonl")
    s.add_argument("--categories", default=None, help="comma list: only these categories")
    s.add_argument("--n", type=int, default=4, help="prompts, taken from each category in turn")
    s.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt and run")
    s.add_argument("--num-draft-tokens", type=int, default=5,
                   help="the fixed draft length measured, and the longest one predicted")
    s.add_argument("--budget", default="300s", help="wall time for the whole scout: 300s, 5m, 300")
    s.add_argument("--json", default=None, metavar="PATH", help="write the full results here")
    s.add_argument("--no-save", action="store_true", help="do not save the winner for --drafter auto")
    s.set_defaults(func=cmd_scout)


def parse_budget(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min)?\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise AnydraftError(f"--budget takes a positive time such as 300s or 5m, got {text!r}")
    return float(match.group(1)) * (60 if match.group(2) in ("m", "min") else 1)


def _csv(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def choose_drafters(target: str, drafters: str | None, installed: bool) -> list[str]:
    """The drafters to try, each checked (unknown or not installed: the loader's clear error)."""
    from ..models import catalog
    from ..models.loading import resolve

    resolve(target)
    if drafters is None and not installed:
        raise AnydraftError("name the drafters to try: --drafters A,B,C, or --installed for every "
                            "installed catalog model")
    if installed:
        size = catalog.CATALOG[target].size_bytes if target in catalog.CATALOG else float("inf")
        names = [e.name for e in catalog.CATALOG.values()
                 if e.installed and e.name != target and e.size_bytes < size]
        if not names:
            raise AnydraftError(f"no drafter installed for {target}: install a smaller model, e.g. "
                                "`anydraft models install smollm2-135m`, or pass --drafters")
        return names
    names = _csv(drafters)
    if not names:
        raise AnydraftError("--drafters is empty: give e.g. smollm2-135m,gemma3-270m")
    for name in names:
        resolve(name)
        if name == target:
            raise AnydraftError(f"drafter {name} is the target itself: choose a smaller model")
    return names


def pick_prompts(rows: list[dict], n: int) -> list[dict]:
    """``n`` prompts taking each category in turn, so a few prompts still span the set."""
    by_category: dict[str, list[dict]] = {}
    for r in rows:
        by_category.setdefault(r["category"], []).append(r)
    picked, i = [], 0
    while len(picked) < min(n, len(rows)):
        for group in by_category.values():
            if i < len(group) and len(picked) < n:
                picked.append(group[i])
        i += 1
    return picked


def settings_from_args(args):
    from ..bench.runner import parse_backends
    from ..models.loading import parse_dtype, resolve_device
    from .run import ScoutSettings

    budget = parse_budget(args.budget)  # before any model is looked up
    for flag, value, low in (("--n", args.n, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                             ("--num-draft-tokens", args.num_draft_tokens, 1)):
        if value < low:
            raise AnydraftError(f"{flag} must be >= {low}, got {value}")
    methods = _csv(args.methods)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise AnydraftError(f"--methods: choose from {', '.join(METHODS)}, got {args.methods!r}")
    backends = [b for b in parse_backends(args.backends, "--backends") if b != "auto"]
    if not backends:
        raise AnydraftError(f"--backends: name one or more of {', '.join(BACKENDS)}")
    parse_dtype(args.dtype, allow_auto=True)
    return ScoutSettings(
        target=args.target, drafters=choose_drafters(args.target, args.drafters, args.installed),
        backends=backends, methods=methods, target_backend=args.target_backend, dtype=args.dtype,
        device=resolve_device(args.device), num_draft_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens, budget=budget)


def _fmt(v, spec=".2f", suffix="") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def table(rows: list[dict]) -> str:
    head = ["rank", "drafter", "backend", "method", "a", "c", "k", "predicted", "measured",
            "identical", "why not chosen"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for i, r in enumerate(rows, 1):
        c, m = r["candidate"], r.get("measurement")
        lines.append("| " + " | ".join([
            str(i), c.drafter or "–", c.backend or "–", c.method,
            _fmt(m.a if m else None), _fmt(m.c if m else None, ".3f"), _fmt(r["k"], "d"),
            _fmt(r["predicted"], ".2f", "x"), _fmt(r["measured"], ".2f", "x"), r["identical"] or "–",
            "**winner**" if r["why"] == "winner" else r["why"]]) + " |")
    return "\n".join(lines)


def row_json(r: dict) -> dict:
    c, m = r["candidate"], r.get("measurement")
    out = {"label": c.label, "drafter": c.drafter, "backend": c.backend, "method": c.method,
           "status": r["status"], "same_tokenizer": r.get("same_tokenizer"), "overlap": r.get("overlap"),
           "a": None, "a_per_position": None, "c": None, "overhead": None, "drafting_share": None,
           "k": r["k"], "predicted": r["predicted"], "predicted_by_k": r.get("by_k"),
           "measured": r["measured"], "identical": r["identical"], "why": r["why"], "stats": None}
    if m is not None:
        out.update(a=m.a, a_per_position=m.a_per_position, c=m.c, overhead=m.o,
                   drafting_share=m.q, seconds=m.seconds, stats=m.stats)
    return out


def cmd_scout(args) -> int:
    from pathlib import Path

    from .. import scouted
    from ..bench.datasets import load_dataset
    from ..bench.report import machine_info
    from ..hardware import this_machine
    from ..options import command_line
    from .rank import ranked
    from .run import Scout

    settings = settings_from_args(args)
    budget = settings.budget
    categories = _csv(args.categories) if args.categories else None
    prompts = pick_prompts(load_dataset(args.dataset, categories), args.n)
    out = Path(args.json) if args.json else None
    if out is not None and not out.parent.is_dir():
        raise AnydraftError(f"--json: directory {out.parent} does not exist")

    def say(msg):
        print(msg, file=sys.stderr, flush=True)

    for line in this_machine().lines():
        say(line)
    result = Scout(settings, prompts, say).run()
    rows, win = ranked(result["rows"], result["confirmed"] > 0, result["verify_costs"])
    choice = win or next(r for r in rows if r["why"] == "winner")
    c = choice["candidate"]
    record = {"drafter": c.drafter, "drafter_backend": c.backend, "method": c.method,
              "num_draft_tokens": choice["k"], "predicted": choice["predicted"],
              "measured": choice["measured"], "target_backend": result["target_backend"],
              "target_dtype": result["target_dtype"], "results": str(out.resolve()) if out else None}
    print(f"# anydraft scout: {settings.target} ({result['target_backend']}"
          f"{' ' + result['target_dtype'] if result['target_dtype'] else ''}), "
          f"{result['seconds']:.0f} s of a {budget:.0f} s budget\n")
    print(table(rows))
    path = None if args.no_save else scouted.save(settings.target, record)
    if path is not None:
        say(f"saved: Decoder(target={settings.target!r}, drafter=\"auto\") and `anydraft serve "
            f"--target {settings.target} --drafter auto` now use "
            f"{c.label if c.drafter else 'no drafter (' + c.label + ')'} ({path})")
    if out is not None:
        report = {"meta": {"command": command_line(args), "machine": machine_info(settings.device),
                           "settings": {**vars(settings), "budget": budget,
                                        "prompts": [p["id"] for p in prompts]}},
                  "target": {k: result[k] for k in ("target_backend", "target_dtype", "plain_step",
                                                    "curve", "verify_costs")},
                  "seconds": result["seconds"], "confirmed_prompts": result["confirmed"],
                  "candidates": [row_json(r) for r in rows], "winner": record,
                  "saved": str(path) if path else None}
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        say(f"wrote {out}")
    return 0
