"""Greedy exactness on real models: every method's output is token-identical to plain greedy
decoding of the target (float32; the drafter in bfloat16, or quantized in llama.cpp), on
Spec-Bench prompts of mixed categories, chat template. The draft length is fixed so that every
step drafts (tests/methods/test_policy.py proves any schedule of draft lengths exact).

Sized for a 2-core AVX2 CPU (where plain float32 decoding of the 1.5B takes ~0.8 s a token):
each target reads two or three categories of its own, 32 new tokens each; every method and
every drafter backend runs at least once. ANYDRAFT_TEST_DEVICE=cuda runs the torch models on
the GPU (scripts/gpu_check.sh); llama.cpp drafters stay on the CPU."""

import pytest

from anydraft import Decoder
from anydraft.bench.datasets import spec_bench_candidates
from anydraft.models.loading import load_tokenizer
from anydraft.prompts import builtin_prompts, load_jsonl

MAX_NEW = 32


def mixed_prompts(n=10):
    """One Spec-Bench prompt per category (../shared/data); the package's own prompts when
    that file is not beside this checkout, so the exactness test never silently skips."""
    path = next((p for p in spec_bench_candidates() if p.is_file()), None)
    rows = load_jsonl(path) if path else builtin_prompts()
    picked, seen = [], set()
    for row in rows:
        if row["category"] not in seen or not path:
            seen.add(row["category"])
            picked.append(row["prompt"])
    return picked[:n]


# Which of the ten mixed prompts each target reads (Spec-Bench order: writing, roleplay,
# reasoning, math, coding, extraction, stem, humanities, translation, summarization). The
# pairs of one target share its plain outputs; the 1.5B target, the slowest, reads the least.
PROMPTS = {
    "qwen2.5-coder-0.5b": [4, 8],  # code (lookup copies), German (multi-byte UTF-8 across vocabularies)
    "smollm2-135m": [0, 3, 9],  # prose, math, a long article (the drafter reads its last 64 tokens)
    "qwen2.5-coder-1.5b": [2],
}
PAIRS = [  # target, drafter, drafter backend, methods
    ("qwen2.5-coder-0.5b", "smollm2-135m", "torch", ["slem", "tli", "lookup"]),  # greedy slrs is slem
    ("qwen2.5-coder-0.5b", "smollm2-135m", "llamacpp", ["slem", "tli"]),
    ("qwen2.5-coder-0.5b", "smollm2-135m", "ik", ["slem"]),
    ("smollm2-135m", "gemma3-270m", "torch", ["slem", "tli"]),
    ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "torch", ["sd"]),
]
PLAIN = {}  # (target, prompt) -> plain greedy output, shared by the pairs of one target


def prompts_of(target):
    prompts = mixed_prompts()
    assert len(prompts) == 10
    return [prompts[i] for i in PROMPTS[target]]


def plain(dec, target, prompt):
    if (target, prompt) not in PLAIN:
        PLAIN[target, prompt] = dec.generate(prompt, max_new_tokens=MAX_NEW, method="ar")
    return PLAIN[target, prompt]


def drafter_model(real_model, name, backend, device):
    """bfloat16 in PyTorch (on ``device``), or the GGUF as it is in llama.cpp or ik_llama.cpp
    (on the CPU): the drafter's numerics must never change the output."""
    if backend == "torch":
        return real_model(name, "bfloat16", device)
    from anydraft.models.engines import ENGINES
    from anydraft.models.llamacpp import LlamaCppModel
    from anydraft.models.loading import resolve
    from tests.conftest import require_llamacpp

    require_llamacpp(backend)
    return LlamaCppModel.load(resolve(name), engine=ENGINES[backend])


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("target,drafter,backend,methods", PAIRS,
                         ids=[f"{t}<-{d}-{b}" for t, d, b, _ in PAIRS])
def test_greedy_output_identical_to_plain_greedy(real_model, exactness_device, target, drafter,
                                                 backend, methods):
    dec = Decoder(target=real_model(target, device=exactness_device), tokenizer=load_tokenizer(target),
                  drafter=drafter_model(real_model, drafter, backend, exactness_device),
                  drafter_tokenizer=load_tokenizer(drafter), adaptive=False)
    totals = dict.fromkeys(methods, 0)
    for prompt in prompts_of(target):
        want = plain(dec, target, prompt)
        for method in methods:
            out = dec.generate(prompt, max_new_tokens=MAX_NEW, method=method)
            assert out.token_ids == want.token_ids, (method, prompt[:60], out.text, want.text)
            s = out.stats
            assert s["accepted"] <= s["drafted"]
            # every committed token is an accepted draft or the target's own (one per call)
            assert s["new_tokens"] == s["accepted"] + s["target_tokens"]
            assert s["target_tokens"] <= s["target_calls"]
            totals[method] += s["accepted"]
    # the drafter must actually help on some prompts, or the test proves nothing
    assert all(v > 0 for v in totals.values()), totals


