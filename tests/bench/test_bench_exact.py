"""`anydraft bench --exact both`: each target backend plain and exact in one interleaved run,
every row against AR on its own path, and what exact costs (tiny random models, float32)."""

import dataclasses
import json
import statistics

import pytest

from anydraft.bench.report import ROW_KEYS
from anydraft.cli import main
from tests.helpers import save_tiny_pair

MAX_NEW = 6
METHODS = ("ar", "slem", "auto")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact_models")
    save_tiny_pair(root)
    data = root / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": "c1", "category": "code", "prompt": "def f(x):"},
        {"id": "t1", "category": "text", "prompt": "the quick brown fox"},
    ]) + "\n")
    return root


def _bench(models, out, *extra):
    return main(["bench", "--target", str(models / "target"), "--drafter", str(models / "drafter"),
                 "--methods", ",".join(METHODS), "--target-backend", "torch", "--drafter-backend",
                 "torch", "--dtype", "float32", "--dataset", str(models / "prompts.jsonl"),
                 "--max-new-tokens", str(MAX_NEW), "--no-warmup", "--no-plots", "--out", str(out),
                 *extra])


@pytest.fixture(scope="module")
def both(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact_both")
    rc = _bench(models, out, "--exact", "both")
    return rc, out, json.loads((out / "results.json").read_text())


def test_both_runs_each_method_plain_and_exact(both):
    rc, _, res = both
    assert rc == 0
    assert res["meta"]["settings"]["exact"] == "both"
    rows = res["results"]
    for r in rows:
        assert set(ROW_KEYS) <= set(r), set(ROW_KEYS) - set(r)
        assert r["exact"] == (r["target_backend"] == "torch+exact")
        assert r["identical_to_ar"] is True
    got = sorted((r["prompt_id"], r["method"], r["target_backend"]) for r in rows)
    assert got == sorted((p, m, tb) for p in ("c1", "t1") for m in METHODS
                         for tb in ("torch", "torch+exact"))
    # the bound of an exact row uses the backend's measured curve
    assert all(r["verify_costs"] for r in rows if r["method"] != "ar")


def test_each_row_compares_with_ar_on_its_own_path(both):
    _, _, res = both
    rows = res["results"]
    ar = {(r["prompt_id"], r["target_backend"]): r for r in rows if r["method"] == "ar"}
    plain = {(r["prompt_id"], r["method"]): r for r in rows if not r["exact"]}
    for r in rows:
        base = ar[(r["prompt_id"], r["target_backend"])]
        assert r["speedup_vs_ar"] == pytest.approx(base["seconds"] / r["seconds"], rel=1e-9)
        if r["exact"]:  # and against the same run without exact
            same = plain[(r["prompt_id"], r["method"])]
            assert r["new_tokens"] == same["new_tokens"]  # float32: the same greedy tokens
            assert r["speedup_vs_not_exact"] == pytest.approx(same["seconds"] / r["seconds"], rel=1e-9)
            assert r["decode_speedup_vs_not_exact"] is not None
        else:
            assert r["speedup_vs_not_exact"] is None and r["decode_speedup_vs_not_exact"] is None


def test_what_exact_costs_per_method(both, models):
    _, out, res = both
    drafter = str(models / "drafter")
    costs = res["exact_costs"]
    assert [c["label"] for c in costs] == [
        "ar (torch+exact)", f"slem (torch+exact) <- {drafter}", f"auto (torch+exact) <- {drafter}"]
    rows = res["results"]
    for c in costs:
        exact = [r for r in rows if r["exact"] and r["method"] == c["method"]]
        plain = [r for r in rows if not r["exact"] and r["method"] == c["method"]]
        assert c["prompts"] == 2 and c["target_backend"] == "torch+exact"
        assert c["speedup_vs_not_exact"] == pytest.approx(
            statistics.median(r["speedup_vs_not_exact"] for r in exact))
        assert c["tokens_per_s_not_exact"] == pytest.approx(
            statistics.median(r["tokens_per_s"] for r in plain))
    text = (out / "summary.md").read_text()
    assert "## What exact costs" in text and ", exact both" in text
    table = text.split("## What exact costs")[1].split("## Per category")[0]
    assert "| ar (torch+exact) | 2 |" in table and f"| auto (torch+exact) <- {drafter} | 2 |" in table
    # the labels of the two paths differ in every table
    assert "| ar (torch) | 2 |" in text and "| ar (torch+exact) | 2 | 2/2 |" in text


@pytest.mark.parametrize("broken", ["torch", "torch+exact"])
def test_the_greedy_alarm_compares_each_path_with_its_own_ar(models, tmp_path, monkeypatch, broken):
    """AR on one path made to end in another token: exactly that path's other methods differ
    from their AR (exit status 1), the other path's rows stay identical to theirs."""
    from anydraft.decoder import Decoder

    generate = Decoder.generate

    def spy(self, prompt, *args, method=None, **kwargs):
        out = generate(self, prompt, *args, method=method, **kwargs)
        if method == "ar" and self.target.exact == (broken == "torch+exact"):
            out = dataclasses.replace(out, token_ids=out.token_ids[:-1] + [out.token_ids[-1] + 1])
        return out

    monkeypatch.setattr(Decoder, "generate", spy)
    assert _bench(models, tmp_path, "--exact", "both") == 1
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    bad = {(r["method"], r["target_backend"]) for r in rows if r["identical_to_ar"] is False}
    assert bad == {(m, broken) for m in METHODS if m != "ar"}
    assert "GREEDY MISMATCH" in (tmp_path / "summary.md").read_text()


def test_exact_alone_means_every_target_exact(models, tmp_path):
    assert _bench(models, tmp_path, "--exact") == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["settings"]["exact"] == "on" and res["exact_costs"] == []
    rows = res["results"]
    assert {r["target_backend"] for r in rows} == {"torch+exact"} and all(r["exact"] for r in rows)
    assert all(r["speedup_vs_not_exact"] is None for r in rows)
    text = (tmp_path / "summary.md").read_text()
    assert "What exact costs" not in text and "| ar (torch+exact) | 2 | 2/2 |" in text


def test_a_path_that_cannot_score_exactly(models, tmp_path, monkeypatch, capsys):
    """--exact both keeps the plain runs (with a note); --exact on is an error, as before."""
    from anydraft.models.loaded import LoadedModel

    monkeypatch.setattr(LoadedModel, "exact_problem", lambda self: "is a test's stand-in")
    assert _bench(models, tmp_path / "both", "--exact", "both") == 0
    res = json.loads((tmp_path / "both" / "results.json").read_text())
    assert {r["target_backend"] for r in res["results"]} == {"torch"}
    assert any(n.startswith("torch+exact skipped: exact scoring is not available")
               for n in res["meta"]["notes"])
    assert _bench(models, tmp_path / "on", "--exact", "on") == 2
    assert "is a test's stand-in" in capsys.readouterr().err


def test_making_a_decoder_exact_leaves_the_plain_one_on_the_same_model_as_it_was():
    """The bench's exact decoders share the plain ones' loaded model (models/exact.py wraps its
    linear layers): the plain decoder's logits stay bit-identical."""
    import torch

    from anydraft import Decoder
    from tests.helpers import byte_tokenizer, tiny_llama

    tok = byte_tokenizer()
    model = tiny_llama(len(tok), seed=5)
    plain = Decoder(target=model, tokenizer=tok, dtype="float32")

    def logits():
        session = plain.target.new_session()
        return torch.cat([session.feed(plain.prompt_ids("hello there", chat=False)),
                          session.feed([5, 6, 7])])

    before, ids = logits(), plain.generate("hello", max_new_tokens=8, chat=False).token_ids
    exact = Decoder(target=model, tokenizer=tok, dtype="float32", exact=True)
    assert exact.generate("hello", max_new_tokens=8, chat=False).token_ids == ids
    assert not plain.target.exact and exact.target.exact
    assert torch.equal(logits(), before)
    assert plain.generate("hello", max_new_tokens=8, chat=False).token_ids == ids


def test_exact_values(tmp_path, capsys):
    from anydraft.bench.runner import BenchSettings
    from anydraft.errors import AnydraftError

    rc = main(["bench", "--target", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "o"),
               "--exact", "yes"])
    assert rc == 2
    assert "unknown --exact 'yes': on (or --exact alone" in capsys.readouterr().err
    with pytest.raises(AnydraftError, match="exact must be one of off, on, both, auto, got True"):
        BenchSettings(target="t", drafters=[], methods=["ar"], exact=True)
