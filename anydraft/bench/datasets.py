"""Prompt sets for the benchmark: `builtin`, `spec-bench` (found next to the repo), or a JSONL."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import AnydraftError
from ..prompts import builtin_prompts, load_jsonl

SPEC_BENCH_NAME = "spec_bench_questions.jsonl"


def spec_bench_candidates() -> list[Path]:
    """Where `--dataset spec-bench` looks: $ANYDRAFT_SPEC_BENCH, then ../shared/data/ beside
    the current directory and beside the source checkout. The package never ships the file."""
    found = []
    if os.environ.get("ANYDRAFT_SPEC_BENCH"):
        found.append(Path(os.environ["ANYDRAFT_SPEC_BENCH"]))
    repo = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), repo):
        found.append(base / ".." / "shared" / "data" / SPEC_BENCH_NAME)
        found.append(base / "shared" / "data" / SPEC_BENCH_NAME)
    return found


def load_dataset(spec: str, categories: list[str] | None = None, n: int | None = None,
                 turns: bool = False) -> list[dict]:
    """Rows {id, category, prompt}: at most ``n`` per category (file order), only ``categories``
    when given. Clear errors for a missing or malformed file, an unknown category, no rows.
    With ``turns``, each row also has ``turns``: its user messages, ``prompt`` first, then the
    later ones a Spec-Bench row carries (its "multi-turn conversation" rows have a second)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise AnydraftError(f"--n must be a positive integer (prompts per category), got {n!r}")
    path = None  # the JSONL file read, for the later turns
    if spec == "builtin":
        rows = builtin_prompts()  # one turn each
    elif spec == "spec-bench":
        path = next((p for p in spec_bench_candidates() if p.is_file()), None)
        if path is None:
            raise AnydraftError(
                f"Spec-Bench questions not found (looked for ../shared/data/{SPEC_BENCH_NAME}); "
                "pass the file as --dataset PATH.jsonl or set ANYDRAFT_SPEC_BENCH")
        rows = load_jsonl(path)
    else:
        if not Path(spec).is_file():
            raise AnydraftError(
                f"dataset {spec!r} is neither 'builtin', 'spec-bench' nor an existing JSONL file")
        path = spec
        rows = load_jsonl(spec)
    if turns:
        later = later_turns(path) if path is not None else [[] for _ in rows]
        assert len(later) == len(rows), "later_turns reads the lines load_jsonl reads"
        for row, more in zip(rows, later, strict=True):
            row["turns"] = [row["prompt"], *more]
    for i, row in enumerate(rows):
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise AnydraftError(f"{spec}: prompt {row['id']!r} (row {i + 1}) is empty or not a string")
        row["category"] = str(row["category"])
    if not rows:
        raise AnydraftError(f"dataset {spec!r} has no prompts")
    if categories:
        known = sorted({r["category"] for r in rows})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise AnydraftError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} in "
                f"{spec!r}: choose from {', '.join(known)}")
        rows = [r for r in rows if r["category"] in categories]
    if n is not None:
        seen: dict[str, int] = {}
        picked = []
        for r in rows:
            if seen.get(r["category"], 0) < n:
                seen[r["category"]] = seen.get(r["category"], 0) + 1
                picked.append(r)
        rows = picked
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):  # ids key the speedup pairing: make them unique
        for i, r in enumerate(rows):
            r["id"] = f"{r['id']}#{i}"
    return rows


def later_turns(path) -> list[list[str]]:
    """Each row's user turns after its first, in `load_jsonl`'s order (a row per non-blank
    line): a Spec-Bench row's ``turns`` past the first, none for a row with its own ``prompt``.
    Entries that are not text are left out."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)  # load_jsonl has read it already: valid
        turns = [] if "prompt" in obj else obj.get("turns", [])[1:]
        out.append([t for t in turns if isinstance(t, str) and t.strip()])
    return out
