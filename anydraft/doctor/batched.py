"""`anydraft doctor --batch`: the cost of one batched target call against the one-sequence curve
(issue 21; docs/hardware.md).

`--max-batch auto` (server/workers.py) and the batch-aware policy price a call of B rows x q
new tokens as the one-sequence curve's T(B x q) (hardware/profile.py): the linear layers do the
same work and read the weights once either way. Attention does not: B rows read B caches. This
measures the calls themselves, T_batch(B, q), with ``LoadedModel.new_batch`` after a
context in every row (`CONTEXT`), and reports T_batch(B, q) / T(B x q) and what the
``--max-batch auto`` rule (`profile.max_batch`) would choose from either.

Measured once per (machine, model, backend, dtype) like the curves and cached beside them in
``$ANYDRAFT_CACHE/profiles/<machine key>.batched.json``, under the curve's model key.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..atomic import cache_dir, write_text
from ..bench.bound import cost_at
from ..errors import AnydraftError
from ..hardware import profile
from ..hardware.machine import Machine, this_machine
from ..models import auto
from ..planning.settings import SETTINGS

ROWS = (1, 2, 4, 8)  # rows in one call
TOKENS = (1, 5)  # new tokens per row: a plain step, and a verification of 4 drafts
# tokens already in every row. Not the curve's 200: filling 8 rows costs 8 prompts, and on the
# 2-core Zen 3 with the 1.5B target (float32+onednn) 8 rows of 64 filled in 11 s on a quiet
# machine, while 8 of 200 took 100 s with another job on the cores. At these contexts attention
# is about 1% of a 1.5B model's call (its weights dominate), below the noise of these timings;
# --batch-context asks for another.
CONTEXT = 64


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` as sorted whole numbers >= 1, with 1 added (the rule's reference call)."""
    try:
        sizes = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        sizes = set()
    if not sizes or min(sizes) < 1:
        raise AnydraftError(f"{option} takes whole numbers >= 1 separated by commas, e.g. "
                            f"{option} 1,2,4,8 (got {text!r})")
    return tuple(sorted(sizes | {1}))


def context_for(max_length: int, tokens, context: int = CONTEXT) -> int:
    """The context the calls run after: ``context``, less where the model's window is shorter."""
    return min(context, max(1, max_length - max(tokens) - 2))


def measure(batch, rows=ROWS, tokens=TOKENS, width: int | None = None, context: int = CONTEXT,
            repeats: int = profile.REPEATS, progress=None, clock=time.perf_counter):
    """``({(B, q): seconds}, context)``: the median seconds of one ``feed_rows`` call of B rows x q
    new tokens each, logits for all of them (as a verification asks), for every B in ``rows``
    and q in ``tokens``, with ``context`` tokens already in every row (less where the model's
    window is shorter). Each row is filled once; every timed call is rolled back, so the
    context stays fixed. A first pass over all calls is not counted (one-off costs, the cache
    growing), and each later pass times every call once, so a change in the machine's load
    hits every call alike. ``width``: ids are drawn below it (any ids cost the same)."""
    width = width or batch.vocab_size
    n = context_for(batch.max_length, tokens, context)
    began = time.perf_counter()

    def say(message):
        if progress:
            progress(f"batch: {message} ({time.perf_counter() - began:.0f} s)")

    ids = {}
    for i in range(max(rows)):
        row = batch.add_row()
        ids[row] = [(7919 * (t + 211 * i) + 13) % width for t in range(n + max(tokens))]
        say(f"filling row {i + 1}/{max(rows)} with {n} tokens")
        batch.feed_rows({row: ids[row][:n]}, {row: 1})
    order = sorted(ids)
    calls = [(b, q) for q in tokens for b in rows]
    times = {call: [] for call in calls}
    for rep in range(repeats + 1):
        say(f"{'warm-up pass' if rep == 0 else f'pass {rep}/{repeats}'} over {len(calls)} calls "
            f"(rows {', '.join(map(str, rows))} x tokens {', '.join(map(str, tokens))})")
        for b, q in calls:
            feeds = {row: ids[row][n:n + q] for row in order[:b]}
            start = clock()
            batch.feed_rows(feeds, {row: q for row in feeds})
            elapsed = clock() - start
            for row in feeds:
                batch.rollback(row, n)
            if rep:
                times[(b, q)].append(elapsed)
    for row in order:
        batch.remove_row(row)
    return {call: statistics.median(t) for call, t in times.items()}, n


