"""Greedy identity with exact scoring (issue 41, docs/exact.md): every method, alone and in one
batch of all the prompts, against plain one-request decoding (method ar, alone) of each prompt
on the same target path. With `--inexact` the same comparison runs without exact too, to show
what exact changes. Writes identity.json and identity.md to --out.

    PYTHONPATH=$PWD python scripts/exact_identity.py --target qwen2.5-coder-1.5b \\
        --backend llamacpp --drafters smollm2-135m,qwen2.5-coder-0.5b --inexact --out DIR

A drafter runs the methods its tokenizer allows (sd needs the target's vocabulary; slem, tli
and slrs work with any); lookup and ar need none. Exit status 1 when an exact run differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from anydraft import Decoder
from anydraft.bench.datasets import load_dataset
from anydraft.bridge import same_tokenizer
from anydraft.hardware import this_machine

CROSS = ("slem", "tli", "slrs", "auto")  # with a drafter of any tokenizer
SAME = ("sd", "auto")  # with a drafter of the target's tokenizer


def decoders(args, exact: bool) -> list[tuple[str | None, Decoder]]:
    """(drafter name, decoder): the target loaded once, then one decoder per drafter on it."""
    first = Decoder(args.target, backend=args.backend, dtype=args.dtype, exact=exact)
    out: list[tuple[str | None, Decoder]] = [(None, first)]
    for name in args.drafters:
        out.append((name, Decoder(first.target.model, tokenizer=first.target.tokenizer, drafter=name,
                                  backend=first.target.backend, drafter_backend=args.drafter_backend,
                                  exact=exact)))
    return out


def run(args, prompts: list[dict], exact: bool) -> dict:
    """{"plain": ids per prompt, "runs": [{method, drafter, mode, identical, seconds}]}."""
    texts = [p["prompt"] for p in prompts]
    pairs = decoders(args, exact)
    plain_dec = pairs[0][1]
    gen = dict(temperature=0.0)
    plain_dec.generate(texts[0], 4, method="ar", **gen)  # warm-up
    start = time.perf_counter()
    plain = [plain_dec.generate(t, args.max_new_tokens, method="ar", **gen).token_ids for t in texts]
    runs = [{"method": "ar", "drafter": None, "mode": "alone", "identical": len(texts),
             "of": len(texts), "seconds": time.perf_counter() - start}]
    for name, dec in pairs:
        if name is None:
            methods = ["ar", "lookup"]
        else:
            same = same_tokenizer(plain_dec.target.tokenizer, dec.drafter.tokenizer)
            methods = list(SAME if same else CROSS)
        for method in methods:
            for mode in ("alone", "batch"):
                if (method, mode) == ("ar", "alone"):
                    continue
                start = time.perf_counter()
                if mode == "alone":
                    got = [dec.generate(t, args.max_new_tokens, method=method, **gen).token_ids for t in texts]
                else:
                    got = [o.token_ids for o in dec.generate_batch(texts, args.max_new_tokens, method=method, **gen)]
                seconds = time.perf_counter() - start
                differ = [p["id"] for p, a, b in zip(prompts, plain, got, strict=True) if a != b]
                runs.append({"method": method, "drafter": name, "mode": mode,
                             "identical": len(texts) - len(differ), "of": len(texts),
                             "differ": differ, "seconds": seconds})
                print(f"{'exact' if exact else 'inexact'} {method} <- {name} {mode}: "
                      f"{len(texts) - len(differ)}/{len(texts)} identical ({seconds:.1f} s)", flush=True)
    return {"path": plain_dec.target.path, "plain": plain, "runs": runs}


def markdown(args, prompts: list[dict], results: dict, machine: list[str]) -> str:
    lines = ["# Greedy identity with exact scoring", "",
             f"- command: `python scripts/exact_identity.py {' '.join(sys.argv[1:])}`",
             *[f"- {line}" for line in machine],
             f"- target {args.target} ({next(iter(results.values()))['path']}); "
             f"{len(prompts)} prompts ({', '.join(p['id'] for p in prompts)}), "
             f"{args.max_new_tokens} new tokens, greedy, chat template; batch = all "
             f"{len(prompts)} prompts in one `generate_batch`",
             "- identical: token ids equal to plain one-request decoding (ar, alone) of the same "
             "prompt with the same exact setting", "",
             "| exact | method | drafter | alone | batch of " + str(len(prompts)) + " | seconds alone / batch |",
             "|---|---|---|---|---|---|"]
    for variant, res in results.items():
        rows: dict[tuple, dict] = {}
        for r in res["runs"]:
            rows.setdefault((r["method"], r["drafter"]), {})[r["mode"]] = r
        for (method, drafter), modes in rows.items():
            cells = [f"{modes[m]['identical']}/{modes[m]['of']}" if m in modes else "–"
                     for m in ("alone", "batch")]
            secs = " / ".join(f"{modes[m]['seconds']:.1f}" if m in modes else "–" for m in ("alone", "batch"))
            lines.append(f"| {variant} | {method} | {drafter or '–'} | {cells[0]} | {cells[1]} | {secs} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--drafters", default="", help="comma-separated drafter names")
    ap.add_argument("--drafter-backend", default="auto")
    ap.add_argument("--dataset", default="spec-bench")
    ap.add_argument("--categories", default="coding,writing,math,reasoning")
    ap.add_argument("--n", type=int, default=2, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--inexact", action="store_true", help="run the same without exact too")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.drafters = [d for d in args.drafters.split(",") if d]
    prompts = load_dataset(args.dataset, args.categories.split(","), args.n)
    machine = this_machine().lines()
    results = {"on": run(args, prompts, exact=True)}
    if args.inexact:
        results["off"] = run(args, prompts, exact=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"argv": sys.argv[1:], "machine": machine, "prompts": [p["id"] for p in prompts]}
    (out / "identity.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "identity.md").write_text(markdown(args, prompts, results, machine))
    print((out / "identity.md").read_text())
    return int(any(r["identical"] < r["of"] for r in results["on"]["runs"]))


if __name__ == "__main__":
    sys.exit(main())
