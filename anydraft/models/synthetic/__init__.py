"""Synthetic models: real shapes, random weights, real tokenizers, no weight files.

``synthetic:NAME`` is a transformers model built from the stored config ``NAME.json`` beside
this file (the shape of Qwen2.5-7B-Instruct, Llama-3.1-8B, ...), its weights drawn on the
device it runs on from a seed of the name, so the same spec on the same device and dtype gives
the same model and the same greedy output. It measures what a model of that size costs
(cost curves, speed at a known acceptance with the replay proposer, methods/replay.py) where
the real weights cannot travel; its text is noise, and it accepts next to nothing from a
drafter. ``synthetic:NAME:tiny`` keeps the vocabulary and tokenizer but shrinks the rest
(`TINY`): the tests and ``scripts/gpu_check.sh --cpu-dry-run`` run in seconds on a CPU.

``null:NAME`` (models/null.py) has the same vocabulary and tokenizer and no model at all.

The tokenizer is the family's own, read from a catalog GGUF (`FAMILIES`) and kept under
``$ANYDRAFT_CACHE/synthetic-tokenizers/`` (models/loading.py `export_tokenizers` packs that folder for a machine
without the catalog); a shape whose family no catalog model has gets another family's, and
its config says so (``tokenizer_note``, shown by `describe`).
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from pathlib import Path

from ...errors import AnydraftError

PREFIXES = ("synthetic:", "null:")
HERE = Path(__file__).parent
# tokenizer family -> the catalog model whose GGUF carries it
FAMILIES = {"qwen2.5": "qwen2.5-coder-0.5b", "smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}
# `:tiny`: every size but the vocabulary's, small enough that a test's model builds in well
# under a second on a CPU and still has every kind of layer the shape has (2 layers: Gemma-3's
# sliding and full attention would need 6, but a 2-layer one still slides)
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
SCALES = ("tiny",)
# the logit of every id past the tokenizer (padding of the output layer): random weights
# would choose such ids like any other, and no text spells them; real models learn to avoid them
PADDED_LOGIT = -1e4
# random weights write any token alike: mostly CJK and fragments, which a drafter of another
# tokenizer spells byte by byte, so a replay (methods/replay.py) of that text would measure
# translation on text no model writes. A head start for ASCII words (their logits' spread is
# about 1) has them write English-looking word salad instead, spelt as such text is.
WORD_BIAS = 4.0
WORD = re.compile(rb" ?[A-Za-z]{2,12}[.,]?")  # token bytes: space markers are spaces there
# what "auto" means for a synthetic model, without measuring (a shape of several GB measured
# on each path would cost minutes): what each device runs such shapes fastest in
AUTO_DTYPE = {"cpu": "float32", "cuda": "bfloat16"}


def is_spec(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIXES)


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


@functools.lru_cache(maxsize=32)
def parse(spec: str) -> tuple[str, str, str, dict]:
    """``(kind: "synthetic" or "null", shape name, scale: "" or "tiny", stored entry)``; clear
    error for a name or scale there is none of."""
    kind, _, rest = spec.partition(":")
    name, _, scale = rest.partition(":")
    path = HERE / f"{name}.json"
    if not path.is_file():
        raise AnydraftError(f"unknown synthetic shape {name!r} in {spec!r}: choose one of "
                            f"{', '.join(names())} (e.g. synthetic:qwen2.5-7b)")
    if scale and scale not in SCALES:
        raise AnydraftError(f"unknown scale {scale!r} in {spec!r}: leave it out (the real "
                            f"shape) or use {', '.join(SCALES)}")
    return kind, name, scale, json.loads(path.read_text())


def config_dict(spec: str) -> dict:
    """The transformers config of ``spec`` as a dict, scaled down where it asks."""
    _, _, scale, entry = parse(spec)
    config = dict(entry["config"])
    if scale == "tiny":
        config |= TINY
        if config["model_type"] == "gemma3_text":
            config["query_pre_attn_scalar"] = TINY["head_dim"]
    return config


def vocab_size(spec: str) -> int:
    return int(parse(spec)[3]["config"]["vocab_size"])


def describe(spec: str) -> str:
    """For every output that used ``spec``: what it is, in words."""
    kind, name, scale, entry = parse(spec)
    what = ("random weights" if kind == "synthetic" else "no model: logits from a fixed table")
    size = f", scaled down ({scale})" if scale else ""
    note = entry.get("tokenizer_note")
    tok = f"{entry['tokenizer']} tokenizer" + (f" ({note})" if note else "")
    return f"{spec}: synthetic, {what}; {entry['about']}{size}; {tok}"


def tokenizer_dir(family: str) -> Path:
    from ...atomic import cache_dir

    return cache_dir() / "synthetic-tokenizers" / family


def seed(spec: str) -> int:
    """The seed of a spec's weights: its name's, so a target and its drafter differ."""
    return zlib.crc32(spec.encode())


def default_dtype(device: str) -> str:
    return AUTO_DTYPE["cuda" if str(device).startswith("cuda") else "cpu"]


def build(spec: str, tok, dtype, device: str):
    """``spec``'s model in eval mode, its random weights drawn on ``device`` in ``dtype``;
    ``tok``: its tokenizer (models/loading.py `load_tokenizer`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = config_dict(spec)
    config |= {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
               "pad_token_id": tok.pad_token_id}
    config = AutoConfig.for_model(**config)
    config._name_or_path = spec  # what errors and reports call it
    torch.manual_seed(seed(spec))  # seeds the CPU's and every GPU's generator
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        _add_output_bias(model, tok)
    return model.eval()


def output_bias(tokenizer, width: int):
    """The bias random weights' logits get: `PADDED_LOGIT` for the ids past ``tokenizer``, and
    `WORD_BIAS` for its tokens that are an ASCII word (with or without the space before it)."""
    import torch

    from ...bridge import token_table

    bias = torch.zeros(width)
    bias[min(len(tokenizer), width):] = PADDED_LOGIT
    words = [i for i, b in enumerate(token_table(tokenizer).token_bytes[:width]) if WORD.fullmatch(b)]
    bias[words] += WORD_BIAS
    return bias


def _add_output_bias(model, tokenizer) -> None:
    """Give the output layer `output_bias`; its weight stays the one it is (tied to the input
    embeddings where the shape ties them)."""
    import torch

    head = model.get_output_embeddings()
    bias = output_bias(tokenizer, head.weight.shape[0])
    head.bias = torch.nn.Parameter(bias.to(head.weight.device, head.weight.dtype), requires_grad=False)
