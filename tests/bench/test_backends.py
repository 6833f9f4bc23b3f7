"""`anydraft bench` with several backends: option parsing, labels and columns (hand-made rows),
and, when llama-cpp-python and the GGUF are there, one tiny real llamacpp run."""

import json

import pytest

from anydraft.bench.cli import register, settings_from_args
from anydraft.bench.report import build_meta, group_rows, labeller, write_summary
from anydraft.bench.runner import BenchSettings
from anydraft.cli import main


def _args(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "--target", "t", *argv])


def test_backend_lists_and_fixed_k_reach_the_settings():
    s = settings_from_args(_args("--drafter", "d", "--target-backend", "torch, llamacpp,torch",
                                 "--drafter-backend", "llamacpp", "--fixed-k"))
    assert s.target_backends == ["torch", "llamacpp"] and s.drafter_backends == ["llamacpp"]
    assert s.draft.adaptive is False
    s = settings_from_args(_args())
    assert s.target_backends == s.drafter_backends == ["auto"] and s.draft.adaptive is True


def test_a_dtype_asked_for_makes_auto_torch_and_keeps_llamacpp_beside_torch():
    from anydraft.errors import AnydraftError

    s = settings_from_args(_args("--drafter", "d", "--dtype", "float32"))
    # --dtype handed down leaves the drafter's backend to choose; --drafter-dtype does not
    assert s.target_backends == ["torch"] and s.drafter_backends == ["auto"]
    s = settings_from_args(_args("--drafter", "d", "--drafter-dtype", "bfloat16"))
    assert s.target_backends == ["auto"] and s.drafter_backends == ["torch"]
    s = settings_from_args(_args("--target-backend", "auto,llamacpp,torch", "--dtype", "bfloat16"))
    assert s.target_backends == ["torch", "llamacpp"]  # the dtype is the torch runs'
    with pytest.raises(AnydraftError, match=r"\(--dtype\) runs on the torch backend"):
        settings_from_args(_args("--target-backend", "llamacpp", "--dtype", "float32"))
    with pytest.raises(AnydraftError, match=r"\(--drafter-dtype\) runs on the torch backend"):
        settings_from_args(_args("--drafter", "d", "--drafter-backend", "llamacpp",
                                 "--drafter-dtype", "float32"))


def test_auto_backends_resolve_per_model_and_role(monkeypatch):
    from anydraft.bench import runner
    from anydraft.models import auto

    seen = []

    def choose(spec, role, dtype, device, progress):
        seen.append((spec, role))
        return ("llamacpp" if role == "target" else "torch"), dtype, None

    monkeypatch.setattr(auto, "choose_backend", choose)
    got = runner.resolve_backends(["auto", "torch", "llamacpp"], "t", "target", "auto", "cpu", None)
    assert got == ["llamacpp", "torch"] and seen == [("t", "target")]
    assert runner.resolve_backends(["auto"], "d", "drafter", None, "cpu", None) == ["torch"]


def _row(method, tb, drafter=None, db=None, tps=10.0, ar_tps=10.0, fastest_tps=20.0, category="code"):
    drafting = method != "ar"
    return {
        "prompt_id": "p1", "category": category, "method": method, "drafter": drafter,
        "target_backend": tb, "drafter_backend": db, "new_tokens": 10, "seconds": 10 / tps,
        "tokens_per_s": tps, "speedup_vs_ar": tps / ar_tps, "decode_speedup_vs_ar": tps / ar_tps,
        "speedup_vs_fastest_plain": tps / fastest_tps, "speedup_vs_llama_server": None,
        "decode_speedup_vs_llama_server": None,
        "speedup_vs_hf": None, "acceptance": 0.5 if drafting else None,
        "acceptance_per_token": 0.7 if drafting else None, "mean_accepted": 2.0 if drafting else 1.0,
        "drafted": 10 if drafting else 0, "accepted": 5 if drafting else 0,
        "rejected": 3 if drafting else 0, "target_calls": 5,
        "cost_ratio": 0.3 if drafting else None, "bound": 1.5 if drafting else None,
        "identical_to_ar": True,
    }


def _all_combinations():
    """torch and llamacpp targets (AR 10 and 20 tok/s), drafter d on torch and llamacpp."""
    rows = []
    for tb, ar_tps in (("torch", 10.0), ("llamacpp", 20.0)):
        rows.append(_row("ar", tb, tps=ar_tps, ar_tps=ar_tps))
        rows += [_row("slem", tb, "d", db, tps=30.0, ar_tps=ar_tps) for db in ("torch", "llamacpp")]
    return rows


def _labels(rows):
    return [key[0] for key in group_rows(rows, False)]


