"""Offline batching: N prompts decoded alone one after another vs together
(`Decoder.generate_batch`), same decoder, same run; throughput = all new tokens / wall time.

    chrt -f 10 python batch.py TARGET_DTYPE METHOD N MAX_NEW_TOKENS OUT.json
"""

import json
import sys
import time

from anydraft import Decoder
from anydraft.bench.datasets import load_dataset

dtype, method, n, max_new, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
prompts = [r["prompt"] for r in load_dataset("spec-bench", ["coding", "writing", "qa", "math"], n=-(-n // 4))][:n]
dec = Decoder("qwen2.5-coder-1.5b", "smollm2-135m" if method != "ar" else None, backend="torch",
              dtype=dtype, drafter_backend="llamacpp")
dec.generate(prompts[0], 4, method=method)  # warm-up
start = time.perf_counter()
alone = [dec.generate(p, max_new, method=method) for p in prompts]
alone_s = time.perf_counter() - start
start = time.perf_counter()
together = dec.generate_batch(prompts, max_new, method=method)
together_s = time.perf_counter() - start
tokens = sum(len(o.token_ids) for o in alone)
result = {
    "target": f"qwen2.5-coder-1.5b torch {dtype}", "method": method, "prompts": n, "max_new_tokens": max_new,
    "alone_s": alone_s, "together_s": together_s, "tokens": tokens,
    "alone_tok_s": tokens / alone_s, "together_tok_s": sum(len(o.token_ids) for o in together) / together_s,
    "identical": sum(a.token_ids == b.token_ids for a, b in zip(alone, together)),
}
result["throughput_ratio"] = result["together_tok_s"] / result["alone_tok_s"]
print(json.dumps(result, indent=1))
json.dump(result, open(out_path, "w"), indent=1)
