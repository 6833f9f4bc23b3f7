"""Prompt sets: the small built-in set shipped with the package, and JSONL files."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from .errors import AnydraftError


def load_jsonl(path) -> list[dict]:
    """Rows with ``id``, ``category``, ``prompt``: a ``prompt`` field or Spec-Bench's ``turns``."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AnydraftError(f"cannot read prompt file {path}: {exc}") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            prompt = obj["prompt"] if "prompt" in obj else obj["turns"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise AnydraftError(
                f"{path}:{lineno}: each line must be a JSON object with a 'prompt' "
                f"(or Spec-Bench 'turns') field ({exc})"
            ) from exc
        rows.append({
            "id": str(obj.get("id", obj.get("question_id", lineno))),
            "category": obj.get("category", "default"),
            "prompt": prompt,
        })
    return rows


def builtin_prompts() -> list[dict]:
    return load_jsonl(files("anydraft").joinpath("data/prompts.jsonl"))
