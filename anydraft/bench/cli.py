"""`anydraft bench`: light at import time (argparse only); the work is imported in `cmd_bench`."""

from __future__ import annotations

import argparse
import datetime
import sys

from ..options import (
    add_draft_options,
    add_sampling_options,
    command_line,
    draft_config,
    sampling_params,
)
from ..sampling import SamplingParams
from . import serve

HELP = """Benchmark methods side by side on one target: AR, then each method per prompt
(interleaved, after a warm-up), median over --repeats; with several backends, every (target
backend, drafter, drafter backend) combination, each against AR on its own target backend.
--exact both runs each target backend plain and exact in the same rounds (its exact path is
"<backend>+exact", against its own exact AR) and tables what exact costs. Writes results.json,
summary.md and PNG plots to --out. Exit status 1 when a greedy run's output differs from AR on
its path (a correctness alarm)."""


def register(sub) -> None:
    """Add the `bench` and `bench-serve` subcommands to ``sub`` (the subparsers of `anydraft`)."""
    b = sub.add_parser("bench", help="benchmark methods side by side (tables, plots, bound)",
                       description=HELP)
    b.add_argument("--target", required=True, help="catalog name, hub id, directory or .gguf")
    b.add_argument("--drafter", action="append", default=[],
                   help="drafter model (repeatable: one set of runs per drafter)")
    b.add_argument("--methods", default=None,
                   help="comma list of ar, lookup, sd, slem, tli, slrs, auto (ar is always run: "
                        "speedups divide by it; lookup needs no drafter); default ar,auto")
    b.add_argument("--baseline", default=None,
                   help="comma list: hf (transformers' assisted generation on the same pair), "
                        "llama-server (llama.cpp's own server on the target's GGUF file, the same "
                        "prompt tokens, threads and context; greedy; built once into the cache when "
                        "not on PATH or in $ANYDRAFT_LLAMA_SERVER), ik-llama-server (ik_llama.cpp's "
                        "own server, likewise; $ANYDRAFT_IK_LLAMA_SERVER)")
    b.add_argument("--dataset", default="builtin",
                   help="builtin | spec-bench (../shared/data/spec_bench_questions.jsonl) | PATH.jsonl")
    b.add_argument("--categories", default=None, help="comma list: only these categories")
    b.add_argument("--n", type=int, default=5, help="at most N prompts per category (default 5)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--target-backend", default="auto",
                   help="comma list of auto, torch, llamacpp, ik (GGUF as it is): one AR and one set of "
                        "runs per backend (default auto: the faster here, measured once)")
    b.add_argument("--drafter-backend", default=None,
                   help="comma list of auto, torch, llamacpp, ik: each drafter runs on each (default auto)")
    b.add_argument("--dtype", default="auto",
                   help="auto (the fastest here, measured once) | float32 | bfloat16 | float16 (torch backend)")
    b.add_argument("--drafter-dtype", default=None, help="default: same as --dtype")
    b.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto (cuda when there is a GPU, else cpu) | cpu | cuda: for torch models; "
                        "llama.cpp runs on the CPU")
    b.add_argument("--exact", nargs="?", const="on", default="auto", metavar="auto|on|both|off",
                   help="on (--exact alone): every target scores exactly, greedy output identical "
                        "to plain one-request decoding on the same path (docs/exact.md); both: "
                        "each target backend plain and exact, interleaved, with a table of what "
                        "exact costs (exact AR / plain AR, exact auto / plain auto); auto "
                        "(default): each target as `Decoder` chooses here (`anydraft doctor`); off")
    add_draft_options(b, skip=("method",))  # --methods instead; k is also the bound's
    add_sampling_options(b, SamplingParams(seed=0))  # seeded: a sampling run repeats exactly
    b.add_argument("--repeats", type=int, default=1, help="run everything R times, keep the median")
    b.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    b.add_argument("--busy-cores", type=int, default=0, metavar="N",
                   help="start N busy-spinning processes for the measured runs (after the warm-up) "
                        "and stop them after: speed on a machine that also runs something else")
    b.add_argument("--chat", choices=["auto", "yes", "no"], default="auto",
                   help="apply the target's chat template (auto: when it has one)")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--out", default=None, help="output directory (default bench-<date>-<time>)")
    b.add_argument("--json", action="store_true",
                   help="no progress lines; print results.json to stdout")
    b.set_defaults(func=cmd_bench)
    serve.register(sub)  # bench-serve: the server under concurrent load (bench/serve.py)


