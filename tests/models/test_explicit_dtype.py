"""A dtype asked for is a torch path: under `backend="auto"` it means torch (never a measured
llama.cpp that would drop it), beside `backend="llamacpp"` it is an error naming the fix. A
drafter's dtype handed down from the target's chooses no backend."""

import pytest

from anydraft import AnydraftError, Decoder
from anydraft.cli import main
from anydraft.hardware import profile
from anydraft.models import auto
from anydraft.models.backends import backend_for
from tests.conftest import require_model
from tests.helpers import save_tiny_pair

LLAMA, TORCH = {1: 0.01, 9: 0.02}, {1: 1.0, 9: 2.0}  # cost curves: llama.cpp the faster


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float32+onednn",
                                   "bfloat16+compile"])
def test_a_dtype_asked_for_makes_auto_torch(dtype):
    assert backend_for("auto", dtype) == "torch"
    assert backend_for("torch", dtype) == "torch"
    assert backend_for("auto", "auto") == "auto"  # measured: llama.cpp or torch
    assert backend_for("llamacpp", "auto") == "llamacpp"


def test_a_dtype_beside_llamacpp_is_an_error_naming_both_and_the_fix():
    with pytest.raises(AnydraftError, match=r"dtype 'float32' \(--dtype\) runs on the torch backend, "
                       r"but its backend is 'llamacpp' \(--target-backend\).*use backend 'torch'"):
        backend_for("llamacpp", "float32")
    with pytest.raises(AnydraftError, match=r"drafter's drafter_dtype 'bfloat16' \(--drafter-dtype\).*"
                       r"drafter_backend is 'llamacpp' \(--drafter-backend\)"):
        backend_for("llamacpp", "bfloat16", "drafter")


@pytest.fixture
def llamacpp_measured_faster(monkeypatch):
    """Every model "runs on llama.cpp" and measures faster there than on torch: what `auto`
    found for smollm2-135m, whose float32 asked for then never happened."""
    monkeypatch.setattr(auto, "gguf_engines", lambda spec: ("llamacpp",))
    monkeypatch.setattr(auto, "curves", lambda spec, backend, paths, *a, **k: (
        {p: LLAMA if p == "gguf" else TORCH for p in paths}, None))


def test_a_target_in_a_dtype_asked_for_runs_on_torch_in_it(tmp_path, llamacpp_measured_faster):
    target, _ = save_tiny_pair(tmp_path)
    dec = Decoder(target=str(target), dtype="float32")
    assert (dec.target.backend, dec.target.dtype) == ("torch", "float32")
    # "auto" still measures, and takes llama.cpp where it is faster (here: a directory it
    # cannot read, which proves the choice was made)
    with pytest.raises(AnydraftError, match="llamacpp backend reads GGUF files"):
        Decoder(target=str(target))


def test_the_drafters_own_dtype_chooses_its_backend_the_targets_does_not(tmp_path, monkeypatch):
    target, drafter = save_tiny_pair(tmp_path)
    asked = []

    def choose_backend(spec, role, dtype, device, progress, rows):
        asked.append((role, dtype))
        return "torch", dtype, None

    monkeypatch.setattr(auto, "choose_backend", choose_backend)
    dec = Decoder(target=str(target), drafter=str(drafter), dtype="float32")
    assert asked == [("drafter", "float32")]  # handed down: the drafter's backend still measured
    assert (dec.drafter.backend, dec.drafter.dtype) == ("torch", "float32")
    asked.clear()
    dec = Decoder(target=str(target), drafter=str(drafter), drafter_dtype="float32")
    assert asked == [("target", "auto")] and dec.drafter.dtype == "float32"
    # handed down, the target's dtype is no conflict with a llama.cpp drafter (which then
    # finds a directory where it reads GGUF files)
    with pytest.raises(AnydraftError, match="llamacpp backend reads GGUF files"):
        Decoder(target=str(target), drafter=str(drafter), dtype="float32", drafter_backend="llamacpp")


def test_a_drafter_dtype_asked_for_beats_the_scouts_backend(tmp_path, monkeypatch):
    from anydraft import scouted

    target, drafter = save_tiny_pair(tmp_path)
    # the scout's winner on llama.cpp; a backend the caller chose is kept (anydraft/scouted.py)
    monkeypatch.setattr(scouted, "auto_drafter", lambda target, backend, progress: (
        str(drafter), backend or "llamacpp"))
    dec = Decoder(target=str(target), drafter="auto", dtype="float32", drafter_dtype="float32")
    assert (dec.drafter.backend, dec.drafter.dtype) == ("torch", "float32")


def test_conflicts_are_refused_before_anything_loads():
    with pytest.raises(AnydraftError, match="use backend 'torch' or 'auto'"):
        Decoder(target="no-such-model", backend="llamacpp", dtype="float32")
    with pytest.raises(AnydraftError, match="use drafter_backend 'torch' or 'auto'"):
        Decoder(target="no-such-model", drafter="no-such-drafter", drafter_dtype="bfloat16",
                drafter_backend="llamacpp")


def test_the_command_line_names_the_flags(capsys):
    argv = ["generate", "--target", "no-such-model", "--prompt", "hi", "--dtype", "float32",
            "--target-backend", "llamacpp"]
    assert main(argv) == 2
    assert "(--dtype) runs on the torch backend" in capsys.readouterr().err


@pytest.mark.real
def test_the_llamacpp_curve_still_loads_its_model(monkeypatch):
    """`auto.curves` names llama.cpp's path "gguf": a label, not a dtype asked for."""
    from tests.conftest import require_llamacpp

    require_llamacpp()
    monkeypatch.setattr(profile, "measure", lambda models: {p: {1: 0.01} for p in models})
    monkeypatch.setattr(profile, "busy", lambda: True)  # nothing cached
    found, _ = auto.curves(require_model("smollm2-135m"), "llamacpp", ("gguf",), "cpu", remeasure=True)
    assert found == {"gguf": {1: 0.01}}


@pytest.mark.real
def test_smollm2_in_float32_runs_in_float32():
    """The report's case: smollm2-135m, whose GGUF llama.cpp runs faster here."""
    dec = Decoder(target=require_model("smollm2-135m"), dtype="float32")
    assert (dec.target.backend, dec.target.dtype) == ("torch", "float32")
