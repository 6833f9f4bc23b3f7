"""Prompt sets: builtin, JSONL with `prompt` or Spec-Bench `turns`, filters and errors."""

import json

import pytest

from anydraft.bench.datasets import load_dataset
from anydraft.errors import AnydraftError


def write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_builtin_has_several_categories_including_code():
    rows = load_dataset("builtin")
    assert {"code", "math"} <= {r["category"] for r in rows}
    assert all(r["prompt"].strip() for r in rows)


def test_prompt_and_turns_rows(tmp_path):
    path = write(tmp_path / "d.jsonl", [
        {"id": "p1", "category": "code", "prompt": "def f(x):"},
        {"question_id": 81, "category": "writing", "turns": ["first turn", "second turn"]},
        {"prompt": "no id, no category"},
    ])
    rows = load_dataset(path)
    assert [(r["id"], r["category"], r["prompt"]) for r in rows] == [
        ("p1", "code", "def f(x):"), ("81", "writing", "first turn"), ("3", "default", "no id, no category")]


def test_n_per_category_and_category_filter(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"id": f"{c}{i}", "category": c, "prompt": "x"}
                                        for c in "abc" for i in range(3)])
    assert [r["id"] for r in load_dataset(path, n=2)] == ["a0", "a1", "b0", "b1", "c0", "c1"]
    assert [r["id"] for r in load_dataset(path, ["c", "a"], n=1)] == ["a0", "c0"]
    with pytest.raises(AnydraftError, match="unknown category zzz.*choose from a, b, c"):
        load_dataset(path, ["zzz"])


@pytest.mark.parametrize("n", [0, -1])
def test_bad_n(n):
    with pytest.raises(AnydraftError, match="--n must be a positive integer"):
        load_dataset("builtin", n=n)


def test_missing_empty_and_malformed_files(tmp_path):
    with pytest.raises(AnydraftError, match="neither 'builtin', 'spec-bench' nor an existing"):
        load_dataset(str(tmp_path / "nope.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(AnydraftError, match="has no prompts"):
        load_dataset(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    with pytest.raises(AnydraftError, match=r"bad.jsonl:2"):
        load_dataset(str(bad))


def test_spec_bench_found_or_clear_error(monkeypatch, tmp_path):
    path = write(tmp_path / "sb.jsonl", [{"question_id": 1, "category": "qa", "turns": ["q?"]}])
    monkeypatch.setenv("ANYDRAFT_SPEC_BENCH", path)
    assert load_dataset("spec-bench")[0]["prompt"] == "q?"
    monkeypatch.setattr("anydraft.bench.datasets.spec_bench_candidates", lambda: [tmp_path / "x"])
    with pytest.raises(AnydraftError, match="Spec-Bench questions not found"):
        load_dataset("spec-bench")