def settings_from_args(args):
    from ..errors import AnydraftError
    from ..models.backends import check_target_device
    from ..models.loading import parse_dtype, resolve_device
    from .runner import (
        BASELINES,
        EXACT_CHOICES,
        SERVERS,
        BenchSettings,
        backends_for,
        parse_backends,
        parse_methods,
    )

    if args.n < 1:
        raise AnydraftError(f"--n must be >= 1 (prompts per category), got {args.n}")
    if args.repeats < 1:
        raise AnydraftError(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_new_tokens < 1:
        raise AnydraftError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.busy_cores < 0:
        raise AnydraftError(f"--busy-cores must be >= 0, got {args.busy_cores}")
    if args.exact not in EXACT_CHOICES:
        raise AnydraftError(f"unknown --exact {args.exact!r}: on (or --exact alone: every target "
                            "exact), both (plain and exact side by side), auto (as doctor measured) or off")
    draft, sampling = draft_config(args), sampling_params(args)
    baselines = [b.strip() for b in (args.baseline or "").split(",") if b.strip()]
    for b in baselines:
        if b not in BASELINES:
            raise AnydraftError(f"unknown --baseline {b!r}: choose from {', '.join(BASELINES)}")
    if set(baselines) & set(SERVERS) and not sampling.greedy:
        raise AnydraftError(f"--baseline {' and '.join(b for b in SERVERS if b in baselines)} compares greedy decoding (its output must "
                            "equal plain decoding's): drop --temperature, or set it to 0")
    if "hf" in baselines and not args.drafter:
        raise AnydraftError("--baseline hf needs a drafter: pass --drafter MODEL")
    parse_dtype(args.dtype, allow_auto=True)
    if args.drafter_dtype is not None:
        parse_dtype(args.drafter_dtype, allow_auto=True)
    target_backends = backends_for(parse_backends(args.target_backend, "--target-backend"),
                                   args.dtype, "target")
    if args.drafter_backend is not None and not args.drafter:
        raise AnydraftError("--drafter-backend needs a drafter: pass --drafter MODEL")
    # --drafter-dtype alone chooses the drafter's backend; --dtype, handed down, does not
    drafter_backends = backends_for(parse_backends(args.drafter_backend or "auto", "--drafter-backend"),
                                    args.drafter_dtype, "drafter")
    for backend in target_backends:
        check_target_device(backend, args.device)
    device = resolve_device(args.device)
    text = args.methods if args.methods is not None else "ar,auto"
    methods = parse_methods(text, has_drafter=bool(args.drafter))
    drafters = list(dict.fromkeys(args.drafter))
    return BenchSettings(
        target=args.target, drafters=drafters, methods=methods, target_backends=target_backends,
        drafter_backends=drafter_backends, baseline_hf="hf" in baselines,
        baseline_servers=tuple(b for b in SERVERS if b in baselines),
        max_new_tokens=args.max_new_tokens, sampling=sampling, dtype=args.dtype,
        drafter_dtype=args.drafter_dtype, device=device, draft=draft,
        repeats=args.repeats, warmup=not args.no_warmup, chat=args.chat, busy_cores=args.busy_cores,
        exact=args.exact)


def cmd_bench(args) -> int:
    from pathlib import Path

    from ..errors import AnydraftError
    from .datasets import load_dataset
    from .report import build_meta, labeller, mismatches, write_results, write_summary
    from .runner import BASELINES, run_bench

    settings = settings_from_args(args)
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    prompts = load_dataset(args.dataset, categories, args.n)
    out = Path(args.out or datetime.datetime.now().strftime("bench-%Y%m%d-%H%M%S"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnydraftError(f"cannot create --out directory {out}: {exc}") from exc

    def say(msg):
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    backends = (f" (target backends {','.join(settings.target_backends)}, drafter backends "
                f"{','.join(settings.drafter_backends)})"
                if [settings.target_backends, settings.drafter_backends] != [["torch"]] * 2 else "")
    say(f"bench: {len(prompts)} prompts x {len(settings.methods)} methods "
        f"x {max(1, len(settings.drafters))} drafter(s){backends}"
        f"{'' if settings.exact in ('off', 'auto') else ', exact ' + settings.exact}, {settings.repeats} repeat(s) -> {out}")
    rows = run_bench(settings, prompts, quiet=args.json)
    meta = build_meta(settings, command_line(args), prompts, args.dataset)
    results = write_results(out, meta, rows)
    plots = []
    if not args.no_plots:
        from .plots import write_plots

        plots = write_plots(out, rows, settings.draft.num_draft_tokens)
    summary = write_summary(out, meta, rows, plots)
    if args.json:
        print(results.read_text(encoding="utf-8"), end="")
    else:
        print(summary.read_text(encoding="utf-8"))
        say(f"wrote {results}, {summary}" + "".join(f", {out / p}" for p in plots))
    bad = [r for r in mismatches(rows) if r["method"] not in BASELINES]
    if bad:
        name = labeller(rows)
        print(f"anydraft bench: GREEDY MISMATCH in {len(bad)} run(s): "
              + ", ".join(f"{name(r)} on {r['prompt_id']}" for r in bad)
              + f" (see {summary})", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """Run `bench` alone (for tests and scripts): `python -m anydraft.bench.cli --target ...`."""
    from ..errors import AnydraftError

    parser = argparse.ArgumentParser(prog="anydraft")
    register(parser.add_subparsers(dest="command", required=True))
    argv = ["bench", *(argv if argv is not None else sys.argv[1:])]
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except AnydraftError as exc:
        print(f"anydraft: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
