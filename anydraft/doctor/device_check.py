"""The GPU check's sections (scripts/gpu_check.sh runs this): synthetic models only, no files.

    python -m anydraft.doctor.device_check --out DIR [--cpu-dry-run] [--budget SECONDS]

Sections, in this order (the cheapest and most needed first; each one is written to
DIR/results.json and DIR/summary.md as soon as it ends, so a run cut short keeps what it did):
machine; exactness (float32, TF32 off: every method token-identical to plain decoding on
synthetic pairs); host overhead (null models); cost curves T(M), M = 1..33, of the target
shapes in bfloat16, eager, and each drafter's step; replay speed (methods/replay.py) at
a = 0.6 / 0.8 / 0.9 beside plain decoding on the same path; batched throughput at 1 / 8 / 32
rows; the compiled (CUDA graphs) curves last, as their compiling is the least predictable.
A section that would start after ``--budget`` seconds is skipped, and says so.

``--cpu-dry-run``: the same sections on the CPU with the tiny shapes (models/synthetic/
``:tiny``) and fewer tokens, in a minute or two: the check is proven before any GPU comes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

TARGETS = ("qwen2.5-7b", "llama3.1-8b")
DRAFTERS = ("qwen2.5-0.5b", "smollm2-135m", "gemma3-270m")
MAIN, SAME, OTHER = "qwen2.5-7b", "qwen2.5-0.5b", "smollm2-135m"  # the replay's pairs
PROMPTS = ("Write a haiku about the sea.", "Explain what a hash map is, briefly.")
ACCEPTANCES = (0.6, 0.8, 0.9)
ROWS = (1, 8, 32)
K = 5  # draft tokens: fixed, so the replays' speeds compare at one draft length
# tokens per run, and the cost curves' sizes: (GPU, CPU dry run)
TOKENS = {"gpu": 96, "cpu": 16}
EXACT_TOKENS = 48  # per exactness run on a GPU: 22 runs of a 7B shape in float32
CURVE_SIZES = tuple(range(1, 34))
COMPILED_SIZES = (1, 4, 8, 9)  # buckets 1, 4, 8, 16 (models/static.py): four compiles a model
BUDGET = 200  # seconds before the last section may start: the whole check ends within 5 minutes


class Check:
    def __init__(self, out: Path, dry: bool, budget: float):
        self.out, self.dry, self.budget, self.start = out, dry, budget, time.perf_counter()
        self.device = "cpu" if dry else "cuda"
        self.tokens = TOKENS["cpu" if dry else "gpu"]
        self.results: dict = {"dry_run": dry, "sections": {}}
        self.failed = False

    def spec(self, name: str, kind: str = "synthetic") -> str:
        return f"{kind}:{name}" + (":tiny" if self.dry and kind == "synthetic" else "")

    def run(self, name: str, fn) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed > self.budget:
            entry = {"status": f"skipped: {elapsed:.0f} s of the {self.budget:.0f} s budget used"}
        else:
            began = time.perf_counter()
            try:
                entry = {"status": "ok", **fn()}
                if entry.get("failed"):
                    entry["status"] = "FAILED"
            except Exception as exc:  # a section's failure is its result; the others still run
                entry = {"status": f"error: {type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()}
            entry["seconds"] = round(time.perf_counter() - began, 1)
            self.failed |= entry["status"] != "ok"
            _free()
        self.results["sections"][name] = entry
        print(f"== {name}: {entry['status']} ({entry.get('seconds', 0)} s)", flush=True)
        self.write()

    def write(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1) + "\n")
        (self.out / "summary.md").write_text(summary(self.results))


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def machine(check: Check) -> dict:
    import torch
    import transformers

    from ..hardware.machine import this_machine

    out = {"lines": this_machine().lines(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                           timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["nvidia_smi"] = None
    if not check.dry and not torch.cuda.is_available():
        out["failed"] = "torch sees no CUDA device"
    return out


def exactness(check: Check) -> dict:
    """Greedy, float32, TF32 off: each method's tokens against plain decoding's."""
    import torch

    from ..decoder import Decoder
    from ..models.backends import load

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    target = load(check.spec(MAIN), dtype="float32", device=check.device)
    runs, bad, tokens = [], 0, min(check.tokens, EXACT_TOKENS)
    for drafter, methods in ((SAME, ("sd", "auto")), (OTHER, ("slem", "tli", "slrs", "auto")),
                             ("gemma3-270m", ("slem", "tli"))):
        dec = Decoder(target.model, check.spec(drafter), tokenizer=target.tokenizer,
                      dtype="float32", device=check.device, num_draft_tokens=K, adaptive=False)
        for prompt in PROMPTS:
            plain = dec.generate(prompt, tokens, method="ar").token_ids
            for method in methods:
                same = dec.generate(prompt, tokens, method=method).token_ids == plain
                bad += not same
                runs.append({"drafter": drafter, "method": method, "identical": same})
        del dec
    return {"runs": runs, "identical": f"{len(runs) - bad}/{len(runs)}",
            **({"failed": f"{bad} run(s) differ from plain decoding"} if bad else {})}


def host(check: Check) -> dict:
    """Null models (models/null.py), Qwen2.5's 151,936 logits <- SmolLM2's: anydraft's own time."""
    from ..bench.host import host_fields
    from ..decoder import Decoder

    dec = Decoder(check.spec(SAME, "null"), check.spec(OTHER, "null"), num_draft_tokens=K,
                  adaptive=False)
    runs = {}
    for label, method, temperature in (("ar", "ar", 0.0), ("slem", "slem", 0.0),
                                       ("tli T=1", "tli", 1.0), ("slrs T=1", "slrs", 1.0),
                                       ("ar T=1", "ar", 1.0)):
        dec.generate(PROMPTS[0], 8, method=method, temperature=temperature, seed=0)  # warm-up
        runs[label] = [dec.generate(p, 128, method=method, temperature=temperature, seed=0).stats
                       for p in PROMPTS]
    out = {}
    for label, stats in runs.items():
        base = runs["ar T=1" if "T=1" in label else "ar"]
        fields = [host_fields(s, b) for s, b in zip(stats, base, strict=True)]
        out[label] = {key: _mean([f[key] for f in fields]) for key in ("host_ms_per_call", "host_ms_per_drafted")}
        out[label]["tokens_per_call"] = _mean([s["mean_accepted"] for s in stats])
    return {"vocabularies": [151_936, 49_152], "k": K, "runs": out,
            "goal": "greedy slem: <= 0.3 ms per target call + <= 0.1 ms per drafted token"}


