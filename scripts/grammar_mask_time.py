"""Issue 63: which grammar engine masks a token fastest on this CPU, for the catalog's tokenizers.

For each tokenizer (the converted GGUFs' in $ANYDRAFT_CACHE/converted) and each engine
(llguidance, xgrammar), it compiles a JSON schema, then walks the tokens of a valid answer:
at each position it computes the allowed-token mask and consumes the token, as constrained
decoding does once per scored position. Prints compile time and the median and 90th
percentile of one mask, in microseconds, and the same for a speculative step's masks (a draft of
4 tokens: advance 4, roll back 4).

    python scripts/grammar_mask_time.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "languages", "address"],
    "additionalProperties": False,
}
ANSWER = json.dumps({"name": "Ada Lovelace", "age": 36, "languages": ["English", "French", "Analytical Engine"],
                     "address": {"city": "London", "zip": "W1"}})
TOKENIZERS = ("qwen2.5-coder-1.5b-instruct", "SmolLM2-135M-Instruct", "gemma-3-270m")
DRAFT = 4


def tokenizer_dirs() -> dict[str, Path]:
    from anydraft.atomic import cache_dir

    found = {}
    for d in sorted((cache_dir() / "converted").glob("*/tokenizer")):
        name = next((t for t in TOKENIZERS if d.parent.name.startswith(t)), None)
        if name:
            found[name] = d
    return found


def llguidance_engine(tok):
    import llguidance
    import llguidance.hf
    import numpy as np

    lltok = llguidance.hf.from_tokenizer(tok)
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(lltok, grammar)
    compiled = time.perf_counter() - start
    words = (lltok.vocab_size + 31) // 32
    mask = np.zeros(words, dtype=np.int32)

    def fill():
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

    return compiled, fill, matcher.consume_token, matcher.rollback, lambda: matcher.is_error()


def xgrammar_engine(tok):
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tok)
    start = time.perf_counter()
    compiled_grammar = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    matcher = xgrammar.GrammarMatcher(compiled_grammar, max_rollback_tokens=16)
    compiled = time.perf_counter() - start
    bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def fill():
        matcher.fill_next_token_bitmask(bitmask)

    return compiled, fill, matcher.accept_token, matcher.rollback, lambda: False


def measure(engine, tok, ids: list[int]) -> dict:
    compiled, fill, consume, rollback, failed = engine(tok)
    one, step = [], []
    for i, token in enumerate(ids):
        start = time.perf_counter()
        fill()
        one.append(time.perf_counter() - start)
        if i + DRAFT < len(ids):  # a step: masks along a draft of DRAFT tokens, then rolled back
            start = time.perf_counter()
            for t in ids[i:i + DRAFT]:
                fill()
                consume(t)
            fill()
            rollback(DRAFT)
            step.append(time.perf_counter() - start)
        consume(token)
        assert not failed(), f"the answer's token {i} was refused"
    pct = lambda xs, q: sorted(xs)[int(q * (len(xs) - 1))] * 1e6  # noqa: E731
    return {"compile_ms": round(compiled * 1e3, 1), "mask_us_median": round(statistics.median(one) * 1e6, 1),
            "mask_us_p90": round(pct(one, 0.9), 1), f"step_of_{DRAFT}_us_median": round(statistics.median(step) * 1e6, 1)}


def main() -> None:
    from transformers import AutoTokenizer

    from anydraft.hardware.machine import cpu_flags

    print("cpu flags:", " ".join(sorted(f for f in cpu_flags() if f.startswith("avx512") or f.startswith("amx"))))
    rows = []
    for name, d in tokenizer_dirs().items():
        tok = AutoTokenizer.from_pretrained(d)
        ids = tok.encode(ANSWER, add_special_tokens=False)
        for label, engine in (("llguidance", llguidance_engine), ("xgrammar", xgrammar_engine)):
            rows.append({"tokenizer": name, "vocab": len(tok), "engine": label, **measure(engine, tok, ids)})
            print(json.dumps(rows[-1]), flush=True)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
