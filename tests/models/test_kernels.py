"""oneDNN linear layers (models/kernels.py): the same model in another kernel path, close in
value, and greedy speculative output identical to plain decoding in that path."""

import pytest
import torch

from anydraft import Decoder
from anydraft.errors import AnydraftError
from anydraft.models import kernels
from anydraft.models.loading import parse_dtype, split_kernels
from tests.helpers import byte_tokenizer, tiny_llama


def test_float32_runs_on_onednn_on_every_machine_we_ship_to():
    assert kernels.available(torch.float32)  # the pinned x86 CPU wheel carries oneDNN
    assert not kernels.available(torch.float16)
    assert not kernels.available(torch.float32, "cuda")


def test_packed_layers_compute_what_the_default_ones_do():
    tok = byte_tokenizer()
    plain, packed = tiny_llama(len(tok)), kernels.pack(tiny_llama(len(tok)))
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    assert packed.get_output_embeddings().weight.shape[0] == len(tok)  # the logits width is still read
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with torch.inference_mode():
        want, got = plain(ids).logits, packed(ids).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("method", ["sd", "slem"])
def test_greedy_in_the_packed_path_equals_plain_decoding_in_it(method):
    tok = byte_tokenizer()
    target = kernels.pack(tiny_llama(len(tok), seed=0))
    drafter = kernels.pack(tiny_llama(len(tok), seed=1))
    plain = Decoder(target=target, tokenizer=tok, method="ar")
    spec = Decoder(target=target, tokenizer=tok, drafter=drafter, drafter_tokenizer=tok,
                   method=method, num_draft_tokens=4, adaptive=False)
    for prompt in ("the quick brown", "def f(x):"):
        want = plain.generate(prompt, 24, chat=False).token_ids
        got = spec.generate(prompt, 24, chat=False)
        assert got.token_ids == want
        assert got.stats["drafted"] > 0  # drafts were offered and judged, not skipped


def test_the_kernel_suffix_is_parsed_and_checked():
    assert split_kernels("float32+onednn") == ("float32", "onednn")
    assert split_kernels("bfloat16") == ("bfloat16", "")
    assert parse_dtype("float32+onednn") == torch.float32
    with pytest.raises(AnydraftError, match="do not run float16"):
        parse_dtype("float16+onednn")
    with pytest.raises(AnydraftError, match=r"optionally with \+onednn"):
        parse_dtype("float33")
