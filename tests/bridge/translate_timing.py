"""Per-step translation cost on the real pairs (prints; not a test).

    python tests/bridge/translate_timing.py

Simulates SLEM: a drafter proposes k=5 tokens of a text, the bridge turns them into target
candidate tokens (continue_tokens after the committed target context, plus the stable-prefix
check), and the drafter is resynced to the committed text (resync)."""

import time
from pathlib import Path

from anydraft.bridge import continue_tokens, resync, stable_prefix_len, token_table
from anydraft.models.loading import load_tokenizer

PAIRS = [
    ("qwen2.5-coder-1.5b", "smollm2-135m"),
    ("qwen2.5-coder-1.5b", "gemma3-270m"),
    ("gemma3-270m", "smollm2-135m"),
]
TEXT = (Path(__file__).parents[2] / "anydraft" / "bridge" / "translate.py").read_text()[:6000]


def main(k: int = 5) -> None:
    for tname, dname in PAIRS:
        t, d = token_table(load_tokenizer(tname)), token_table(load_tokenizer(dname))
        (
            t.extendable,
            d.extendable,
            t.extendable_prefix(b""),
            d.extendable_prefix(b""),
        )  # warm caches
        d_ids = d.encode_bytes(TEXT.encode())
        t_ctx: list[int] = []
        d_ctx: list[int] = []
        steps, fwd, back = 0, 0.0, 0.0
        for i in range(0, len(d_ids), k):
            draft = d_ids[i : i + k]
            s0 = time.perf_counter()
            cand = continue_tokens(t, t_ctx, d.decode_bytes(draft))
            stable_prefix_len(t, cand)
            s1 = time.perf_counter()
            committed = t.decode_bytes(cand)  # pretend everything was accepted
            n_keep, feed = resync(d, d_ctx, draft, committed)
            s2 = time.perf_counter()
            t_ctx += cand
            d_ctx += draft[:n_keep] + feed
            steps += 1
            fwd += s1 - s0
            back += s2 - s1
        assert t.decode_bytes(t_ctx) == TEXT.encode()
        print(
            f"{dname} -> {tname}: {steps} steps of {k} drafter tokens: drafter->target "
            f"{fwd / steps * 1e6:.0f} us/step, resync {back / steps * 1e6:.0f} us/step"
        )


if __name__ == "__main__":
    main()
