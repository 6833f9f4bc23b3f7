"""`anydraft serve --exact` (issue 41, docs/exact.md): 16 concurrent greedy clients on a real
target, 8 rows per step, each answered exactly as the same request sent alone to the same
server. Without --exact the torch bfloat16 path changes some of them (near-ties rounded with
the shape of the call: which rows share it, how a prompt's read is split between steps)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import require_llamacpp, require_model
from tests.server.conftest import MODEL_ID, scrape_total
from tests.server_process import Server

# 16 prompts of 1 to ~60 tokens, and as many lengths (24..31), so rows join and leave at
# different steps and joining prompts are read beside other rows' steps
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hi",
    "List three primary colors:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox jumps over the lazy dog. Then",
    "Water boils at",
    "In machine learning, overfitting means",
    "1, 2, 3, 4, 5,",
    "Translate to German: Good morning, how are you today?",
    "A recipe for pancakes: first,",
    "The mitochondria is",
    "import numpy as np\nimport matplotlib.pyplot as plt\n\nx = np.linspace(0, 10, 100)\n",
    "Why is the sky blue? Explain it to a child in a few simple sentences, without jargon.",
    "Q: What is 12 times 12?\nA:",
    "Dear hiring manager, I am writing to apply for the position of",
]
MAX_TOKENS = [24 + i % 8 for i in range(len(PROMPTS))]


def complete(base: str, i: int) -> str:
    body = {"model": MODEL_ID, "prompt": PROMPTS[i], "temperature": 0, "max_tokens": MAX_TOKENS[i]}
    r = httpx.post(base + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def alone_and_together(base: str) -> tuple[list[str], list[str]]:
    """Every request sent alone (one after another), then all 16 at once."""
    alone = [complete(base, i) for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda i: complete(base, i), range(len(PROMPTS))))
    return alone, together


CONFIGS = {
    # the path where batching changes greedy output without --exact
    "torch-bf16": (("--target-backend", "torch"), "bfloat16"),
    # the speculative path in a batch: drafts of every length verified beside other rows
    "torch-bf16+drafter": (("--target-backend", "torch", "--drafter", "smollm2-135m",
                            "--drafter-backend", "llamacpp", "--fixed-k"), "bfloat16"),
    # exact on llama.cpp: rows one after another in calls of at most 3 tokens
    "llamacpp": (("--target-backend", "llamacpp"), None),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def exact_server(request, tmp_path_factory):
    require_model("smollm2-135m")
    extra, dtype = CONFIGS[request.param]
    if "llamacpp" in extra:
        require_llamacpp()
    log = tmp_path_factory.mktemp("exact-serve") / f"{request.param}.log"
    srv = Server("smollm2-135m", log, "--max-batch", "8", "--exact", *extra, dtype=dtype or "float32")
    try:
        health = srv.wait_ready()
        assert health["exact"] and health["exact_auto"] is None and health["max_batch"] == 8, health
        yield srv
    finally:
        srv.stop()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.mark.real
def test_16_concurrent_greedy_clients_get_what_each_gets_alone(exact_server):
    alone, together = alone_and_together(exact_server.base)
    differ = [(PROMPTS[i][:30], a, b) for i, (a, b) in enumerate(zip(alone, together, strict=True)) if a != b]
    assert not differ, f"{len(PROMPTS) - len(differ)} of {len(PROMPTS)} identical: {differ}"
    if "--drafter" in exact_server.proc.args:  # the drafts were verified, not skipped
        assert scrape_total(exact_server.base, "anydraft_accepted_tokens_total") > 0