@pytest.mark.real
@pytest.mark.slow
def test_auto_with_every_optimisation_on_is_identical_to_plain_greedy(real_model, exactness_device):
    """`auto` as users run it: adaptive draft lengths, measured choice of method, prompt lookup
    mixed with the drafter, the drafter on llama.cpp reading only the prompt's last 16 tokens.
    Which proposer runs each step depends on timing; the output must not."""
    target = "qwen2.5-coder-0.5b"
    dec = Decoder(target=real_model(target, device=exactness_device), tokenizer=load_tokenizer(target),
                  drafter=drafter_model(real_model, "smollm2-135m", "llamacpp", exactness_device),
                  drafter_tokenizer=load_tokenizer("smollm2-135m"), drafter_context=16)
    drafted = 0
    for prompt in prompts_of(target):
        out = dec.generate(prompt, max_new_tokens=MAX_NEW)
        assert out.token_ids == plain(dec, target, prompt).token_ids, (out.stats["method"], prompt[:60])
        assert out.stats["method"] in ("slem+lookup", "tli+lookup")
        drafted += out.stats["drafted"]
    assert drafted > 0


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("method, max_batch", [("auto", None), ("tli", 2), ("lookup", 3)])
def test_a_batch_of_prompts_is_identical_to_each_alone(real_model, exactness_device, method, max_batch):
    """`generate_batch` on a real pair: the target's rows in one forward pass (`TorchBatch`),
    prompts of very different lengths (code, German, prose, a long article) decoded together,
    `auto` as users run it and fixed-length methods with fewer rows than prompts (the later
    prompts join as rows leave), each identical to its plain greedy output."""
    from anydraft.models.rows import TorchBatch

    target = "qwen2.5-coder-0.5b"
    dec = Decoder(target=real_model(target, device=exactness_device), tokenizer=load_tokenizer(target),
                  drafter=drafter_model(real_model, "smollm2-135m", "llamacpp", exactness_device),
                  drafter_tokenizer=load_tokenizer("smollm2-135m"), adaptive=method == "auto")
    assert isinstance(dec.target.new_batch(2), TorchBatch)
    prompts = prompts_of(target) + [mixed_prompts()[i] for i in (0, 9)]
    outs = dec.generate_batch(prompts, max_new_tokens=MAX_NEW, method=method, max_batch=max_batch)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == plain(dec, target, prompt).token_ids, (out.stats["method"], prompt[:60])
    assert sum(out.stats["drafted"] for out in outs) > 0


@pytest.mark.real
@pytest.mark.slow
def test_greedy_with_a_logit_bias_is_identical_to_plain_greedy_with_it(real_model, exactness_device):
    """A bias that bans tokens of the plain output and favours another: every method, the
    same-vocabulary drafter (sd) and drafters of another vocabulary (its drafts biased where
    it spells a token alike), gives plain greedy decoding's output under the same bias."""
    target, max_new = "smollm2-135m", 16
    model = real_model(target, device=exactness_device)
    drafters = {"sd": (target, "float32"), "slem": ("gemma3-270m", "bfloat16"),
                "tli": ("gemma3-270m", "bfloat16")}
    prompt = prompts_of(target)[0]
    base = Decoder(target=model, tokenizer=load_tokenizer(target))
    unbiased = base.generate(prompt, max_new_tokens=max_new, method="ar").token_ids
    favoured = load_tokenizer(target).encode(" very")[0]
    bias = {unbiased[0]: -100.0, unbiased[3]: -100.0, favoured: 4.0}
    want = base.generate(prompt, max_new_tokens=max_new, method="ar", logit_bias=bias).token_ids
    assert want != unbiased and unbiased[0] not in want
    for method, (drafter, dtype) in drafters.items():
        dec = Decoder(target=model, tokenizer=load_tokenizer(target),
                      drafter=real_model(drafter, dtype, exactness_device),
                      drafter_tokenizer=load_tokenizer(drafter), adaptive=False)
        out = dec.generate(prompt, max_new_tokens=max_new, method=method, logit_bias=bias)
        assert out.token_ids == want, method
        assert out.stats["accepted"] > 0, method
