"""`anydraft bench` end to end on tiny random models saved to directories (3-prompt dataset)."""

import json
import shutil

import pytest

from anydraft.bench.report import ROW_KEYS
from anydraft.cli import main
from tests.helpers import save_tiny_pair

MAX_NEW = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_models")
    save_tiny_pair(root)
    # a drafter with the target's own weights: accepts everything (a = 1)
    shutil.copytree(root / "target", root / "twin")
    data = root / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": "c1", "category": "code", "prompt": "def f(x):"},
        {"id": "t1", "category": "text", "prompt": "the quick brown fox"},
        {"question_id": 7, "category": "text", "turns": ["hello world", "again"]},
    ]) + "\n")
    return root


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out")
    rc = main(["bench", "--target", str(models / "target"), "--drafter", str(models / "drafter"),
               "--drafter", str(models / "twin"), "--methods", "ar,lookup,sd,slem,auto",
               "--target-backend", "torch", "--drafter-backend", "torch", "--fixed-k",
               "--baseline", "hf", "--dataset", str(models / "prompts.jsonl"),
               "--max-new-tokens", str(MAX_NEW), "--no-warmup", "--out", str(out)])
    return rc, out, json.loads((out / "results.json").read_text())


def test_exit_status_and_files(run):
    rc, out, _ = run
    assert rc == 0
    for name in ("results.json", "summary.md", "speedup_by_category.png",
                 "measured_vs_bound.png", "accepted_hist.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "speedup_by_category.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_schema(run, models):
    _, _, res = run
    meta = res["meta"]
    assert {"machine", "command", "settings", "notes"} <= set(meta)
    assert {"platform", "cpu_count", "versions", "date"} <= set(meta["machine"])
    assert meta["command"].startswith("anydraft bench --target")
    assert meta["settings"]["max_new_tokens"] == MAX_NEW
    assert meta["settings"]["methods"] == ["ar", "lookup", "sd", "slem", "auto"]
    assert meta["settings"]["target_backends"] == meta["settings"]["drafter_backends"] == ["torch"]
    assert meta["settings"]["adaptive"] is False  # --fixed-k
    for row in res["results"]:
        assert set(ROW_KEYS) <= set(row), set(ROW_KEYS) - set(row)
        assert row["target_backend"] == "torch"
        assert row["drafter_backend"] == (None if row["method"] in ("ar", "lookup") else "torch")
        assert row["speedup_vs_fastest_plain"] == row["speedup_vs_ar"]  # the only plain path
        assert row["speedup_vs_llama_server"] is None


def test_one_row_per_prompt_method_drafter(run, models):
    _, _, res = run
    keys = [(r["prompt_id"], r["method"], r["drafter"]) for r in res["results"]]
    assert len(keys) == len(set(keys))
    drafters = [str(models / "drafter"), str(models / "twin")]
    expected = {(p, m, None) for p in ("c1", "t1", "7") for m in ("ar", "lookup")}  # no drafter
    expected |= {(p, m, d) for p in ("c1", "t1", "7") for m in ("sd", "slem", "auto", "hf")
                 for d in drafters}
    assert set(keys) == expected


def test_speedups_come_from_the_same_prompt(run):
    _, _, res = run
    ar = {r["prompt_id"]: r for r in res["results"] if r["method"] == "ar"}
    for r in res["results"]:
        base = ar[r["prompt_id"]]
        assert r["new_tokens"] == base["new_tokens"]  # greedy: same tokens
        assert r["speedup_vs_ar"] == pytest.approx(base["seconds"] / r["seconds"], rel=1e-9)
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["seconds"])
        if r["method"] == "hf":  # transformers' loop: no first-call time to leave out
            assert r["decode_speedup_vs_ar"] is None
        else:  # after the first target call, which reads the prompt
            assert 0 < r["prefill_seconds"] < r["seconds"]
            decode = (base["seconds"] - base["prefill_seconds"]) / (r["seconds"] - r["prefill_seconds"])
            assert r["decode_speedup_vs_ar"] == pytest.approx(decode, rel=1e-9)


def test_greedy_identical_to_ar(run):
    _, _, res = run
    assert all(r["identical_to_ar"] is True for r in res["results"])


