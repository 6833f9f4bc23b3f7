"""What a benchmark leaves behind: results.json (meta + rows) and summary.md (the tables)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path

from .bound import best_bound, median, per_token_acceptance
from .host import host_lines, synthetic_models
from .llama_server import SERVERS
from .runner import backend_sides, label, path_backend

# speedup_vs_ar, decode_speedup_vs_ar (after the target's first call, which takes prefill_seconds),
# cost_ratio and identical_to_ar compare with AR on the row's own target path (target_backend,
# "+exact" for an exact path: runner.target_path);
# speedup_vs_fastest_plain with the plain decoding that ran fastest (meta settings.fastest_plain:
# AR on some target backend, or llama-server); speedup_vs_llama_server and
# decode_speedup_vs_llama_server with llama.cpp's own server (None without --baseline llama-server);
# *_backend: torch | llamacpp, the target's with "+exact" where it scored exactly (exact: True)
# (drafter_backend None without a drafter); speedup_vs_not_exact, decode_speedup_vs_not_exact:
# an exact row against the same run without exact (None unless --exact both);
# mismatch_at / mismatch_margin: for a greedy run that differs from AR, the first differing new
# token and the target's logit margin there (runner.divergence)
ROW_KEYS = (
    "prompt_id", "category", "method", "drafter", "target_backend", "drafter_backend", "exact",
    "new_tokens", "seconds", "prefill_seconds", "tokens_per_s", "speedup_vs_ar", "decode_speedup_vs_ar",
    "speedup_vs_fastest_plain", "speedup_vs_llama_server", "decode_speedup_vs_llama_server",
    "speedup_vs_hf", "speedup_vs_not_exact", "decode_speedup_vs_not_exact",
    "acceptance", "acceptance_per_token", "mean_accepted", "draft_seconds", "target_seconds",
    "translate_seconds", "cost_ratio", "bound", "identical_to_ar", "mismatch_at", "mismatch_margin",
)


def machine_info(device: str = "cpu") -> dict:
    import torch
    import transformers

    from .. import __version__ as anydraft_version
    from ..hardware import this_machine

    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
        "python": platform.python_version(),
        "versions": {"anydraft": anydraft_version, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "git_commit": _git_commit(),
        "hardware": this_machine().lines(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _git_commit() -> str | None:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def build_meta(settings, command: str, prompts: list[dict], dataset: str) -> dict:
    return {
        "machine": machine_info(settings.device),
        "command": command,
        "settings": settings.to_dict() | {"dataset": dataset, "prompts": len(prompts),
                                          "categories": sorted({p["category"] for p in prompts})},
        "notes": list(settings.notes),
        # what each synthetic model is (random weights, or none): its speeds are not a model's
        "synthetic": synthetic_models(settings),
    }


def write_results(out_dir: Path, meta: dict, rows: list[dict]) -> Path:
    """results.json: meta, what exact costs (`exact_costs`, [] unless --exact both), the rows."""
    path = out_dir / "results.json"
    data = {"meta": meta, "exact_costs": exact_costs(rows), "results": rows}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def exact_costs(rows: list[dict]) -> list[dict]:
    """What exact scoring costs, one entry per exact run (label) that also ran without exact on
    the same target backend (--exact both): median tokens/s of both, and the medians over
    prompts of exact tokens/s over plain tokens/s on the same prompt (decode: after the
    target's first call, the prompt read, which exact makes dearer)."""
    name = labeller(rows)

    def key(r, path):
        return r["prompt_id"], path, r["drafter"], r["drafter_backend"], r["method"]

    plain = {key(r, r["target_backend"]): r for r in rows if not r.get("exact")}
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("speedup_vs_not_exact") is not None:
            groups.setdefault(name(r), []).append(r)
    out = []
    for lab, group in groups.items():
        base = [plain[key(r, path_backend(r["target_backend"])[0])] for r in group]
        first = group[0]
        out.append({
            "label": lab, "method": first["method"], "target_backend": first["target_backend"],
            "drafter": first["drafter"], "drafter_backend": first["drafter_backend"],
            "prompts": len(group),
            "tokens_per_s_not_exact": median(r["tokens_per_s"] for r in base),
            "tokens_per_s_exact": median(r["tokens_per_s"] for r in group),
            "speedup_vs_not_exact": median(r["speedup_vs_not_exact"] for r in group),
            "decode_speedup_vs_not_exact": median(r["decode_speedup_vs_not_exact"] for r in group),
        })
    return out


def _exact_cost_lines(costs: list[dict]) -> list[str]:
    if not costs:
        return []
    lines = ["## What exact costs", "",
             "Each exact run (`+exact`) against the same run without exact scoring, in the same "
             "interleaved rounds: per prompt, its tokens/s over the plain run's; the median over "
             "prompts (below 1: exact is slower).", "",
             "| method | prompts | median tok/s not exact | median tok/s exact | "
             "exact / not exact | decode: exact / not exact |", "|---|---|---|---|---|---|"]
    for c in costs:
        cells = [c["label"], str(c["prompts"]), _fmt(c["tokens_per_s_not_exact"], ".1f"),
                 _fmt(c["tokens_per_s_exact"], ".1f"), _fmt(c["speedup_vs_not_exact"], ".2f", "x"),
                 _fmt(c["decode_speedup_vs_not_exact"], ".2f", "x")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def mismatches(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["identical_to_ar"] is False]


def labeller(rows: list[dict]) -> Callable[[dict], str]:
    """row -> its label (runner.label), naming a side's backend when that side is not all torch."""
    sides = backend_sides({r["target_backend"] for r in rows},
                          {r["drafter_backend"] for r in rows if r["drafter"] is not None})
    return lambda r: label(r["method"], r["drafter"], r["target_backend"], r["drafter_backend"], sides)


def several_plain(rows: list[dict]) -> bool:
    """Whether more than one plain decoding ran (AR on several target backends, llama-server)."""
    return len({(r["method"], r["target_backend"]) for r in rows
                if r["method"] in ("ar", *SERVERS)}) > 1


def has_server(rows: list[dict]) -> bool:
    return any(r["method"] == "llama-server" for r in rows)


def aggregate(rows: list[dict], k: int) -> dict:
    """Numbers of one group of rows (same method, drafter and backends): see `write_summary`."""
    drafted = sum(r["drafted"] or 0 for r in rows)
    accepted = sum(r["accepted"] or 0 for r in rows)
    calls = sum(r["target_calls"] or 0 for r in rows)
    rate = accepted / drafted if drafted else None
    a = per_token_acceptance(accepted, sum(r["rejected"] or 0 for r in rows))
    c = median(r["cost_ratio"] for r in rows)
    identical = [r["identical_to_ar"] for r in rows if r["identical_to_ar"] is not None]
    return {
        "prompts": len(rows),
        "identical": f"{sum(identical)}/{len(identical)}" if identical else "n/a",
        "mismatch": identical.count(False),
        "tokens_per_s": median(r["tokens_per_s"] for r in rows),
        "speedup_vs_ar": median(r["speedup_vs_ar"] for r in rows),
        "decode_speedup_vs_ar": median(r["decode_speedup_vs_ar"] for r in rows),
        "speedup_vs_fastest_plain": median(r["speedup_vs_fastest_plain"] for r in rows),
        "speedup_vs_llama_server": median(r["speedup_vs_llama_server"] for r in rows),
        "decode_speedup_vs_llama_server": median(r["decode_speedup_vs_llama_server"] for r in rows),
        "speedup_vs_hf": median(r["speedup_vs_hf"] for r in rows),
        "acceptance": rate, "a": a,
        "mean_accepted": sum(r["new_tokens"] for r in rows) / calls if calls else None,
        "c": c,
        "bound": best_bound(a, k, c, rows[0].get("verify_costs")) if a is not None and c is not None else None,
    }


def _fmt(v, spec=".2f", suffix="") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def _table(groups: dict, key_cols: list[str], vs_fastest: bool = False, vs_server: bool = False) -> list[str]:
    head = key_cols + ["prompts", "identical to AR", "median tok/s", "speedup vs AR"]
    head += ["speedup vs fastest plain"] * vs_fastest
    head += ["speedup vs llama-server", "decode speedup vs llama-server"] * vs_server + [
        "speedup vs hf", "acceptance", "a (per token)", "tokens / target call",
        "c (draft/target step)", "decode speedup", "bound S(a,k,c)", "decode / bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for key, g in groups.items():
        ident = g["identical"] if not g["mismatch"] else f"**NO: {g['identical']}**"
        decode = g["decode_speedup_vs_ar"]
        ratio = decode / g["bound"] if g["bound"] and decode else None
        cells = list(key) + [
            str(g["prompts"]), ident, _fmt(g["tokens_per_s"], ".1f"), _fmt(g["speedup_vs_ar"], ".2f", "x"),
        ] + [_fmt(g["speedup_vs_fastest_plain"], ".2f", "x")] * vs_fastest + [
            _fmt(g["speedup_vs_llama_server"], ".2f", "x"),
            _fmt(g["decode_speedup_vs_llama_server"], ".2f", "x")] * vs_server + [
            _fmt(g["speedup_vs_hf"], ".2f", "x"),
            _fmt(g["acceptance"], ".3f"), _fmt(g["a"], ".3f"), _fmt(g["mean_accepted"], ".2f"),
            _fmt(g["c"], ".3f"), _fmt(decode, ".2f", "x"), _fmt(g["bound"], ".2f", "x"),
            _fmt(ratio, ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def group_rows(rows: list[dict], by_category: bool) -> dict:
    """(category?, label) -> rows, in the order of first appearance."""
    name = labeller(rows)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["category"],) if by_category else ()
        groups.setdefault(key + (name(r),), []).append(r)
    return groups


def write_summary(out_dir: Path, meta: dict, rows: list[dict], plots: list[str]) -> Path:
    s = meta["settings"]
    k = s["num_draft_tokens"]
    m = meta["machine"]
    name, cols = labeller(rows), (several_plain(rows), has_server(rows))
    backends = ("" if [s["target_backends"], s["drafter_backends"]] == [["torch"]] * 2 else
                f", backends: target {','.join(s['target_backends'])}, "
                f"drafter {','.join(s['drafter_backends'])}")
    draft = f"adaptive draft length k <= {k}" if s["adaptive"] else f"k = {k} draft tokens"
    sampling = ("greedy" if s["temperature"] == 0 else
                f"temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}, "
                f"min-p {s['min_p']}, seed {s['seed']}")
    lines = [
        f"# anydraft bench: {s['target']} <- {', '.join(s['drafters']) or '(no drafter)'}",
        "",
        f"- command: `{meta['command']}`",
        f"- machine: {m['platform']}, {m['processor']}, {m['cpu_count']} CPUs "
        f"({m['torch_threads']} torch threads), device {m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}",
        *(f"- {line}" for line in m.get("hardware", [])),
        f"- versions: anydraft {m['versions']['anydraft']} ({m['git_commit'] or 'no git'}), "
        f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}, "
        f"Python {m['python']}; {m['date']}",
        f"- settings: dataset {s['dataset']} ({s['prompts']} prompts: {', '.join(s['categories'])}), "
        f"{sampling}, {s['max_new_tokens']} new tokens, dtype {s['dtype']}"
        f"{', drafter ' + s['drafter_dtype'] if s['drafter_dtype'] else ''}{backends}, {draft}, "
        f"chat template {s['chat']}, {s['repeats']} repeat(s) (median), warm-up {'on' if s['warmup'] else 'off'}"
        f"{', busy cores ' + str(s['busy_cores']) if s.get('busy_cores') else ''}"
        f"{', exact ' + s['exact'] if s.get('exact', 'off') != 'off' else ''}",
        "",
    ]
    if meta.get("synthetic"):
        lines += ["**Synthetic models: speeds of shapes, not of trained models; their text is "
                  "noise.**", "", *(f"- {line}" for line in meta["synthetic"]), ""]
    bad = mismatches(rows)
    if bad:
        lines += ["## !!! GREEDY MISMATCH: output differs from plain decoding (AR) !!!", "",
                  "A lossless method must reproduce AR token for token under greedy decoding. "
                  "These runs did not:", ""]
        lines += [f"- **{name(r)}** on `{r['prompt_id']}` ({r['category']})" + (
            "" if r.get("mismatch_at") is None else f": from new token {r['mismatch_at']}" + (
                "" if r.get("mismatch_margin") is None else
                f"; there the target, replaying plain decoding, prefers AR's token by "
                f"{r['mismatch_margin']:.3f} logits")) for r in bad]
        lines += ["", "A margin of about the logits' rounding step (bfloat16 logits near 20 are "
                  "0.125 apart; 0 is an exact tie) is a near tie that the target resolves "
                  "differently when it scores the position inside a batch (verification) than "
                  "one token at a time (plain decoding): the target's numerics, not the method "
                  "(transformers' own assisted generation, `hf`, shows the same). The float32 "
                  "exactness tests do not see it; a clear margin would be a bug. On an exact "
                  "path (`+exact`) no margin excuses it: any mismatch there is a bug.", ""]
    lines += ["## Per method (all prompts)", ""]
    if cols[0]:
        lines += [f"Fastest plain decoding here: **{s.get('fastest_plain')}**.", ""]
    lines += _table({key: aggregate(v, k) for key, v in group_rows(rows, False).items()}, ["method"],
                    *cols)
    lines += [""] + _exact_cost_lines(exact_costs(rows))
    lines += ["## Per category and method", ""]
    lines += _table({key: aggregate(v, k) for key, v in sorted(group_rows(rows, True).items(), key=lambda kv: kv[0][0])},
                    ["category", "method"], *cols)
    lines += [""]
    lines += host_lines(group_rows([r for r in rows if r["method"] != "hf"], False))
    if meta["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in meta["notes"]] + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += [
        "## How to read this", "",
        "- speedup vs AR / vs hf: per prompt, tokens/s of the method divided by tokens/s of "
        "plain decoding (AR) on the same target path (its backend, exact or not) / of "
        "transformers' assisted generation (hf, same drafter) on the same prompt (= AR seconds / "
        "method seconds when both produce the same tokens); the median over prompts is shown.",
    ] + [
        "- speedup vs fastest plain: the same, divided by the plain decoding (AR on a target "
        "backend, or llama-server) with the highest median tokens/s in this run.",
    ] * cols[0] + [
        "- speedup vs llama-server: divided by llama.cpp's own server (`llama-server`) decoding "
        "the same prompt tokens greedily on the same GGUF file, threads and context; decode "
        "speedup vs llama-server: its decode time per token (its own `predicted_ms`) over the "
        "method's after the first target call.",
    ] * cols[1] + [
        "- a label's `(backend)` after the method names the target's backend, after the drafter "
        "the drafter's (shown for a side that does not run on torch only).",
    ] * bool(backends) + [
        "- `(backend+exact)`: the target scored exactly (docs/exact.md); its rows compare with "
        "AR on the same exact path" + (", and under What exact costs with the same run without "
                                       "exact" if s["exact"] == "both" else "")
        + "; its bound uses the plain path's measured cost curve.",
    ] * any(r.get("exact") for r in rows) + [
        "- acceptance: accepted / drafted draft tokens, pooled over the group's prompts. "
        "a (per token): accepted / (accepted + rejections), a rejection being a round that "
        "ended at a rejected candidate: the chance of each judged candidate being kept (those "
        "after a rejection are never judged), whatever the rounds' lengths.",
        "- tokens / target call: new tokens / target forward passes (1.00 for AR).",
        "- c: (draft seconds / drafter forward calls) / (AR target seconds / AR target calls on "
        "the same prompt and target backend, both without AR's first call, the prompt read); "
        "median over prompts. The drafter's own prompt read is folded into its seconds. "
        "0 for a run whose candidates were all copied (prompt lookup: no drafter pass).",
        "- decode speedup: like speedup vs AR, but after the target's first call (the prompt "
        "read, the same work for both): AR's seconds per token after it / the method's. This "
        "is what the bound models; on long prompts the end-to-end speedup is lower.",
        f"- bound S(a,k,c): the best over draft lengths j = 1..{k} of "
        "(1 - a^(j+1)) / ((1 - a)(j c + v_j)), the analytic speedup of speculative decoding "
        "(ALGORITHMS.md section 0) with the best fixed draft length, where v_j = T(j+1) / T(1) "
        "is the target's measured cost of scoring j+1 tokens in one call, in plain steps "
        "(`anydraft doctor` prints the curve; settings.verify_costs in results.json). It "
        "ignores translation/sync overhead, so "
        "decode / bound is normally below 1; above 1, the policy gained from acceptance that "
        "varies (drafting more where it is high), which the model's one a cannot show. It also "
        "assumes every token is accepted with the same chance a: copies (lookup, and auto's "
        "copy steps) are rather all right or all wrong, so their bound is only indicative.",
        "",
    ]
    path = out_dir / "summary.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
