"""Command line options shared by `anydraft generate`, `bench` and `serve`: the models, and
options built from the fields of `DraftConfig` and `SamplingParams` (and read back into them).

Each field is one option: ``--field-name`` (or the field's ``flag`` metadata), its default,
its ``help`` metadata; a bool field is a switch that flips its default (``--fixed-k`` sets
``adaptive`` to False). The values are validated once, by the dataclass, when they are read
back. Light at import time: argparse and dataclasses only, so `anydraft --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from .config import DraftConfig
from .models.engines import BACKENDS
from .sampling import SamplingParams

# --exact: its words and the `Decoder` ``exact`` each stands for
EXACT_CHOICES = {"on": True, "off": False, "auto": "auto"}


def logit_bias(text: str) -> dict[int, float]:
    """``--logit-bias ID=BIAS,ID=BIAS`` as {id: bias} (`SamplingParams` checks the values)."""
    try:
        return {int(i): float(b) for i, _, b in (p.partition("=") for p in text.split(",") if p)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give ID=BIAS pairs, e.g. 1234=-100,99=5") from None


_TYPES = {"int": int, "float": float, "str": str, "int | None": int,
          "tuple[tuple[int, float], ...]": logit_bias}


def command_line(args) -> str:
    """The command as typed (anydraft/cli.py `main` keeps its arguments in ``args.argv``)."""
    return shlex.join(["anydraft", *args.argv])


def _add(parser: argparse.ArgumentParser, title: str, defaults, skip: tuple[str, ...]) -> None:
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(defaults):
        if f.name in skip:
            continue
        default = getattr(defaults, f.name)
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if f.type == "bool":
            group.add_argument(flag, dest=f.name, action="store_false" if default else "store_true",
                               help=f.metadata["help"])
        else:
            kind = _TYPES[f.type]
            group.add_argument(flag, dest=f.name, type=kind, default=default,
                               metavar="ID=BIAS,..." if kind is logit_bias else kind.__name__.upper(),
                               help=f.metadata["help"] + " (default: %(default)s)")


def _read(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if hasattr(args, f.name)})


def add_draft_options(parser: argparse.ArgumentParser, defaults: DraftConfig | None = None,
                      skip: tuple[str, ...] = ()) -> None:
    """--method, --num-draft-tokens, --draft-confidence, --fixed-k, --drafter-context
    (less those whose field is in ``skip``)."""
    _add(parser, "draft settings", defaults or DraftConfig(), skip)


def add_sampling_options(parser: argparse.ArgumentParser,
                         defaults: SamplingParams | None = None) -> None:
    """--temperature, --top-k, --top-p, --min-p, --seed, --logit-bias."""
    _add(parser, "sampling settings", defaults or SamplingParams(), ())


def draft_config(args: argparse.Namespace) -> DraftConfig:
    """The `DraftConfig` of parsed options (a skipped field keeps its default)."""
    return _read(DraftConfig, args)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The `SamplingParams` of parsed options."""
    return _read(SamplingParams, args)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The target, the drafter, their dtypes and backends (one of each: `anydraft bench` takes
    lists and has its own), and the device."""
    parser.add_argument("--target", required=True, help="catalog name, hub id, directory or .gguf")
    parser.add_argument("--drafter", default=None,
                        help="drafter model (any tokenizer), or auto: the one `anydraft scout` "
                             "chose for this target on this machine")
    parser.add_argument("--dtype", default="auto",
                        help="auto (the fastest here, measured once) | float32 | bfloat16 | float16, "
                             "+onednn for oneDNN linear layers, e.g. float32+onednn (target, torch)")
    parser.add_argument("--drafter-dtype", default=None, help="default: same as --dtype")
    parser.add_argument("--target-backend", default="auto", choices=("auto", *BACKENDS),
                        help="auto (the faster here, measured once) | torch (transformers, --dtype) | "
                             "llamacpp | ik (the GGUF as it is, quantized, on llama.cpp or ik_llama.cpp)")
    parser.add_argument("--drafter-backend", default=None, choices=("auto", *BACKENDS),
                        help="default: auto (the faster for the drafter here, measured once), "
                             "whatever --target-backend is")
    parser.add_argument("--exact", nargs="?", const="on", default="auto", choices=EXACT_CHOICES,
                        help="on (--exact alone): score the target so that greedy output is "
                             "token-identical to plain one-request decoding in any method and "
                             "batch; auto (default): on where `anydraft doctor` measured that it "
                             "costs little here; off (docs/exact.md)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto (cuda when there is a GPU, else cpu) | cpu | cuda: for torch "
                             "models; llama.cpp runs on the CPU")


def progress(msg: str) -> None:
    """Loading progress and run summaries: on stderr, so stdout holds only the output."""
    print(msg, file=sys.stderr, flush=True)


def decoder_options(args: argparse.Namespace) -> dict:
    """`Decoder` keyword arguments from `add_model_options` and `add_draft_options`."""
    return dict(target=args.target, drafter=args.drafter, dtype=args.dtype,
                drafter_dtype=args.drafter_dtype, backend=args.target_backend,
                drafter_backend=args.drafter_backend, device=args.device, draft=draft_config(args),
                progress=progress, exact=EXACT_CHOICES[getattr(args, "exact", "auto")])
