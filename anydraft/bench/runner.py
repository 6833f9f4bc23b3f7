"""The timed runs: every method on every prompt, interleaved, after a warm-up -> result rows.

Order per prompt: for each target backend, AR, then for each (drafter, drafter backend) each
method (and `hf`), all with the same settings, so drift of the machine hits every method alike;
``repeats`` rounds of that, every second round in reverse order (AR last: a machine that speeds
up or slows down during a round favours no method), and each row keeps the run with the median
seconds (so its fields stay consistent with each other). Each model is loaded once per backend.

Exact scoring (models/exact.py) is a path of its own: with ``exact="both"`` each target backend
runs twice in the same rounds, plain and exact (``"llamacpp"`` and ``"llamacpp+exact"``: the
rows' ``target_backend``), each with its own AR, so an exact row is compared with exact AR
(greedy output identical to plain decoding on the same path with exact on) and carries what
exact costs against the same run without it (``speedup_vs_not_exact``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..config import DraftConfig, check_method
from ..errors import AnydraftError
from ..models.auto import curve_of
from ..models.backends import BACKENDS
from ..models.exact_cost import choose as choose_exact
from ..sampling import SamplingParams
from .bound import best_bound, cost_ratio, median, per_token_acceptance, verify_costs
from .busy import busy_cores
from .busy import note as busy_note
from .host import host_fields
from .llama_server import SERVERS
from .realtime import throttle_note

# rows that other programs produced (transformers' assisted generation, llama.cpp's own server):
# they report tokens and seconds only
BASELINES = ("hf", *SERVERS)
# --exact: every target plain, every target exact, each both ways in the same run, or each as
# `Decoder`'s exact="auto" chooses on this machine (models/exact_cost.py)
EXACT_CHOICES = ("off", "on", "both", "auto")
EXACT_PATH = "+exact"  # a target backend's exact path: "torch+exact" (rows' target_backend)


def target_path(backend: str, exact: bool) -> str:
    """The name of a target backend's plain or exact path: "torch", "torch+exact"."""
    return backend + EXACT_PATH if exact else backend


def path_backend(path: str) -> tuple[str, bool]:
    """`target_path` undone: "torch+exact" -> ("torch", True)."""
    return path.removesuffix(EXACT_PATH), path.endswith(EXACT_PATH)


@dataclass
class BenchSettings:
    target: str
    drafters: list[str]
    methods: list[str]  # "ar" first
    target_backends: list[str] = field(default_factory=lambda: ["torch"])
    drafter_backends: list[str] = field(default_factory=lambda: ["torch"])
    baseline_hf: bool = False
    # plain servers run on the target's GGUF beside AR (`SERVERS`: llama.cpp's, ik_llama.cpp's)
    baseline_servers: tuple[str, ...] = ()
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # the torch runs' dtypes: they choose no backend here (bench/cli.py applies `backends_for`)
    dtype: str = "auto"
    drafter_dtype: str | None = None
    device: str = "auto"  # resolved by run_bench: "cpu" or "cuda" in results.json
    draft: DraftConfig = field(default_factory=DraftConfig)  # its method is unused: `methods`
    repeats: int = 1
    warmup: bool = True
    busy_cores: int = 0  # busy-spinning processes beside the measured runs (busy.py)
    exact: str = "auto"  # EXACT_CHOICES: no target, every target, each both ways, as auto chooses
    exact_auto: dict = field(default_factory=dict)  # target backend -> what auto chose and why
    chat: str = "auto"  # auto | yes | no
    verify_costs: dict = field(default_factory=dict)  # target backend -> [v_1..v_k] (bound.py)
    fastest_plain: str | None = None  # set by run_bench: `fastest_plain`
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.exact not in EXACT_CHOICES:
            raise AnydraftError(f"exact must be one of {', '.join(EXACT_CHOICES)}, got {self.exact!r}")

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def exact_variants(self, backend: str) -> list[bool]:
        """A target backend's runs: plain, exact, or both (plain first)."""
        if self.exact == "auto":
            return [self.exact_auto[backend]["on"]]
        return {"off": [False], "on": [True], "both": [False, True]}[self.exact]

    def to_dict(self) -> dict:
        """Flat, as results.json has always had them (draft and sampling fields inlined)."""
        d = asdict(self)
        d.pop("notes")
        d |= d.pop("sampling")
        d |= {k: v for k, v in d.pop("draft").items() if k != "method"}
        return d


