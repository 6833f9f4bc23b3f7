"""What exact scoring (models/exact.py, docs/exact.md) costs per call, per path: the median
seconds of one plain step (1 token), one verification (`--draft` + 1 tokens) and one prompt
read (`--prompt` tokens, the last one's logits asked for, as a decoder reads a prompt), exact
and not, interleaved so that a change of load hits both alike.

    flock /tmp/anydraft-bench.lock chrt -f 10 python scripts/exact_cost.py \\
        --target smollm2-135m --paths torch:bfloat16,torch:float32,llamacpp
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from anydraft.models.backends import load


def seconds(session, ids: list[int], rows: int) -> float:
    """One call of ``ids`` (``rows`` logits asked for) after the session's context, taken back after."""
    at = len(session)
    start = time.perf_counter()
    session.feed(ids, rows)
    took = time.perf_counter() - start
    session.rollback(at)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--paths", default="torch:bfloat16,torch:float32,llamacpp",
                        help="comma list of torch:DTYPE or llamacpp")
    parser.add_argument("--draft", type=int, default=5, help="draft length k of the verification")
    parser.add_argument("--context", type=int, default=200, help="tokens in the cache before each call")
    parser.add_argument("--prompt", type=int, default=256, help="tokens of the prompt read")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(0)
    print("| path | call | plain ms | exact ms | exact / plain |\n|---|---|---|---|---|")
    for path in args.paths.split(","):
        backend, _, dtype = path.partition(":")
        plain = load(args.target, backend, dtype=dtype or "auto")
        exact = load(args.target, backend, tokenizer=plain.tokenizer, dtype=dtype or "auto").make_exact()
        vocab = min(plain.logits_width, 30_000)
        context = [rng.randrange(vocab) for _ in range(args.context)]
        sessions = {}
        for name, loaded in (("plain", plain), ("exact", exact)):
            sessions[name] = loaded.new_session()
            sessions[name].feed(context, 1)
        calls = {"1 token": 1, f"{args.draft + 1} tokens": args.draft + 1, f"prompt {args.prompt}": args.prompt}
        times = {(c, n): [] for c in calls for n in sessions}
        for r in range(args.rounds + 1):  # the first round warms up, unrecorded
            for call, size in calls.items():
                if size == args.prompt and r % 3:  # long reads: every third round
                    continue
                ids = [rng.randrange(vocab) for _ in range(size)]
                for name in (("plain", "exact") if r % 2 else ("exact", "plain")):
                    took = seconds(sessions[name], ids, 1 if size == args.prompt else size)  # a prompt: its last
                    if r:
                        times[(call, name)].append(took)
        for call in calls:
            p, e = (statistics.median(times[(call, n)]) for n in ("plain", "exact"))
            print(f"| {plain.path} | {call} | {p * 1e3:.1f} | {e * 1e3:.1f} | {e / p:.2f} |", flush=True)
        del plain, exact, sessions


if __name__ == "__main__":
    main()
