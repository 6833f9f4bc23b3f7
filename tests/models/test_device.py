"""`device="auto"`: CUDA when torch sees a GPU, else the CPU, resolved in one place
(`resolve_device`) before anything is loaded or keyed by it; clear errors for the rest. No test
here needs a GPU: where one matters, `torch.cuda.is_available` is replaced."""

import argparse

import pytest
import torch

from anydraft import AnydraftError, Decoder
from anydraft.cli import build_parser, main
from anydraft.models import auto, backends
from anydraft.models.loading import resolve_device
from anydraft.options import add_model_options, decoder_options
from tests.helpers import byte_tokenizer, tiny_llama


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda"
    assert resolve_device("cpu") == "cpu"  # asked for, kept


def test_this_machine_resolves_auto_to_what_torch_sees():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cuda_without_a_gpu_is_a_clear_error(no_gpu):
    message = "CUDA is not available on this machine: use device='cpu' or 'auto'"
    with pytest.raises(AnydraftError, match=message):
        resolve_device("cuda")
    with pytest.raises(AnydraftError, match=message):  # before any model is looked for
        Decoder(target="no-such-model", device="cuda")


@pytest.mark.parametrize("device", ["gpu", "cuda:0", "mps", "", None])
def test_an_unknown_device_is_a_clear_error(device):
    with pytest.raises(AnydraftError, match="unknown device .*: use auto, cpu or cuda"):
        resolve_device(device)
    with pytest.raises(AnydraftError, match="unknown device"):
        Decoder(target="no-such-model", device=device)


def test_auto_reaches_the_profile_resolved(gpu, monkeypatch):
    """`dtype="auto"` measures on the resolved device: no curve is ever keyed by "auto"."""
    tok = byte_tokenizer()
    seen = []

    def choose_dtype(spec, device, progress, rows=1):
        seen.append(device)
        return "float32", tiny_llama(len(tok)), {}

    monkeypatch.setattr(auto, "choose_dtype", choose_dtype)
    loaded = backends.load("any-model", "torch", tok, dtype="auto", device="auto")
    assert seen == ["cuda"] and loaded.dtype == "float32"
    with pytest.raises(AssertionError, match="not resolved"):
        auto.model_key("any-model", "torch", "float32", "auto")


def test_a_llamacpp_target_asked_for_on_cuda_is_refused():
    # checked on the arguments, before CUDA is looked for or a model loaded
    with pytest.raises(AnydraftError, match="the llamacpp backend runs on the CPU here"):
        Decoder(target="no-such-model", backend="llamacpp", device="cuda")
    with pytest.raises(AnydraftError, match="unknown model"):  # auto: llama.cpp may stay on the CPU
        Decoder(target="no-such-model", backend="llamacpp", device="auto")


def test_a_llamacpp_model_on_the_cpu_pairs_with_a_torch_model_on_another_device(monkeypatch):
    """Sessions hand out float32 CPU logits whatever runs them, so a llama.cpp drafter (CPU)
    works beside a torch target on CUDA; two torch models on different devices do not."""
    import anydraft.decoder as decoder_module

    tok = byte_tokenizer()
    target, drafter = tiny_llama(len(tok), seed=0), tiny_llama(len(tok), seed=1)
    # the target "on the GPU"; the drafter "on llama.cpp" (both really run here, on the CPU)
    monkeypatch.setattr(decoder_module.LoadedModel, "device", property(
        lambda self: torch.device("cuda" if self.model is target else "cpu")))
    with pytest.raises(AnydraftError, match="same device"):
        Decoder(target=target, tokenizer=tok, drafter=drafter, drafter_tokenizer=tok)
    monkeypatch.setattr(decoder_module.LoadedModel, "backend", property(
        lambda self: "llamacpp" if self.model is drafter else "torch"))
    dec = Decoder(target=target, tokenizer=tok, drafter=drafter, drafter_tokenizer=tok,
                  method="slem", adaptive=False)
    out = dec.generate("hello world", max_new_tokens=8, chat=False)
    assert out.token_ids == dec.generate("hello world", max_new_tokens=8, chat=False,
                                         method="ar").token_ids


@pytest.mark.parametrize("argv", [
    ["generate", "--target", "x"], ["serve", "--target", "x"], ["bench", "--target", "x"],
    ["doctor"], ["demo"],
])
def test_every_command_defaults_to_auto(argv):
    assert build_parser().parse_args(argv).device == "auto"


def test_the_command_line_device_reaches_the_decoder():
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert decoder_options(parser.parse_args(["--target", "x"]))["device"] == "auto"
    assert decoder_options(parser.parse_args(["--target", "x", "--device", "cpu"]))["device"] == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args(["--target", "x", "--device", "gpu"])


def test_cuda_on_the_command_line_without_a_gpu_exits_with_the_fix(no_gpu, tmp_path, capsys):
    assert main(["generate", "--target", "x", "--prompt", "hi", "--device", "cuda"]) == 2
    assert "CUDA is not available on this machine" in capsys.readouterr().err
    assert main(["bench", "--target", "x", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "CUDA is not available on this machine" in capsys.readouterr().err


@pytest.mark.parametrize("cuda, want", [(False, "cpu"), (True, "cuda")])
def test_bench_resolves_auto_before_anything_is_keyed(cuda, want, monkeypatch):
    from anydraft.bench.cli import settings_from_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    args = build_parser().parse_args(["bench", "--target", "x", "--drafter", "y",
                                      "--drafter-backend", "llamacpp"])
    assert settings_from_args(args).device == want  # a llama.cpp drafter is fine on either