def parse_methods(text: str, has_drafter: bool) -> list[str]:
    """`ar,sd,...` -> validated list with `ar` first (the baseline every speedup divides by)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise AnydraftError("--methods is empty: give e.g. ar,slem,tli,auto")
    for m in names:
        check_method(m, has_drafter)
    out = ["ar"]
    for m in names:
        if m not in out:
            out.append(m)
    return out


def parse_backends(text: str, flag: str) -> list[str]:
    """`torch,llamacpp` -> validated list without repeats ("auto" is resolved at load)."""
    choices = ("auto", *BACKENDS)
    names = list(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    if not names:
        raise AnydraftError(f"{flag} is empty: choose from {', '.join(choices)}")
    for b in names:
        if b not in choices:
            raise AnydraftError(f"unknown backend {b!r} in {flag}: choose from {', '.join(choices)}")
    return names


def backends_for(backends: list[str], dtype, role: str) -> list[str]:
    """`backend_for` over the backends a run compares: a dtype asked for (``dtype`` not None
    or "auto") makes "auto" torch and applies to the torch runs, so a llama.cpp-family engine
    beside torch stays (the comparison), and such engines alone are a conflict."""
    from ..models.backends import backend_for

    if dtype is None or dtype == "auto":
        return backends
    from ..models.engines import ENGINES

    if set(backends) <= set(ENGINES):
        backend_for(backends[0], dtype, role)  # raises: the dtype would apply to no run
    return list(dict.fromkeys(b if b in ENGINES else backend_for(b, dtype, role) for b in backends))


def resolve_backends(backends: list[str], spec: str, role: str, dtype, device: str, progress) -> list[str]:
    """The backends with "auto" replaced by what it chooses for ``spec`` in ``role``."""
    from ..models.auto import choose_backend

    chosen = [choose_backend(spec, role, dtype or "auto", device, progress)[0] if b == "auto" else b
              for b in backends]
    return list(dict.fromkeys(chosen))


def backend_sides(target_backends, drafter_backends) -> tuple[bool, bool]:
    """Whether labels name the target's / the drafter's backend: a side does unless all torch."""
    return not set(target_backends) <= {"torch"}, not set(drafter_backends) <= {"torch"}


def label(method: str, drafter=None, target_backend=None, drafter_backend=None,
          sides: tuple[bool, bool] = (False, False)) -> str:
    """`slem <- smollm2-135m`; with backends shown `slem (llamacpp) <- smollm2-135m (torch)`."""
    text = method + (f" ({target_backend})" if sides[0] else "")
    if drafter is not None:
        text += f" <- {drafter}" + (f" ({drafter_backend})" if sides[1] else "")
    return text


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
    """Load each model once per backend, run everything, return the rows (see report.ROW_KEYS)."""
    from ..bridge import same_tokenizer
    from ..hardware import this_machine
    from ..models.backends import load
    from ..models.loading import load_tokenizer, resolve_device

    settings.device = resolve_device(settings.device)
    progress_note = log or (lambda m: None if quiet else print(m, file=sys.stderr, flush=True))
    for line in this_machine().lines():
        progress_note(line)
    common = dict(draft=settings.draft, dtype=settings.dtype, device=settings.device)
    target_tok = load_tokenizer(settings.target)
    chat = _use_chat(settings, target_tok)
    settings.chat = "yes" if chat else "no"
    settings.target_backends = resolve_backends(settings.target_backends, settings.target, "target",
                                                settings.dtype, settings.device, progress_note)
    if settings.drafters:
        settings.drafter_backends = list(dict.fromkeys(
            b for name in settings.drafters for b in resolve_backends(
                settings.drafter_backends, name, "drafter", settings.drafter_dtype or settings.dtype,
                settings.device, progress_note)))
    # the dtypes are the torch runs' (`backends_for`): they choose no backend here
    targets = {tb: load(settings.target, tb, target_tok, settings.dtype, settings.device, progress_note,
                        dtype_given=False)
               for tb in settings.target_backends}
    if "torch" in targets:  # record what "auto" chose
        settings.dtype = common["dtype"] = targets["torch"].dtype
    # each target's measured cost of scoring j + 1 tokens, in plain steps: the bound's v_j
    settings.verify_costs = {
        tb: verify_costs(curve_of(settings.target, t, tb, progress_note),
                         settings.draft.num_draft_tokens) for tb, t in targets.items()}
    if settings.exact == "auto":  # what a Decoder given this target's name would choose
        for tb, target in targets.items():
            choice = choose_exact(settings.target, target)
            settings.exact_auto[tb] = {"on": choice.on, "why": choice.why}
            settings.notes.append(f"{tb} target: {choice.describe()}")
    paths = [target_path(tb, e) for tb in settings.target_backends for e in settings.exact_variants(tb)]
    sides = backend_sides(paths, settings.drafter_backends if settings.drafters else [])

    def name_of(key) -> str:
        tb, name, db, method = key
        return label(method, name, tb, db, sides)

    # per drafter: its models (one per backend, shared by every target backend), methods, hf baseline
    drafters, todo, hf = {}, {}, {}
    for name in settings.drafters:
        d_tok = load_tokenizer(name)
        for db in settings.drafter_backends:
            drafters[(name, db)] = load(name, db, d_tok, settings.drafter_dtype or settings.dtype,
                                        settings.device, progress_note, role="drafter",
                                        dtype_given=False)
            if db == "torch" and settings.drafter_dtype in (None, "auto") and len(settings.drafters) == 1:
                settings.drafter_dtype = drafters[(name, db)].dtype
        same = same_tokenizer(target_tok, d_tok)
        todo[name] = []
        for m in settings.methods[1:]:
            if m == "lookup":  # needs no drafter: run once per target backend, below
                continue
            if m == "sd" and not same:
                settings.notes.append(f"sd skipped for drafter {name}: its tokenizer differs from "
                                      f"the target's (sd needs the same vocabulary; use slem/tli)")
                continue
            todo[name].append(m)
        hf[name] = None
        if settings.baseline_hf and "torch" in targets and (name, "torch") in drafters:
            from .hf_baseline import HFAssisted

            hf[name] = HFAssisted(targets["torch"].model, target_tok, drafters[(name, "torch")].model,
                                  d_tok, settings.draft.num_draft_tokens, sampling=not settings.greedy)
            if hf[name].skip_reason:
                settings.notes.append(f"hf baseline skipped for drafter {name}: {hf[name].skip_reason}")
                hf[name] = None
            else:
                settings.notes.append(f"hf baseline for drafter {name}: {hf[name].mode}")

    # (key, decoder, hf baseline or None); key = (target path, drafter, drafter backend, method),
    # the target path a backend's plain or exact one (`target_path`); every decoder of a backend
    # shares its loaded model: an exact decoder wraps it in a LoadedModel of its own, and the
    # model computes as before outside an exact call (models/exact.py)
    jobs = []
    # without a drafter: prompt lookup, and auto when no drafter is given (it is lookup then)
    alone = [m for m in settings.methods if m == "lookup" or (m == "auto" and not drafters)]
    for tb, target in targets.items():
        for exact in settings.exact_variants(tb):
            jobs += _path_jobs(settings, tb, target.model, target_tok, exact, alone, drafters, todo,
                               hf, name_of, common)
    from ..models.engines import ENGINES
    from ..models.llamacpp import requested_context
    from .llama_server import FLAVORS, ServerBaseline

    servers = []
    try:
        for name in settings.baseline_servers:  # beside AR on a llama.cpp-family backend
            tb = next((b for b in settings.target_backends if b in ENGINES), settings.target_backends[0])
            context = getattr(targets[tb].model, "max_length", None) or requested_context()
            servers.append(ServerBaseline(settings.target, context, progress_note, flavor=FLAVORS[name]).start())
            settings.notes.append(servers[-1].describe())
            path = target_path(tb, settings.exact_variants(tb)[0])
            at = next(i for i, job in enumerate(jobs) if job[0] == (path, None, None, "ar")) + 1
            jobs.insert(at, ((path, None, None, name), jobs[at - 1][1], servers[-1]))
        return _timed_runs(settings, prompts, jobs, target_tok, chat, name_of, progress_note, quiet)
    finally:
        for server in servers:
            server.close()


def _path_jobs(settings: BenchSettings, tb: str, model, target_tok, exact: bool, alone: list[str],
               drafters: dict, todo: dict, hf: dict, name_of, common: dict) -> list:
    """The jobs of one target path: AR (and what needs no drafter), then each drafter's methods
    and its hf baseline (beside the first path only: transformers' loop knows no exact)."""
    from ..decoder import Decoder

    path = target_path(tb, exact)
    try:
        dec = Decoder(target=model, tokenizer=target_tok, method="ar", backend=tb, exact=exact, **common)
    except AnydraftError as exc:
        if not exact or settings.exact != "both":
            raise
        settings.notes.append(f"{path} skipped: {exc}")  # the plain path still runs
        return []
    jobs = [((path, None, None, m), dec, None) for m in ["ar", *alone]]
    first = exact == settings.exact_variants(tb)[0]
    for (name, db), d in drafters.items():
        dec = Decoder(target=model, tokenizer=target_tok, drafter=d.model,
                      drafter_tokenizer=d.tokenizer, method="auto", backend=tb, drafter_backend=db,
                      exact=exact, **common)
        jobs += [((path, name, db, m), dec, None) for m in todo[name]]
        if not settings.baseline_hf or not first:
            continue
        if (tb, db) != ("torch", "torch"):
            settings.notes.append(
                f"{name_of((path, name, db, 'hf'))} skipped: transformers' assisted generation "
                "needs the torch backend for both the target and the drafter")
        elif hf[name] is not None:
            jobs.append(((path, name, db, "hf"), dec, hf[name]))
    return jobs


def _timed_runs(settings: BenchSettings, prompts: list[dict], jobs: list, target_tok, chat: bool,
                name_of: Callable[[tuple], str], progress_note, quiet: bool) -> list[dict]:
    """Warm-up, then every job on every prompt, interleaved (see the module docstring)."""
    if settings.busy_cores:
        settings.notes.append(busy_note(settings.busy_cores))
    if (throttled := throttle_note()) is not None:
        settings.notes.append(throttled)
    for n in settings.notes:
        progress_note(f"note: {n}")
    params = settings.sampling
    gen = dict(sampling=params, chat=chat)

    def run_one(dec, method, baseline, prompt, max_new):
        if baseline is not None:  # the same prompt tokens as every other run
            ids = dec.prompt_ids(prompt, chat)
            tokens, seconds, prefill = baseline.generate(ids, max_new, params, dec.eos_ids)
            text = target_tok.decode(tokens, skip_special_tokens=True)
            stats = {"method": method, "prompt_tokens": len(ids), "new_tokens": len(tokens),
                     "seconds": seconds, "prefill_seconds": prefill,
                     "tokens_per_s": len(tokens) / seconds if seconds > 0 else 0.0}
            return {"token_ids": tokens, "text": text, "finish_reason": None, "stats": stats}
        out = dec.generate(prompt, max_new_tokens=max_new, method=method, **gen)
        return {"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason,
                "stats": out.stats}

    def drop(job, exc):
        if job[0][3] == "ar":
            raise exc
        jobs.remove(job)
        note = f"{name_of(job[0])} skipped: {exc}"
        settings.notes.append(note)
        progress_note(f"note: {note}")

    if settings.warmup:
        progress_note(f"warm-up: {len(jobs)} short runs on {prompts[0]['id']}")
        for job in list(jobs):
            try:
                run_one(job[1], job[0][3], job[2], prompts[0]["prompt"], min(8, settings.max_new_tokens))
            except AnydraftError as exc:  # a method that does not apply to this pair
                drop(job, exc)

    progress = Progress(len(prompts) * len(jobs) * settings.repeats, quiet=quiet)
    ar_decoders = {key[0]: dec for key, dec, _ in jobs if key[3] == "ar"}
    with busy_cores(settings.busy_cores):
        rows = _measured_runs(settings, prompts, jobs, run_one, drop, progress, name_of,
                              ar_decoders, chat)
    settings.fastest_plain = fastest_plain(rows)
    return rows


def _measured_runs(settings: BenchSettings, prompts: list[dict], jobs: list, run_one, drop,
                   progress: Progress, name_of, ar_decoders: dict, chat: bool) -> list[dict]:
    """Every job on every prompt, interleaved: the rows."""
    rows = []
    for p in prompts:
        runs: dict[tuple, list[dict]] = {}
        for r in range(settings.repeats):
            for job in list(jobs) if r % 2 == 0 else jobs[::-1]:
                key, dec, baseline = job
                try:
                    res = run_one(dec, key[3], baseline, p["prompt"], settings.max_new_tokens)
                except AnydraftError as exc:
                    drop(job, exc)
                    progress.total -= (len(prompts) - prompts.index(p)) * settings.repeats - r
                    continue
                runs.setdefault(key, []).append(res)
                s = res["stats"]
                progress.step(f"{p['id']} {name_of(key)}"
                              f"{f' (repeat {r + 1})' if settings.repeats > 1 else ''}: "
                              f"{s['new_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s")
        rows += _rows_for_prompt(p, runs, settings, progress, name_of,
                                 lambda tb, a, b, text=p["prompt"]: divergence(ar_decoders[tb], text, chat, a, b))
    return rows


def fastest_plain(rows: list[dict]) -> str | None:
    """The label (`label` with every backend named) of the plain decoding that ran fastest,
    by median tokens/s over the prompts: AR on each target path (plain or exact), and the
    plain servers (`SERVERS`) where they ran; sets every row's ``speedup_vs_fastest_plain`` (per prompt: its
    tokens/s over that plain decoding's on the same prompt)."""
    plain = {}
    for r in rows:
        if r["method"] in ("ar", *SERVERS):
            plain.setdefault((r["method"], r["target_backend"]), {})[r["prompt_id"]] = r["tokens_per_s"]
    if not plain:
        return None
    best = max(plain, key=lambda key: median(list(plain[key].values())))
    for r in rows:
        base = plain[best].get(r["prompt_id"])
        r["speedup_vs_fastest_plain"] = r["tokens_per_s"] / base if base else None
    return best[0] if best[0] in SERVERS else label("ar", None, best[1], None, (True, False))


def divergence(dec, prompt, chat: bool, ar: list[int], other: list[int]) -> tuple[int, float | None]:
    """Where a greedy run left plain decoding's path, and by how many logits the target prefers
    AR's token over the other run's there, replaying plain decoding's own calls (the prompt,
    then one token at a time). A margin within the dtype's rounding (bfloat16 logits near 20
    are spaced 0.125 apart; 0 is an exact tie) is a near tie that scoring the position inside a
    batch rounded the other way: numerics of the target, not the method. None: the runs differ
    only in length."""
    at = next((i for i, (a, b) in enumerate(zip(ar, other, strict=False)) if a != b), None)
    if at is None:
        return min(len(ar), len(other)), None
    session = dec.target.new_session()
    logits = session.feed(dec.prompt_ids(prompt, chat), rows=1)[-1]
    for token in ar[:at]:
        logits = session.feed([token], rows=1)[-1]
    return at, float(logits[ar[at]] - logits[other[at]])


def _speedup(stats: dict, base: dict) -> float | None:
    return stats["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] > 0 else None


def _decode_seconds_per_token(stats: dict) -> float | None:
    """Seconds per new token after the target's first call (the prompt read, the same work
    for every method: it dilutes end-to-end speedups on long prompts)."""
    n, prefill = stats["new_tokens"] - 1, stats.get("prefill_seconds")
    return None if n < 1 or prefill is None else (stats["seconds"] - prefill) / n


def _decode_speedup(stats: dict, base: dict) -> float | None:
    mine, plain = _decode_seconds_per_token(stats), _decode_seconds_per_token(base)
    return None if not mine or plain is None else plain / mine


def _rows_for_prompt(p: dict, runs: dict, settings: BenchSettings, progress: Progress,
                     name_of: Callable[[tuple], str], diverge: Callable | None = None) -> list[dict]:
    ars = {key[0]: _median_run(v) for key, v in runs.items() if key[3] == "ar"}  # per target path
    hf_stats = {key[1]: _median_run(v)["stats"] for key, v in runs.items() if key[3] == "hf"}
    server = next((_median_run(v)["stats"] for key, v in runs.items() if key[3] == "llama-server"), None)
    k = settings.draft.num_draft_tokens
    rows = []
    for key, results in runs.items():
        tb, name, db, method = key
        backend, exact = path_backend(tb)
        ar = ars[tb]
        ar_s = ar["stats"]
        res = _median_run(results)
        s = res["stats"]
        # the same run without exact scoring, for what exact costs
        plain = runs.get((backend, name, db, method)) if exact else None
        plain_s = _median_run(plain)["stats"] if plain else None
        identical = (res["token_ids"] == ar["token_ids"]) if settings.greedy else None
        row = {
            "prompt_id": p["id"], "category": p["category"], "method": method, "drafter": name,
            "target_backend": tb, "drafter_backend": db, "exact": exact,
            "resolved_method": s.get("method", method),
            "new_tokens": s["new_tokens"], "prompt_tokens": s["prompt_tokens"],
            "seconds": s["seconds"], "prefill_seconds": s.get("prefill_seconds"),
            "tokens_per_s": s["tokens_per_s"],
            "seconds_all": [r["stats"]["seconds"] for r in results],
            "speedup_vs_ar": _speedup(s, ar_s),
            "decode_speedup_vs_ar": _decode_speedup(s, ar_s),
            "speedup_vs_llama_server": _speedup(s, server) if server is not None else None,
            "decode_speedup_vs_llama_server": _decode_speedup(s, server) if server is not None else None,
            "speedup_vs_fastest_plain": None,  # once every prompt ran: `fastest_plain`
            "speedup_vs_hf": _speedup(s, hf_stats[name]) if name in hf_stats else None,
            "speedup_vs_not_exact": _speedup(s, plain_s) if plain_s else None,
            "decode_speedup_vs_not_exact": _decode_speedup(s, plain_s) if plain_s else None,
            "acceptance": None, "acceptance_per_token": None, "mean_accepted": None,
            "drafted": None, "accepted": None, "rejected": None, "target_calls": None,
            "drafter_calls": None,
            "draft_seconds": None, "target_seconds": None, "translate_seconds": None,
            "cost_ratio": None, "bound": None, "num_draft_tokens": None if method == "ar" else k,
            "verify_costs": settings.verify_costs.get(backend),  # measured on the plain path
            "identical_to_ar": identical, "mismatch_at": None, "mismatch_margin": None,
            "finish_reason": res["finish_reason"], "text": res["text"],
        }
        if method not in BASELINES:
            for stat in ("drafted", "accepted", "rejected", "target_calls", "drafter_calls",
                         "mean_accepted", "draft_seconds", "target_seconds", "translate_seconds"):
                row[stat] = s[stat]
            row["acceptance"] = s["acceptance_rate"] if s["drafted"] else None
            row |= host_fields(s, ar_s)
        if method not in ("ar", *BASELINES) and s["drafted"]:
            a = per_token_acceptance(s["accepted"], s["rejected"])
            c = 0.0 if not s["drafter_calls"] else cost_ratio(  # copies cost no drafter pass
                s["draft_seconds"], s["drafter_calls"],
                ar_s["target_seconds"] - ar_s["prefill_seconds"], ar_s["target_calls"] - 1)
            row["acceptance_per_token"] = a
            row["cost_ratio"] = c
            row["bound"] = None if c is None or a is None else best_bound(a, k, c, row["verify_costs"])
        if identical is False:
            where = ""
            if diverge is not None:
                row["mismatch_at"], row["mismatch_margin"] = diverge(tb, ar["token_ids"], res["token_ids"])
                where = f" from token {row['mismatch_at']}" + (
                    "" if row["mismatch_margin"] is None else
                    f", where plain decoding prefers AR's token by {row['mismatch_margin']:.3f} logits")
            progress.note(f"!!! GREEDY MISMATCH: {name_of(key)} on {p['id']} differs from AR{where} "
                          f"(AR {len(ar['token_ids'])} tokens, {method} {len(res['token_ids'])})")
        rows.append(row)
    return rows

