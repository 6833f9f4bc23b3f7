"""A/B of two anydraft trees on the same packed float32 target (oneDNN linear layers, so the
verification curve is flat enough for drafting to matter) and a llama.cpp SmolLM2 drafter.
usage: ab.py TREE TEMPERATURE OUT.json"""
import json, sys, time, statistics
tree, temp, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
sys.path.insert(0, tree)
import torch
import anydraft
assert anydraft.__file__.startswith(tree), anydraft.__file__
from anydraft import Decoder
from anydraft.models.loading import load_model, load_tokenizer

def pack(model):
    class P(torch.nn.Module):
        def __init__(self, lin, keep):
            super().__init__()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 8)
            self.bias = None if lin.bias is None else lin.bias.detach()
            self.weight = lin.weight if keep else None
        def forward(self, x):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
    outp = model.get_output_embeddings()
    for m in list(model.modules()):
        for n, c in list(m.named_children()):
            if type(c) is torch.nn.Linear:
                setattr(m, n, P(c, c is outp))
    return model

cats = ["coding", "extraction", "math", "qa", "summarization", "writing"]
prompts = {}
for line in open("/work/shared/data/spec_bench_questions.jsonl"):
    q = json.loads(line)
    if q["category"] in cats and q["category"] not in prompts:
        prompts[q["category"]] = q["turns"][0]
target = pack(load_model("qwen2.5-coder-1.5b", dtype="float32"))
tok = load_tokenizer("qwen2.5-coder-1.5b")
dec = Decoder(target=target, tokenizer=tok, drafter="smollm2-135m", drafter_backend="llamacpp", method="auto")
kw = dict(temperature=temp, seed=0) if temp else {}
dec.generate(prompts["coding"], 8, method="ar", **kw); dec.generate(prompts["coding"], 8, method="auto", **kw)
rows = []
for cat in cats:
    r = {}
    for method in ("ar", "auto"):
        o = dec.generate(prompts[cat], 64, method=method, **kw)
        s = o.stats
        r[method] = {"tps": s["tokens_per_s"], "tokens": s["new_tokens"], "drafted": s["drafted"], "accepted": s["accepted"],
                     "drafter_calls": s.get("drafter_calls"), "target_calls": s.get("target_calls"), "ids": o.token_ids}
    r["speedup"] = r["auto"]["tps"] / r["ar"]["tps"]
    r["same"] = r["auto"]["ids"] == r["ar"]["ids"]
    print(tree, temp, cat, f"ar {r['ar']['tps']:.2f} auto {r['auto']['tps']:.2f} x{r['speedup']:.2f} same={r['same']} drafter_calls={r['auto']['drafter_calls']} target_calls={r['auto']['target_calls']}", flush=True)
    rows.append((cat, r))
print(tree, temp, "MEDIAN", statistics.median(r["speedup"] for _, r in rows), flush=True)
json.dump(rows, open(out, "w"))