def _mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def curves(check: Check, compiled: bool = False) -> dict:
    """T(M) in ms for the targets, and each drafter's one-token step (bfloat16)."""
    from ..hardware.profile import measure
    from ..models.backends import load

    dtype = "bfloat16+compile" if compiled else "bfloat16"
    sizes = COMPILED_SIZES if compiled else CURVE_SIZES
    out = {}
    for name in TARGETS + DRAFTERS:
        if compiled and name == "gemma3-270m":
            out[name] = "not compiled: sliding-window layers (models/static.py keeps full attention only)"
            continue
        loaded = load(check.spec(name), dtype=dtype, device=check.device)
        curve = measure({dtype: loaded}, sizes if name in TARGETS else (1,), repeats=3)[dtype]
        out[name] = {m: round(s * 1e3, 3) for m, s in curve.items()}
        del loaded
        _free()
    for name in TARGETS:
        if isinstance(out[name], dict) and 9 in out[name]:
            out[name + " T(9)/T(1)"] = round(out[name][9] / out[name][1], 3)
    return {"dtype": dtype, "ms": out}


def generate_replayed(decoder, prompt, max_new_tokens: int, method: str, a: float, *,
                      chat: bool = True, seed: int = 0, reference: list[int] | None = None):
    """``method`` (sd, slem, tli, slrs) on ``decoder`` with its drafts replayed at acceptance
    ``a`` (methods/replay.py `Replay`): ``(output, plain output)``; the plain pass is run first
    unless its ``reference`` token ids are given (then the plain output is None)."""
    from ..decoding import Batch
    from ..methods.replay import Replay

    plain = None
    if reference is None:
        plain = decoder.generate(prompt, max_new_tokens, chat=chat, method="ar")
        reference = plain.token_ids
    generation = decoder.start(prompt, max_new_tokens, chat=chat, method=method)
    generation.method = Replay(generation.method, reference, a, seed)
    batch = Batch()
    batch.join(generation)
    while batch:
        batch.run_once()
    return generation.result()[1], plain


