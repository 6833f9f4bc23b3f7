"""`anydraft doctor`: this machine, each model's measured cost curves, and what `auto` chooses."""

from __future__ import annotations

import json
import sys

from ..errors import AnydraftError
from ..hardware import profile
from ..hardware.machine import this_machine
from ..models import auto, exact_cost, synthetic
from ..models.backends import load
from ..models.engines import ENGINES
from ..models.static import SUFFIX as COMPILED
from ..planning.settings import SETTINGS

LLAMACPP_COPY = "llama.cpp copy"  # the path name doctor prints for a quantized copy
SERVER_ROWS = SETTINGS.max_auto_batch  # the most rows a server's target scores with `--max-batch auto`


def copy_path(kind: str) -> str:
    """The path name doctor prints for a quantized copy (``kind``: q4_0, q8_0)."""
    return f"{LLAMACPP_COPY} {kind.upper()}"


def gguf_path(engine: str) -> str:
    """The path name doctor prints for a llama.cpp-family engine running the GGUF as shipped."""
    return f"{ENGINES[engine].label} (GGUF as shipped)"


def _gguf_curves(spec: str, remeasure: bool, progress, engines=None) -> dict[str, dict[int, float]]:
    """``{engine: cost curve}`` of a GGUF model on each llama.cpp-family engine that runs it here
    (``engines``: these only)."""
    return {engine: auto.curves(spec, engine, ("gguf",), "cpu", progress, remeasure)[0]["gguf"]
            for engine in auto.gguf_engines(spec) if engines is None or engine in engines}


def report(models: dict[str, str], device: str = "auto", progress=None, remeasure: bool = False,
           compile: bool = False, quantize: tuple[str, ...] = ()) -> dict:
    """Each model's (``{spec: "target" or "drafter"}``) measured curves on every path
    (``compile``: the compiled torch paths too; ``quantize``: llama.cpp copies of a GGUF model
    in those weight types, `quantized`) and what ``auto`` chooses from them."""
    from ..models.loading import resolve_device

    device = resolve_device(device)  # curves are keyed by "cpu" or "cuda", never "auto"
    machine = this_machine()
    out = {"machine": machine.lines(), "native_bf16": machine.native_bf16, "device": device,
           "models": {}}
    for spec, role in models.items():
        curves = auto.curves(spec, "torch", auto.torch_paths(spec, device, compile), device,
                             progress, remeasure)[0]
        best, serving = auto.fastest(curves), auto.fastest(curves, SERVER_ROWS)
        paths = {f"torch {d}": c for d, c in curves.items()}
        gguf = _gguf_curves(spec, remeasure, progress)
        paths.update({gguf_path(engine): curve for engine, curve in gguf.items()})

        as_target, as_drafter, as_server = (
            _choice(as_role, path, curves, gguf, rows)
            for as_role, path, rows in (("target", best, 1), ("drafter", best, 1), ("target", serving, SERVER_ROWS)))
        # what exact scoring costs on each path a target runs on (models/exact_cost.py)
        exact = _exact_costs(spec, [*curves, *gguf], device, remeasure, progress) if role == "target" else {}
        copies = quantized(spec, quantize, remeasure, progress) if "llamacpp" in gguf else {}
        paths.update({copy_path(kind): curve for kind, (_, curve) in copies.items()})
        out["models"][spec] = {
            # random weights or none (models/synthetic/): the speeds of a shape, said so
            "synthetic": synthetic.describe(spec) if synthetic.is_spec(spec) else None,
            "curves_ms": {path: {m: round(s * 1e3, 2) for m, s in c.items()} for path, c in paths.items()},
            "tokens_per_s": {path: round(profile.rate(c), 2) for path, c in paths.items()},
            # a server's rows (`--max-batch auto`) and their tokens/s: B one-token rows a call
            "served": {path: dict(zip(("rows", "tokens_per_s"), _served(path, c), strict=True))
                       for path, c in paths.items()},
            "dtype_auto": best,
            "backend_auto": {"target": as_target, "drafter": as_drafter, "server": as_server},
            "copies": {kind: path for kind, (path, _) in copies.items()},
            # {path: {"cost", "ratios"} or None where the path cannot score exactly}
            "exact": {(gguf_path(path) if path in ENGINES else f"torch {path}"): cost
                      for path, cost in exact.items()},
            "role": role,
        }
    return out