def test_labels_name_backends_only_where_they_tell_rows_apart():
    torch_only = [_row("ar", "torch"), _row("slem", "torch", "d", "torch")]
    assert _labels(torch_only) == ["ar", "slem <- d"]  # as before backends existed
    drafters = torch_only + [_row("slem", "torch", "d", "llamacpp")]
    assert _labels(drafters) == ["ar", "slem <- d (torch)", "slem <- d (llamacpp)"]
    llama_target = [_row("ar", "llamacpp"), _row("slem", "llamacpp", "d", "torch")]
    assert _labels(llama_target) == ["ar (llamacpp)", "slem (llamacpp) <- d"]
    assert _labels(_all_combinations()) == [
        "ar (torch)", "slem (torch) <- d (torch)", "slem (torch) <- d (llamacpp)",
        "ar (llamacpp)", "slem (llamacpp) <- d (torch)", "slem (llamacpp) <- d (llamacpp)"]
    assert labeller(drafters)(drafters[-1]) == "slem <- d (llamacpp)"


def _summary(tmp_path, rows, target_backends, drafter_backends):
    settings = BenchSettings(target="t", drafters=["d"], methods=["ar", "slem"],
                             target_backends=target_backends, drafter_backends=drafter_backends,
                             fastest_plain="ar (llamacpp)")
    prompts = [{"id": "p1", "category": "code", "prompt": "x"}]
    meta = build_meta(settings, "anydraft bench --target t", prompts, "builtin")
    return write_summary(tmp_path, meta, rows, []).read_text()


def _table_rows(text, label):
    """The speed tables' rows of ``label`` (the host table, which names it too, left out)."""
    text = text.split("## Host time")[0]
    return [line.split(" | ") for line in text.splitlines() if line.startswith(f"| {label} |")]


def test_summary_column_vs_fastest_plain_only_with_several_plain_paths(tmp_path):
    text = _summary(tmp_path, _all_combinations(), ["torch", "llamacpp"], ["torch", "llamacpp"])
    lines = text.splitlines()
    at = lines.index("## Per method (all prompts)")
    assert lines[at + 2] == "Fastest plain decoding here: **ar (llamacpp)**."
    cols = [c.strip() for c in lines[at + 4].strip("|").split("|")]
    assert cols[4:6] == ["speedup vs AR", "speedup vs fastest plain"]
    assert "speedup vs llama-server" not in text  # it did not run
    # AR on torch: 1.00x against itself, 0.50x against the fastest plain decoding (AR on llamacpp)
    (ar_torch,) = _table_rows(text, "ar (torch)")
    assert ar_torch[4:6] == ["1.00x", "0.50x"]
    (slem,) = _table_rows(text, "slem (torch) <- d (torch)")
    assert slem[4:6] == ["3.00x", "1.50x"]
    assert "backends: target torch,llamacpp, drafter torch,llamacpp" in text
    assert "adaptive draft length k <= 5" in text
    assert "- speedup vs fastest plain:" in text

    one_target = [r for r in _all_combinations() if r["target_backend"] == "torch"]
    text = _summary(tmp_path, one_target, ["torch"], ["torch", "llamacpp"])
    assert "speedup vs fastest plain" not in text
    assert _table_rows(text, "ar") and _table_rows(text, "slem <- d (llamacpp)")


def test_plots_with_several_backends(tmp_path):
    pytest.importorskip("matplotlib")
    from anydraft.bench.plots import write_plots

    rows = _all_combinations() + [dict(r, prompt_id="p2", category="text") for r in _all_combinations()]
    names = write_plots(tmp_path, rows, 5)
    assert all((tmp_path / n).stat().st_size > 0 for n in names) and len(names) == 3


@pytest.mark.real
def test_real_llamacpp_target_and_drafter(tmp_path):
    from tests.conftest import require_llamacpp, require_model

    require_llamacpp()
    require_model("smollm2-135m")
    rc = main(["bench", "--target", "smollm2-135m", "--drafter", "smollm2-135m",
               "--target-backend", "llamacpp", "--drafter-backend", "llamacpp", "--methods", "ar,sd",
               "--fixed-k", "--categories", "code", "--n", "1", "--max-new-tokens", "8",
               "--no-warmup", "--no-plots", "--out", str(tmp_path)])
    # quantized kernels can score a batch slightly differently from one token at a time: a
    # greedy mismatch is then reported (exit status 1, with the target's margin), never hidden
    summary = (tmp_path / "summary.md").read_text()
    res = json.loads((tmp_path / "results.json").read_text())
    identical = all(r["identical_to_ar"] is not False for r in res["results"])
    assert rc == (0 if identical else 1)
    assert ("GREEDY MISMATCH" in summary) == (not identical)
    assert [(r["method"], r["target_backend"], r["drafter_backend"]) for r in res["results"]] == [
        ("ar", "llamacpp", None), ("sd", "llamacpp", "llamacpp")]
    # one plain decoding ran (AR on llama.cpp): the fastest, every ratio against it is vs AR
    assert all(r["speedup_vs_fastest_plain"] == r["speedup_vs_ar"] for r in res["results"])
    assert "| code | ar (llamacpp) |" in (tmp_path / "summary.md").read_text()
