"""The timed runs: every method on every prompt, interleaved, after a warm-up -> result rows.

Order per prompt: AR, then for each drafter each method (and `hf`), all with the same settings,
so drift of the machine hits every method alike; ``repeats`` rounds of that, and each row keeps
the run with the median seconds (so its fields stay consistent with each other).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..errors import AnydraftError
from .bound import cost_ratio, per_token_acceptance, speedup_bound

DRAFTER_METHODS = ("sd", "slem", "tli", "slrs")


@dataclass
class BenchSettings:
    target: str
    drafters: list[str]
    methods: list[str]  # "ar" first
    baseline_hf: bool = False
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = 0
    dtype: str = "float32"
    drafter_dtype: str | None = None
    device: str = "cpu"
    num_draft_tokens: int = 5
    draft_confidence: float = 0.0
    repeats: int = 1
    warmup: bool = True
    chat: str = "auto"  # auto | yes | no
    notes: list[str] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("notes")
        return d


def parse_methods(text: str, has_drafter: bool) -> list[str]:
    """`ar,sd,...` -> validated list with `ar` first (the baseline every speedup divides by)."""
    from .. import methods as registry

    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise AnydraftError("--methods is empty: give e.g. ar,slem,tli,auto")
    for m in names:
        if m == "slrs" and m not in registry.METHODS:
            raise AnydraftError(
                "method 'slrs' is not implemented in this version of anydraft yet: "
                f"choose from {', '.join(registry.METHODS)}")
        if m not in registry.METHODS:
            raise AnydraftError(f"unknown method {m!r} in --methods: choose from {', '.join(registry.METHODS)}")
        if m != "ar" and not has_drafter:
            raise AnydraftError(f"method {m!r} needs a drafter: pass --drafter MODEL")
    out = ["ar"]
    for m in names:
        if m not in out:
            out.append(m)
    return out


def _median_run(runs: list[dict]) -> dict:
    order = sorted(runs, key=lambda r: r["stats"]["seconds"])
    return order[(len(order) - 1) // 2]


class Progress:
    """A tqdm progress bar over the timed runs (ETA included) on stderr; silent when ``quiet``."""

    def __init__(self, total: int, quiet: bool = False, stream=None):
        from tqdm import tqdm

        self.quiet = quiet
        self.bar = tqdm(total=total, file=stream or sys.stderr, disable=quiet, unit="run",
                        dynamic_ncols=True)

    @property
    def total(self) -> int:
        return self.bar.total

    @total.setter
    def total(self, value: int) -> None:
        self.bar.total = value
        self.bar.refresh()

    def note(self, msg: str) -> None:
        if not self.quiet:
            self.bar.write(msg, file=self.bar.fp)

    def step(self, msg: str) -> None:
        self.bar.set_postfix_str(msg, refresh=False)
        self.bar.update(1)
        if self.bar.n >= self.bar.total:
            self.bar.close()


def _use_chat(settings: BenchSettings, tokenizer) -> bool:
    has = bool(getattr(tokenizer, "chat_template", None))
    if settings.chat == "yes" and not has:
        raise AnydraftError(f"{settings.target} has no chat template: use --chat no (or auto)")
    return has if settings.chat == "auto" else settings.chat == "yes"


def run_bench(settings: BenchSettings, prompts: list[dict], quiet: bool = False,
              log: Callable[[str], None] | None = None) -> list[dict]:
    """Load the models, run everything, return the rows (see report.ROW_KEYS)."""
    from ..bridge import same_tokenizer
    from ..decoder import Decoder
    from ..models.loading import load_model, load_tokenizer
    from ..sampling import SamplingParams

    progress_note = log or (lambda m: None if quiet else print(m, file=sys.stderr, flush=True))
    params = SamplingParams(settings.temperature, settings.top_k, settings.top_p, settings.min_p,
                            settings.seed)
    common = dict(num_draft_tokens=settings.num_draft_tokens,
                  draft_confidence=settings.draft_confidence, device=settings.device)
    target_model = load_model(settings.target, dtype=settings.dtype, device=settings.device,
                              progress=progress_note)
    target_tok = load_tokenizer(settings.target)
    chat = _use_chat(settings, target_tok)
    settings.chat = "yes" if chat else "no"
    ar_dec = Decoder(target=target_model, tokenizer=target_tok, method="ar", dtype=settings.dtype, **common)

    # (drafter name, decoder, methods to run on it, hf baseline or None)
    plans = []
    for name in settings.drafters:
        d_model = load_model(name, dtype=settings.drafter_dtype or settings.dtype,
                             device=settings.device, progress=progress_note)
        d_tok = load_tokenizer(name)
        dec = Decoder(target=target_model, tokenizer=target_tok, drafter=d_model,
                      drafter_tokenizer=d_tok, method="auto", dtype=settings.dtype, **common)
        same = same_tokenizer(target_tok, d_tok)
        todo = []
        for m in settings.methods[1:]:
            if m == "sd" and not same:
                settings.notes.append(f"sd skipped for drafter {name}: its tokenizer differs from "
                                      f"the target's (sd needs the same vocabulary; use slem/tli)")
                continue
            todo.append(m)
        hf = None
        if settings.baseline_hf:
            from .hf_baseline import HFAssisted

            hf = HFAssisted(target_model, target_tok, d_model, d_tok, settings.num_draft_tokens,
                            sampling=not settings.greedy)
            if hf.skip_reason:
                settings.notes.append(f"hf baseline skipped for drafter {name}: {hf.skip_reason}")
                hf = None
            else:
                settings.notes.append(f"hf baseline for drafter {name}: {hf.mode}")
        plans.append((name, dec, todo, hf))
    for n in settings.notes:
        progress_note(f"note: {n}")

    gen = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
               min_p=settings.min_p, seed=settings.seed, chat=chat)

    def run_one(dec, method, hf, prompt, max_new):
        if hf is not None:
            ids = ar_dec.prompt_ids(prompt, chat)
            tokens, seconds = hf.generate(ids, max_new, params, ar_dec.eos_ids)
            text = target_tok.decode(tokens, skip_special_tokens=True)
            stats = {"method": "hf", "prompt_tokens": len(ids), "new_tokens": len(tokens),
                     "seconds": seconds, "tokens_per_s": len(tokens) / seconds if seconds > 0 else 0.0}
            return {"token_ids": tokens, "text": text, "finish_reason": None, "stats": stats}
        out = dec.generate(prompt, max_new_tokens=max_new, method=method, **gen)
        return {"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason,
                "stats": out.stats}

    jobs = [(None, ar_dec, "ar", None)]
    for name, dec, todo, hf in plans:
        jobs += [(name, dec, m, None) for m in todo]
        if hf is not None:
            jobs.append((name, dec, "hf", hf))

    def drop(job, exc):
        name, _, method, _ = job
        if job[2] == "ar":
            raise exc
        jobs.remove(job)
        note = f"{method}{'' if name is None else ' <- ' + name} skipped: {exc}"
        settings.notes.append(note)
        progress_note(f"note: {note}")

    if settings.warmup:
        progress_note(f"warm-up: {len(jobs)} short runs on {prompts[0]['id']}")
        for job in list(jobs):
            try:
                run_one(job[1], job[2], job[3], prompts[0]["prompt"], min(8, settings.max_new_tokens))
            except AnydraftError as exc:  # a method that does not apply to this pair
                drop(job, exc)

    progress = Progress(len(prompts) * len(jobs) * settings.repeats, quiet=quiet)
    rows = []
    for p in prompts:
        runs: dict[tuple, list[dict]] = {}
        for r in range(settings.repeats):
            for job in list(jobs):
                name, dec, method, hf = job
                try:
                    res = run_one(dec, method, hf, p["prompt"], settings.max_new_tokens)
                except AnydraftError as exc:
                    drop(job, exc)
                    progress.total -= (len(prompts) - prompts.index(p)) * settings.repeats - r
                    continue
                runs.setdefault((name, method), []).append(res)
                s = res["stats"]
                progress.step(f"{p['id']} {method}{'' if name is None else ' <- ' + name}"
                              f"{f' (repeat {r + 1})' if settings.repeats > 1 else ''}: "
                              f"{s['new_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s")
        rows += _rows_for_prompt(p, runs, settings, progress)
    return rows


def _rows_for_prompt(p: dict, runs: dict, settings: BenchSettings, progress: Progress) -> list[dict]:
    ar = _median_run(runs[(None, "ar")])
    ar_s = ar["stats"]
    hf_tps = {name: _median_run(v)["stats"]["tokens_per_s"] for (name, m), v in runs.items() if m == "hf"}
    k = settings.num_draft_tokens
    rows = []
    for (name, method), results in runs.items():
        res = _median_run(results)
        s = res["stats"]
        speedup = s["tokens_per_s"] / ar_s["tokens_per_s"] if ar_s["tokens_per_s"] > 0 else None
        identical = (res["token_ids"] == ar["token_ids"]) if settings.greedy else None
        row = {
            "prompt_id": p["id"], "category": p["category"], "method": method, "drafter": name,
            "resolved_method": s.get("method", method),
            "new_tokens": s["new_tokens"], "prompt_tokens": s["prompt_tokens"],
            "seconds": s["seconds"], "tokens_per_s": s["tokens_per_s"],
            "seconds_all": [r["stats"]["seconds"] for r in results],
            "speedup_vs_ar": speedup,
            "speedup_vs_hf": None,
            "acceptance": None, "acceptance_per_token": None, "mean_accepted": None,
            "drafted": None, "accepted": None, "target_calls": None, "drafter_calls": None,
            "draft_seconds": None, "target_seconds": None, "translate_seconds": None,
            "cost_ratio": None, "bound": None, "num_draft_tokens": None if method == "ar" else k,
            "identical_to_ar": identical, "finish_reason": res["finish_reason"], "text": res["text"],
        }
        if method != "hf":
            for key in ("drafted", "accepted", "target_calls", "drafter_calls", "mean_accepted",
                        "draft_seconds", "target_seconds", "translate_seconds"):
                row[key] = s[key]
            row["acceptance"] = s["acceptance_rate"] if s["drafted"] else None
        if method not in ("ar", "hf") and s["drafted"]:
            a = per_token_acceptance(s["acceptance_rate"], k)
            c = cost_ratio(s["draft_seconds"], s["drafter_calls"], ar_s["target_seconds"],
                           ar_s["target_calls"])
            row["acceptance_per_token"] = a
            row["cost_ratio"] = c
            row["bound"] = None if c is None else speedup_bound(a, k, c)
        if name in hf_tps and hf_tps[name] > 0:
            row["speedup_vs_hf"] = s["tokens_per_s"] / hf_tps[name]
        if identical is False:
            progress.note(f"!!! GREEDY MISMATCH: {method} <- {name} on {p['id']} differs from AR "
                          f"(AR {len(ar['token_ids'])} tokens, {method} {len(res['token_ids'])})")
        rows.append(row)
    return rows


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