def summarize(calls: dict[tuple[int, int], float], curve: dict[int, float], batches: bool = True,
              limit: int = SETTINGS.max_auto_batch) -> dict:
    """The report's numbers from measured ``calls`` ({(B, q): seconds}, holding (1, 1)) and the
    one-sequence ``curve`` ({M: seconds}): per call, T(B x q) read off the curve (`cost_at`,
    extrapolated past its largest size) and the ratio; and ``--max-batch auto`` by the same
    rule (`profile.max_batch`) from the B x 1 calls (up to the largest B measured) and from
    the curve (up to ``limit``, as `anydraft serve` chooses: 1 where the model cannot batch)."""
    rows = []
    for (b, q), seconds in sorted(calls.items(), key=lambda c: (c[0][1], c[0][0])):
        one = cost_at(curve, b * q)
        rows.append({"rows": b, "tokens_per_row": q, "total_tokens": b * q,
                     "batch_ms": round(seconds * 1e3, 2), "curve_ms": round(one * 1e3, 2),
                     "ratio": round(seconds / one, 3), "extrapolated": b * q > max(curve)})
    single = {b: s for (b, q), s in calls.items() if q == 1}
    from_curve = profile.max_batch(curve, limit) if batches else 1
    return {
        "calls": rows,
        "max_batch_auto": {
            "from_batch": profile.max_batch(single, max(single)),
            "batch_limit": max(single),
            "from_curve": from_curve,
            "curve_limit": limit,
            "curve_slowdown": round(cost_at(curve, from_curve) / curve[1], 2),
            "reference_ms": {"batch": round(single[1] * 1e3, 2), "curve": round(curve[1] * 1e3, 2)},
        },
    }


def _path(machine: Machine) -> Path:
    return cache_dir() / "profiles" / f"{machine.key}.batched.json"


def cached(model_key: str, machine: Machine | None = None) -> tuple[dict[tuple[int, int], float], int] | None:
    """``({(B, q): seconds}, context)`` measured on this machine before, or None."""
    path = _path(machine or this_machine())
    if not path.is_file():
        return None
    entry = json.loads(path.read_text()).get("batched", {}).get(model_key)
    if entry is None:
        return None
    calls = {tuple(int(x) for x in call.split("x")): s for call, s in entry["seconds"].items()}
    return calls, entry["context"]


def save(model_key: str, calls: dict[tuple[int, int], float], context: int,
         machine: Machine | None = None) -> None:
    """Add ``calls`` to the model's entry (replacing the calls measured again; an entry at
    another context, or with huge pages the other way, is replaced whole, so that its calls
    compare). Keys read "BxQ": rows x new tokens per row. The huge-page state is a field of
    the entry, not part of the machine's key (`Machine.key`)."""
    machine = machine or this_machine()
    path = _path(machine)
    data = json.loads(path.read_text()) if path.is_file() else {"machine": machine.lines(), "batched": {}}
    entry = data["batched"].get(model_key)
    if entry is None or (entry["context"], entry["hugepages"]) != (context, machine.hugepages):
        entry = data["batched"][model_key] = {"context": context, "hugepages": machine.hugepages,
                                              "seconds": {}}
    entry["seconds"].update({f"{b}x{q}": s for (b, q), s in calls.items()})
    write_text(path, json.dumps(data, indent=1))