def _choice(role: str, path: str, curves: dict, gguf: dict, rows: int) -> str:
    """What `auto` runs a model in ``role`` on: the torch ``path`` (of ``curves``) or an engine
    of ``gguf`` (`auto.best_for`), as doctor names it."""
    best = auto.best_for(role, {path: curves[path], **gguf}, rows)
    return gguf_path(best) if best in gguf else f"torch {path}"


def _exact_costs(spec: str, paths: list[str], device: str, remeasure: bool, progress) -> dict:
    """``{path: exact_cost.measure's result, or None where it cannot score exactly}`` for
    ``spec`` as a target on each of ``paths`` (torch dtypes, or a llama.cpp-family engine's
    name): cached, or measured now, one model at a time."""
    out = {}
    for path in paths:
        backend, dtype = (path, "gguf") if path in ENGINES else ("torch", path)
        found = None if remeasure else exact_cost.cached(spec, backend, dtype, "cpu" if path in ENGINES else device)
        if found is None and not path.endswith(COMPILED):  # compiled: never exact
            model = load(spec, backend, dtype=dtype, device=device, dtype_given=False)
            found = exact_cost.measure_and_save(spec, model, progress)
            del model  # before the next one loads
        out[path] = found
    return out


def _served(path: str, curve: dict) -> tuple[int, float]:
    rows, tokens_per_s = profile.served(curve, SERVER_ROWS, auto.batches(path))
    return rows, round(tokens_per_s, 2)


def quantized(spec: str, kinds, remeasure: bool, progress) -> dict[str, tuple[str, dict]]:
    """``{kind: (path, llama.cpp curve)}`` of a copy of ``spec`` in each weight type of ``kinds``
    (written once, models/llamacpp.py `quantize`)."""
    from ..models.llamacpp import quantize

    copies = {}
    for kind in kinds:
        path = quantize(spec, kind, progress)
        copies[kind] = path, _gguf_curves(path, remeasure, progress, ("llamacpp",))["llamacpp"]
    return copies


def advice(spec: str, m: dict, role: str) -> str:
    """Whether a quantized copy would run ``spec`` faster in ``role`` than what ``auto`` runs it
    on, by `auto.best_for`'s rule (a target by its expected tokens per second, a drafter
    by its one-token step). A copy is a different model, so it is the user's choice,
    never made for them; as a drafter it changes nothing in the output, only the speed."""
    runs_on = m["backend_auto"][role]
    curves = {path: {int(k): v for k, v in c.items()} for path, c in m["curves_ms"].items()}
    faster = [kind for kind in m["copies"] if auto.best_for(
        role, {runs_on: curves[runs_on], copy_path(kind): curves[copy_path(kind)]}) == copy_path(kind)]
    if not faster:
        return f"no quantized copy of {spec} would beat {runs_on} as a {role} here"
    best = max(faster, key=lambda kind: m["tokens_per_s"][copy_path(kind)] if role == "target"
               else -curves[copy_path(kind)][1])
    gain = (f"{m['tokens_per_s'][copy_path(best)]:.1f} expected tokens/s against "
            f"{m['tokens_per_s'][runs_on]:.1f}" if role == "target"
            else f"{curves[copy_path(best)][1]:.1f} ms per drafted token against {curves[runs_on][1]:.1f}")
    what = ("greedy output equals plain decoding of the copy, not of the original" if role == "target"
            else "the output stays exactly the target's; only the acceptance may change")
    return (f"a {best.upper()} copy of {spec} would run as the {role} at {gain} on {runs_on}: pass "
            f"--{role} {m['copies'][best]} to use it (a different model: {what})")


