"""Command line: `anydraft generate | models | pair | demo | doctor | bench | scout | serve`."""

from __future__ import annotations

import argparse
import json
import sys

from .bench import cli as bench_cli
from .errors import AnydraftError
from .models.engines import BACKENDS
from .options import (
    add_draft_options,
    add_model_options,
    add_sampling_options,
    decoder_options,
    progress,
    sampling_params,
)
from .scout import cli as scout_cli
from .server import cli as server_cli


def cmd_generate(args) -> int:
    if (args.prompt is None) == (args.prompt_file is None):
        raise AnydraftError("give exactly one of --prompt TEXT or --prompt-file FILE")
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as exc:
            raise AnydraftError(f"cannot read --prompt-file: {exc}") from exc
    else:
        prompt = args.prompt
    sampling = sampling_params(args)  # invalid settings fail before the models load
    if args.logprobs is not None and not args.json:
        raise AnydraftError("--logprobs prints with --json only: add --json")
    grammar = grammar_of(args)
    from .decoder import Decoder

    dec = Decoder(**decoder_options(args))
    kwargs = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, chat=args.chat,
                  stop=args.stop, grammar=grammar)
    if args.json:
        out = dec.generate(prompt, logprobs=args.logprobs, **kwargs)
        result = {"text": out.text, "token_ids": out.token_ids,
                  "finish_reason": out.finish_reason, "stats": out.stats}
        if out.logprobs is not None:  # per token: [id, log-probability, [[id, lp], ...]]
            result["logprobs"] = [[e.token, e.logprob, e.top] for e in out.logprobs]
        print(json.dumps(result, indent=2))
    else:
        stream = dec.stream(prompt, **kwargs)
        for delta in stream:
            print(delta, end="", flush=True)
        print()
        s = stream.output.stats
        progress(f"[{s['method']}] {s['new_tokens']} tokens in {s['seconds']:.2f} s "
                 f"({s['tokens_per_s']:.1f} tok/s, {s['mean_accepted']:.2f} tokens per target "
                 f"call), finish: {stream.output.finish_reason}")
    return 0


def cmd_models(args) -> int:
    from .models import catalog

    if args.action == "list":
        rows = catalog.list_models()
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{'name':<20} {'installed':<10} {'size':>9}  description")
            for r in rows:
                size = f"{r['size_bytes'] / 2**20:.0f} MiB"
                print(f"{r['name']:<20} {'yes' if r['installed'] else 'no':<10} {size:>9}  {r['description']}")
            from .models import synthetic

            print("synthetic shapes (random weights: synthetic:NAME; no model: null:NAME): "
                  + ", ".join(synthetic.names()))
        return 0
    if args.action == "export-tokenizers":
        from .models.loading import export_tokenizers

        if len(args.names) != 1:
            raise AnydraftError("name the archive to write, e.g. "
                                "`anydraft models export-tokenizers .carry/tokenizers.tar.xz`")
        path = export_tokenizers(args.names[0], progress)
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB (unpack into $ANYDRAFT_CACHE)")
        return 0
    if args.action == "quantize":
        from .models.llamacpp import quantize

        if not args.names:
            raise AnydraftError("name the GGUF models to quantize (catalog names or .gguf files)")
        for name in args.names:
            print(f"{name}: {quantize(name, args.type, progress)} (a different model: pass this "
                  "path as the target or drafter)")
        return 0
    names = list(catalog.CATALOG) if args.names == ["all"] else args.names
    if not names:
        raise AnydraftError("name the models to install (or `all`)")
    for name in names:
        catalog.get_entry(name)  # fail on a typo before installing anything
    for name in names:
        path = catalog.install(name, progress=progress)
        print(f"{name}: {path}")
    return 0


def cmd_pair(args) -> int:
    from .bridge.report import format_pair_report, pair_report
    from .models.loading import load_tokenizer

    report = pair_report(load_tokenizer(args.target), load_tokenizer(args.drafter))
    print(json.dumps(report, indent=2) if args.json else format_pair_report(report))
    return 0