def test_acceptance_bound_and_cost_ratio(run, models):
    _, _, res = run
    twin = [r for r in res["results"] if r["drafter"] == str(models / "twin") and r["method"] == "sd"]
    for r in twin:
        # the target's own weights as drafter: every draft is accepted (drafting stops at
        # the token budget), so a = 1 and S is its limit (k + 1) / (k c + 1)
        assert r["acceptance"] == 1.0 and r["mean_accepted"] > 1
        k, c, a = r["num_draft_tokens"], r["cost_ratio"], r["acceptance_per_token"]
        assert a == 1.0 and c > 0
        v = r["verify_costs"]  # the target's measured cost of scoring j + 1 tokens, in plain steps
        assert len(v) == k and all(x > 0 for x in v)
        assert r["bound"] == pytest.approx(max((j + 1) / (j * c + v[j - 1]) for j in range(1, k + 1)))
    for r in res["results"]:
        if r["method"] in ("ar", "hf"):
            assert r["bound"] is None and r["cost_ratio"] is None
        else:
            assert r["bound"] is not None and 0 <= r["acceptance"] <= 1
    hf = [r for r in res["results"] if r["method"] == "hf"]
    assert all(r["speedup_vs_hf"] == pytest.approx(1.0) for r in hf)


def test_summary_tables(run):
    _, out, res = run
    text = (out / "summary.md").read_text()
    assert res["meta"]["command"] in text
    assert "## Per method (all prompts)" in text and "## Per category and method" in text
    assert "bound S(a,k,c)" in text and "speedup vs hf" in text and "c (draft/target step)" in text
    assert "GREEDY MISMATCH" not in text
    assert "| code | ar |" in text and "| text | sd <- " in text
    assert "speedup vs fastest plain" not in text and "(torch)" not in text  # torch only: no backends
    assert "k = 5 draft tokens" in text