def print_report(data: dict) -> None:
    print("\n".join(data["machine"]))
    print(f"device: {data['device']} (torch models; llama.cpp and ik_llama.cpp run on the CPU)")
    for spec, m in data["models"].items():
        # curves cached before a size was added lack it
        sizes = sorted({int(s) for curve in m["curves_ms"].values() for s in curve})
        print(f"\n{spec}: ms to score M tokens in one call after {profile.CONTEXT} tokens")
        if m.get("synthetic"):
            print(f"SYNTHETIC: {m['synthetic']}")
        print("| path | " + " | ".join(f"M={s}" for s in sizes) + " | best tokens/s | served: rows, tokens/s |")
        print("|---|" + "---|" * (len(sizes) + 2))
        for path, curve in m["curves_ms"].items():
            curve = {int(s): v for s, v in curve.items()}
            served = m["served"][path]
            print(f"| {path} | " + " | ".join(f"{curve[s]:.1f}" if s in curve else "–" for s in sizes)
                  + f" | {m['tokens_per_s'][path]:.1f} | {served['rows']}, {served['tokens_per_s']:.1f} |")
        print(f"dtype auto -> {m['dtype_auto']}: the most expected tokens per second at the prior "
              "acceptance (0.5 per token), over plain and speculative steps")
        chosen = m["backend_auto"]
        print(f"backend auto -> as a target: {chosen['target']} (the same rule); as a drafter: "
              f"{chosen['drafter']} (the cheaper one-token step); as a server's target: "
              f"{chosen['server']} (closest to the best path's plain tokens/s at every load "
              f"from 1 to {SERVER_ROWS} requests, each batched up to `--max-batch auto`: served)")
        if m.get("exact"):
            print(exact_lines(m))
        if m["copies"]:
            print(advice(spec, m, m["role"]))


def exact_lines(m: dict) -> str:
    """What exact scoring costs on each path (each call's exact / plain time) and where
    ``exact="auto"`` turns it on."""
    lines = ["exact scoring (greedy output identical to plain decoding in any method and batch; "
             f"docs/exact.md), exact / plain time per call of M tokens after {profile.CONTEXT}, "
             f"and of one after {exact_cost.LONG_CONTEXT}:"]
    for path, found in m["exact"].items():
        if found is None:
            lines.append(f"- {path}: cannot score exactly")
            continue
        on = found["cost"] <= exact_cost.AUTO_COST
        ratios = ", ".join(f"{'M=' + call if '@' not in call else call} {r:.2f}x"
                           for call, r in found["ratios"].items())
        lines.append(f"- {path}: {ratios}: calls up to {found['cost']:.1%} slower, so exact auto "
                     f"is {'on' if on else 'off'} there (on at most {exact_cost.AUTO_COST:.0%})")
    return "\n".join(lines)


def cmd_doctor(args) -> int:
    """``--json`` alone prints JSON instead of the tables; ``--json PATH`` writes it there too."""
    def progress(message):
        print(message, file=sys.stderr)

    if args.batch:
        from .batched import doctor_batch, markdown

        data, show = doctor_batch(args, progress), lambda data: print(markdown(data))
    else:
        if (args.dtype, args.target_backend) != ("auto", "auto"):
            raise AnydraftError("--dtype and --target-backend choose the path `doctor --batch` "
                                "measures; doctor alone measures every path: drop them or add --batch")
        models = {spec: role for spec, role in ((args.target, "target"), (args.drafter, "drafter")) if spec}
        data = report(models, args.device, None if args.json is True else progress,
                      args.remeasure, args.compile, tuple(k for k in args.quantize.split(",") if k))
        show = print_report
    if args.json is True:
        print(json.dumps(data, indent=1))
        return 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    show(data)
    return 0