def replays(check: Check) -> dict:
    """Speed at a known acceptance: each method's drafts replayed at a, beside plain decoding."""
    from ..decoder import Decoder
    from ..methods.replay import label
    from ..models.backends import load

    target = load(check.spec(MAIN), dtype="bfloat16", device=check.device)
    out = {}
    for drafter, methods in ((OTHER, ("slem", "tli", "slrs")), (SAME, ("sd",))):
        dec = Decoder(target.model, check.spec(drafter), tokenizer=target.tokenizer,
                      dtype="bfloat16", device=check.device, num_draft_tokens=K, adaptive=False)
        dec.generate(PROMPTS[0], 8, method="ar")  # warm-up
        plain = dec.generate(PROMPTS[0], check.tokens, method="ar")
        out[f"ar <- {drafter}"] = {"tokens_per_s": round(plain.stats["tokens_per_s"], 2)}
        for method in methods:
            for a in ACCEPTANCES:
                got = generate_replayed(dec, PROMPTS[0], check.tokens, method, a,
                                        reference=plain.token_ids)[0]
                s = got.stats
                out[f"{method} <- {drafter}, {label(a)}"] = {
                    "identical": got.token_ids == plain.token_ids,
                    "tokens_per_s": round(s["tokens_per_s"], 2),
                    "speedup": round(s["tokens_per_s"] / plain.stats["tokens_per_s"], 3),
                    "acceptance": round(s["acceptance_rate"], 3),
                    "tokens_per_call": round(s["mean_accepted"], 3),
                    "host_share": round(s["host_seconds"] / s["seconds"], 3)}
        del dec
    bad = [k for k, v in out.items() if v.get("identical") is False]
    return {"path": "bfloat16, eager", "k": K, "runs": out,
            **({"failed": f"differ from plain decoding: {', '.join(bad)}"} if bad else {})}


def batched(check: Check) -> dict:
    """Plain decoding of 1 / 8 / 32 prompts together: tokens per second over all rows."""
    from ..decoder import Decoder

    dec = Decoder(check.spec(MAIN), dtype="bfloat16", device=check.device)
    dec.generate_batch(list(PROMPTS), 4, method="ar")  # warm-up
    out = {}
    for rows in ROWS:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
        began = time.perf_counter()
        outputs = dec.generate_batch(prompts, check.tokens, method="ar")
        seconds = time.perf_counter() - began
        out[rows] = round(sum(len(o.token_ids) for o in outputs) / seconds, 1)
    return {"method": "ar", "tokens_per_s_by_rows": out}


def summary(results: dict) -> str:
    lines = ["# anydraft GPU check" + (" (CPU dry run: tiny shapes)" if results["dry_run"] else ""),
             "", "Synthetic models only (models/synthetic/): random weights of real shapes, speeds "
             "of shapes, not of trained models; replays (methods/replay.py) give the acceptance.", ""]
    for name, entry in results["sections"].items():
        lines += [f"## {name}: {entry['status']} ({entry.get('seconds', 0)} s)", ""]
        body = {k: v for k, v in entry.items() if k not in ("status", "seconds", "traceback")}
        lines += ["```", json.dumps(body, indent=1), "```", ""]
    return "\n".join(lines)


SECTIONS = (("machine", machine), ("exactness", exactness), ("host overhead", host),
            ("cost curves", curves), ("replay speed", replays), ("batched throughput", batched),
            ("compiled cost curves", lambda check: curves(check, compiled=True)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anydraft.doctor.device_check")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--budget", type=float, default=BUDGET)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.cpu_dry_run, args.budget)
    for name, fn in SECTIONS:
        if check.dry and name == "compiled cost curves":
            check.results["sections"][name] = {
                "status": "skipped: CPU dry run (compiling takes minutes on a CPU)"}
            print(f"== {name}: skipped (CPU dry run)", flush=True)
            check.write()
            continue
        check.run(name, lambda fn=fn: fn(check))
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