def cmd_doctor(args) -> int:
    from .doctor.report import cmd_doctor

    return cmd_doctor(args)


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def grammar_of(args):
    """``--json-schema FILE``, ``--regex`` or ``--grammar FILE`` (Lark) as a `Grammar`, or None."""
    from .constraints.grammar import Grammar

    given = [(kind, value) for kind, value in (("json_schema", args.json_schema), ("regex", args.regex),
                                                ("lark", args.grammar)) if value is not None]
    if len(given) > 1:
        raise AnydraftError("give at most one of --json-schema, --regex and --grammar")
    if not given:
        return None
    kind, value = given[0]
    if kind == "regex":
        return Grammar(kind, value)
    try:
        with open(value, encoding="utf-8") as f:
            return Grammar(kind, f.read())
    except OSError as exc:
        raise AnydraftError(f"cannot read --{'json-schema' if kind == 'json_schema' else 'grammar'}: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anydraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text")
    add_model_options(g)
    add_draft_options(g)
    g.add_argument("--prompt", default=None)
    g.add_argument("--prompt-file", default=None)
    g.add_argument("--chat", action="store_true", help="apply the target's chat template")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's log-probability and its N (0-20) most likely "
                        "alternatives under the target's processed distribution")
    s = g.add_argument_group("structured output (the target's distribution restricted to what matches)")
    s.add_argument("--json-schema", default=None, metavar="FILE", help="the output is JSON valid under this schema")
    s.add_argument("--regex", default=None, help="the output matches this regular expression")
    s.add_argument("--grammar", default=None, metavar="FILE", help="the output matches this Lark grammar")
    add_sampling_options(g)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list or install the offline model catalog")
    m.add_argument("action", choices=["list", "install", "quantize", "export-tokenizers"])
    m.add_argument("names", nargs="*", help="models to install (or `all`) or to quantize; "
                   "export-tokenizers: the .tar.xz to pack the synthetic models' tokenizers in")
    m.add_argument("--type", default="q4_0", help="quantize: the weight type of the copy (q4_0, q8_0)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)

    p = sub.add_parser("pair", help="compare the tokenizers of a target and a drafter")
    p.add_argument("target")
    p.add_argument("drafter")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_pair)

    doc = sub.add_parser("doctor", help="this machine, each model's measured costs, what auto chooses")
    doc.add_argument("--target", default=None, help="a model to measure (catalog name, hub id, dir, .gguf)")
    doc.add_argument("--drafter", default=None, help="a second model to measure")
    doc.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="auto (cuda when there is a GPU, else cpu) | cpu | cuda: where torch "
                          "models are measured; llama.cpp runs on the CPU")
    doc.add_argument("--remeasure", action="store_true", help="measure again, replacing the cached curves")
    doc.add_argument("--compile", action="store_true",
                     help="measure each dtype compiled on a static cache too (torch.compile: minutes "
                          "per model on a CPU); once measured, auto weighs it")
    doc.add_argument("--quantize", default="", metavar="q4_0,q8_0",
                     help="also measure llama.cpp copies of a GGUF model in these weight types "
                          "(written once into the cache) and say whether one would be faster")
    doc.add_argument("--batch", action="store_true",
                     help="measure the target's batched calls (B rows x q new tokens in one call) "
                          "against its one-sequence curve and what --max-batch auto would choose")
    doc.add_argument("--batch-sizes", default="1,2,4,8", metavar="1,2,4,8",
                     help="--batch: the rows B in one call (1 is always measured)")
    doc.add_argument("--batch-tokens", default="1,5", metavar="1,5",
                     help="--batch: the new tokens q per row (1 is always measured)")
    doc.add_argument("--batch-context", type=int, default=None, metavar="TOKENS",
                     help="--batch: tokens already in every row before the timed calls (default 64; "
                          "each row is filled once, as a prompt of this length)")
    doc.add_argument("--dtype", default="auto",
                     help="--batch: the target's dtype, as in `generate` (auto: the fastest here), "
                          "e.g. float32+onednn")
    doc.add_argument("--target-backend", default="auto", choices=("auto", *BACKENDS),
                     help="--batch: the target's backend, as in `generate` (auto: the faster here)")
    doc.add_argument("--json", nargs="?", const=True, default=None, metavar="PATH",
                     help="print JSON instead of the tables; with PATH, write it there and print "
                          "the tables")
    doc.set_defaults(func=cmd_doctor)

    d = sub.add_parser("demo", help="plain decoding vs anydraft on built-in prompts")
    d.add_argument("--target", default="qwen2.5-coder-0.5b")
    d.add_argument("--drafter", default="smollm2-135m")
    d.add_argument("--method", default="auto")
    d.add_argument("--dtype", default="auto",
                   help="the target's dtype, for plain decoding and anydraft alike (auto: the "
                        "fastest on this machine, measured once)")
    d.add_argument("--drafter-dtype", default="auto",
                   help="the drafter's dtype never changes the output (auto: the fastest here)")
    d.add_argument("--target-backend", default="auto", choices=("auto", *BACKENDS),
                   help="auto: llama.cpp or torch, whichever runs the target faster here (measured "
                        "once); plain decoding and anydraft use the same")
    d.add_argument("--drafter-backend", default="auto", choices=("auto", *BACKENDS),
                   help="auto: whichever drafts faster here (measured once)")
    d.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: cuda when there is a GPU, else cpu (llama.cpp runs on the CPU)")
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--n", type=int, default=3, help="number of built-in prompts")
    d.set_defaults(func=cmd_demo)
    bench_cli.register(sub)
    scout_cli.register(sub)
    server_cli.register(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the command as typed, for reports (`anydraft bench` records it)
    try:
        return args.func(args)
    except AnydraftError as exc:
        print(f"anydraft: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The `anydraft` command: first started again with huge pages where that helps
    (hardware/hugepages.py), then `main`."""
    from .hardware.hugepages import reexec

    reexec()
    sys.exit(main())


if __name__ == "__main__":
    entry()