def test_json_mode_prints_results_and_no_progress(models, tmp_path, capsys):
    rc = main(["bench", "--target", str(models / "target"), "--drafter", str(models / "twin"),
               "--methods", "ar,slem", "--dataset", str(models / "prompts.jsonl"),
               "--categories", "code", "--max-new-tokens", "4", "--no-warmup", "--no-plots",
               "--json", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 0
    res = json.loads(captured.out)
    assert [(r["prompt_id"], r["method"], r["drafter_backend"]) for r in res["results"]] == [
        ("c1", "ar", None), ("c1", "slem", "torch")]
    assert res["meta"]["settings"]["adaptive"] is True  # adaptive draft length by default
    assert all(r["identical_to_ar"] for r in res["results"])
    assert "[1/1]" not in captured.err


@pytest.mark.parametrize("extra,message", [
    (["--methods", "ar,bogus"], "unknown method 'bogus'"),
    (["--methods", "ar,slem"], "needs a drafter"),
    (["--n", "0"], "--n must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--dataset", "/nonexistent/prompts.jsonl"], "neither 'builtin', 'spec-bench' nor an existing"),
    (["--categories", "nope"], "unknown category nope"),
    (["--baseline", "hf"], "--baseline hf needs a drafter"),
    (["--draft-confidence", "1"], "draft_confidence must be a number in [0, 1)"),
    (["--drafter-context", "-1"], "drafter_context must be a non-negative integer"),
    (["--num-draft-tokens", "0"], "num_draft_tokens must be an integer in 1..64"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--target-backend", "cuda"],
     "unknown backend 'cuda' in --target-backend: choose from auto, torch, llamacpp"),
    (["--target-backend", " , "], "--target-backend is empty: choose from auto, torch, llamacpp"),
    (["--drafter", "y", "--drafter-backend", "torch,gguf"],
     "unknown backend 'gguf' in --drafter-backend: choose from auto, torch, llamacpp"),
    (["--drafter-backend", "llamacpp"], "--drafter-backend needs a drafter"),
    (["--target-backend", "torch,llamacpp", "--device", "cuda"],
     "the llamacpp backend runs on the CPU here"),
])
def test_clear_errors_before_loading_models(tmp_path, capsys, extra, message):
    rc = main(["bench", "--target", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "o"),
               *extra])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_empty_dataset(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    rc = main(["bench", "--target", "x", "--dataset", str(empty), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # nothing written for a run that cannot start
    assert rc == 2 and "has no prompts" in capsys.readouterr().err


def test_several_backends_load_once_and_compare_per_backend(models, tmp_path, monkeypatch):
    """The runner with two backends, the second a stand-in ("llamacpp" loads the torch model, so
    no llama.cpp is needed): each model loads once per backend, AR runs per target backend."""
    from anydraft.models import backends

    loads = []

    def fake_load(spec, backend="torch", *args, **kwargs):
        if isinstance(spec, str):
            loads.append((spec, backend))
        return real_load(spec, "torch", *args, **kwargs)

    real_load = backends.load
    monkeypatch.setattr(backends, "load", fake_load)
    twin = str(models / "twin")
    rc = main(["bench", "--target", str(models / "target"), "--drafter", twin,
               "--target-backend", "torch,llamacpp", "--drafter-backend", "torch,llamacpp",
               "--dtype", "float32", "--methods", "ar,slem", "--baseline", "hf", "--dataset", str(models / "prompts.jsonl"),
               "--categories", "code", "--max-new-tokens", "4", "--no-warmup", "--no-plots",
               "--out", str(tmp_path)])
    assert rc == 0
    assert sorted(loads) == sorted([(str(models / "target"), "torch"), (str(models / "target"), "llamacpp"),
                                    (twin, "torch"), (twin, "llamacpp")])
    res = json.loads((tmp_path / "results.json").read_text())
    rows = res["results"]
    assert [(r["method"], r["target_backend"], r["drafter_backend"]) for r in rows] == [
        ("ar", "torch", None), ("slem", "torch", "torch"), ("hf", "torch", "torch"),
        ("slem", "torch", "llamacpp"),
        ("ar", "llamacpp", None), ("slem", "llamacpp", "torch"), ("slem", "llamacpp", "llamacpp")]
    ar = {r["target_backend"]: r for r in rows if r["method"] == "ar"}
    fastest = max(ar, key=lambda tb: ar[tb]["tokens_per_s"])
    assert res["meta"]["settings"]["fastest_plain"] == f"ar ({fastest})"
    for r in rows:
        assert r["identical_to_ar"] is True
        assert r["speedup_vs_ar"] == pytest.approx(ar[r["target_backend"]]["seconds"] / r["seconds"])
        assert r["speedup_vs_fastest_plain"] == pytest.approx(ar[fastest]["seconds"] / r["seconds"])
    notes = res["meta"]["notes"]
    assert sum("assisted generation needs the torch backend" in n for n in notes) == 3
    assert f"hf (llamacpp) <- {twin} (torch) skipped: transformers' assisted generation needs the " \
           "torch backend for both the target and the drafter" in notes
    text = (tmp_path / "summary.md").read_text()
    assert "speedup vs fastest plain" in text and "| code | ar (llamacpp) |" in text
    assert f"| slem (torch) <- {twin} (llamacpp) |" in text


def test_divergence_names_the_token_and_the_targets_margin():
    """The mismatch diagnosis: first differing token, and how much the target (replaying plain
    decoding) prefers AR's token there."""
    from anydraft import Decoder
    from anydraft.bench.runner import divergence
    from tests.helpers import byte_tokenizer, tiny_llama

    tok = byte_tokenizer()
    dec = Decoder(target=tiny_llama(len(tok), seed=3), tokenizer=tok)
    ar = dec.generate("hello", max_new_tokens=6, chat=False).token_ids
    other = ar[:2] + [(ar[2] + 1) % len(tok)] + ar[3:]
    at, margin = divergence(dec, "hello", False, ar, other)
    session = dec.target.new_session()
    session.feed(dec.prompt_ids("hello", chat=False))
    session.feed(ar[:1])
    logits = session.feed(ar[1:2])[-1]
    assert at == 2 and margin == float(logits[ar[2]] - logits[other[2]]) and margin > 0
    assert divergence(dec, "hello", False, ar, ar[:4]) == (4, None)  # only the length differs


def test_repeats_alternate_the_order_of_the_methods(models, tmp_path, monkeypatch):
    """Every second round runs in reverse (AR last), so drift during a round favours no method."""
    from anydraft.decoder import Decoder

    order = []
    generate = Decoder.generate

    def spy(self, prompt, *args, method=None, **kwargs):
        order.append(method)
        return generate(self, prompt, *args, method=method, **kwargs)

    monkeypatch.setattr(Decoder, "generate", spy)
    rc = main(["bench", "--target", str(models / "target"), "--drafter", str(models / "twin"),
               "--methods", "ar,slem", "--dataset", str(models / "prompts.jsonl"), "--categories", "code",
               "--max-new-tokens", "4", "--repeats", "3", "--no-warmup", "--no-plots",
               "--out", str(tmp_path)])
    assert rc == 0
    assert order == ["ar", "slem", "slem", "ar", "ar", "slem"]