def report(spec: str, backend: str = "auto", dtype: str = "auto", device: str = "auto",
           rows=ROWS, tokens=TOKENS, context: int = CONTEXT, remeasure: bool = False,
           progress=None) -> dict:
    """``doctor --batch`` for the target ``spec`` on ``backend`` in ``dtype`` (auto: what
    `anydraft generate` would run it on): the batched calls (cached, or measured now; a
    measurement taken on a busy machine is used, not cached) against its cost curve (likewise)."""
    from ..models.backends import load
    from ..models.loading import resolve_device

    device = resolve_device(device)
    loaded = load(spec, backend, dtype=dtype, device=device, progress=progress, role="target")
    dtype = loaded.dtype or "gguf"  # the curve's name for a GGUF model as shipped
    key = auto.model_key(spec, loaded.backend, dtype, loaded.device.type)
    curve = auto.curve_of(spec, loaded, loaded.backend, progress)
    found = None if remeasure else cached(key)
    wanted = {(b, q) for b in rows for q in tokens}
    if found is not None and wanted <= set(found[0]) and found[1] == context_for(
            loaded.context_window, tokens, context):
        calls, context, fresh = {c: found[0][c] for c in wanted}, found[1], False
        if progress:
            progress(f"batch: {spec} measured on this machine before (--remeasure measures again)")
    else:
        quiet = not profile.busy()
        if progress and not quiet:
            progress("batch: the machine is busy, so this measurement is not cached")
        width = min(loaded.logits_width, len(loaded.tokenizer))
        calls, context = measure(loaded.new_batch(max(rows)), rows, tokens, width, context,
                                 progress=progress)
        fresh = True
        if quiet:
            save(key, calls, context)
    machine = this_machine()
    return {"machine": machine.lines(), "device": loaded.device.type, "model": spec,
            "backend": loaded.backend, "dtype": dtype, "batches": loaded.batches,
            "context": context, "curve_context": profile.CONTEXT, "repeats": profile.REPEATS,
            "measured_now": fresh,
            "curve_ms": {m: round(s * 1e3, 2) for m, s in curve.items()},
            **summarize(calls, curve, loaded.batches)}


def markdown(data: dict) -> str:
    """The report as people read it: the machine, one table row per call, the two choices."""
    path = "llama.cpp (GGUF)" if data["backend"] == "llamacpp" else f"torch {data['dtype']}"
    lines = [*data["machine"], f"device: {data['device']}", "",
             f"{data['model']} on {path}: ms of ONE call of B rows x q new tokens each, after "
             f"{data['context']} tokens in every row (median of {data['repeats']}), against the "
             f"one-sequence curve (after {data['curve_context']} tokens) at the same total tokens", "",
             "| rows B | tokens per row q | B x q | batched call ms | one sequence T(B x q) ms | ratio |",
             "|---|---|---|---|---|---|"]
    for c in data["calls"]:
        mark = "*" if c["extrapolated"] else ""
        lines.append(f"| {c['rows']} | {c['tokens_per_row']} | {c['total_tokens']} | {c['batch_ms']:.1f} "
                     f"| {c['curve_ms']:.1f}{mark} | {c['ratio']:.2f} |")
    if any(c["extrapolated"] for c in data["calls"]):
        lines.append(f"\n\\* past the curve's largest size ({max(map(int, data['curve_ms']))} tokens): "
                     "extrapolated along its last two sizes")
    if not data["batches"]:
        lines.append("\nthis model runs the rows of a batch one after another (SerialBatch, "
                     "models/batch.py), so `--max-batch auto` keeps 1")
    rule = data["max_batch_auto"]
    lines.append(
        f"\n--max-batch auto (the fewest rows B whose B x 1 call, costing T(B), gives within 5% of "
        f"the most throughput B / T(B)): {rule['from_batch']} from the batched calls (1 x 1: "
        f"{rule['reference_ms']['batch']:.1f} ms; measured up to B = {rule['batch_limit']}), "
        f"{rule['from_curve']} from the one-sequence curve (T(1): {rule['reference_ms']['curve']:.1f} ms; "
        f"up to {rule['curve_limit']}: what `anydraft serve` chooses; each row's step "
        f"{rule['curve_slowdown']:.2f}x a lone row's there; a smaller --max-batch bounds that)")
    return "\n".join(lines)


def doctor_batch(args, progress) -> dict:
    """``doctor --batch``'s measurement (doctor/report.py prints or writes it)."""
    if not args.target:
        raise AnydraftError("doctor --batch measures a target's batched calls: pass --target NAME")
    if args.drafter:
        raise AnydraftError("doctor --batch measures the target alone: drop --drafter")
    rows = parse_sizes(args.batch_sizes, "--batch-sizes")
    tokens = parse_sizes(args.batch_tokens, "--batch-tokens")
    context = CONTEXT if args.batch_context is None else args.batch_context
    if context < 1:
        raise AnydraftError(f"--batch-context takes a number of tokens >= 1 (got {context})")
    start = time.perf_counter()
    data = report(args.target, args.target_backend, args.dtype, args.device, rows, tokens,
                  context, args.remeasure, progress)
    progress(f"batch: done in {time.perf_counter() - start:.0f} s")
    return data
