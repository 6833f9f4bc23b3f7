"""Issue 61's soak: servers whose workers share one model, under load and faults.

For each configuration (workers x target backend x exact x max-batch) it starts a real
`anydraft serve` on the catalog's models, asks each prompt alone (greedy: the reference), then
sends ``--requests`` requests at once from more clients than the server has rows, about 5% of
them poison:

- bad parameters (a 4xx is the answer, nothing else changes);
- a client that disconnects mid-prefill (a long prompt, the connection closed before a byte
  comes back) or mid-stream (after the first chunk);
- one injected failure of a whole step (the fault hook below: a file the script writes makes
  the server's next decoding step raise once), which may fail only the rows of that step.

Per configuration it reports: requests that failed without cause (any other than the injected
step's rows, at most max-batch of them), hangs (no answer in ``--timeout`` s), greedy answers
that differ from the same prompt alone (must be 0 wherever exact is on), the server's RSS after
the soak against its level after a warm-up burst that used every row once (within 5%: a pool
of caches may stay, a leak may not), and /health at the end.

    python scripts/soak.py --requests 200 --out benchmarks/results/NAME

The servers run this file (``serve`` as first argument) so the fault hook is installed in
their process; nothing of it is in the package.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FAULT_ENV = "ANYDRAFT_SOAK_FAULT_FILE"  # the file whose appearance fails the next step
MODEL_ID = "soak"
PROMPTS = [
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "The capital of France is",
    "import numpy as np\n\ndef normalize(v):",
    "List three prime numbers:",
    "class Stack:\n    def __init__(self):",
    "Explain what a KV cache is in one sentence.",
    "SELECT name FROM users WHERE",
]
LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 150  # ~1,400 tokens: a long prefill
POISON_SHARE = 0.05
RSS_BOUND = 1.05  # the soak's RSS within 5% of the warm level (issue 61)
# configurations, as issue 61 lists them
WORKERS, BACKENDS, EXACT, BATCHES = (2, 4), ("llamacpp", "torch"), ("on", "off"), (1, 8)


def serve_with_fault_hook(argv: list[str]) -> int:
    """``anydraft serve ARGV`` in this process, with the decoding step wrapped: while the file
    `FAULT_ENV` names exists, the next step removes it and raises (one injected step failure)."""
    from anydraft.cli import main
    from anydraft.decoding import loop

    fault, real = os.environ[FAULT_ENV], loop.step

    def step(*args, **kwargs):
        try:
            os.remove(fault)
        except FileNotFoundError:
            return real(*args, **kwargs)
        raise RuntimeError("injected step failure (scripts/soak.py)")

    loop.step = step
    return main(["serve", *argv])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def body(prompt: str, max_tokens: int, stream: bool, **extra) -> dict:
    return {"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, **extra}


def complete(http, base: str, prompt: str, max_tokens: int, stream: bool) -> tuple[int, str]:
    """(status, text) of one completion, streamed or not."""
    url = f"{base}/v1/completions"
    if not stream:
        answer = http.post(url, json=body(prompt, max_tokens, False))
        text = answer.json()["choices"][0]["text"] if answer.status_code == 200 else answer.text
        return answer.status_code, text
    text, status = [], None
    with http.stream("POST", url, json=body(prompt, max_tokens, True)) as answer:
        status = answer.status_code
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return 500, json.dumps(event["error"])
            text += [c.get("text", "") for c in event.get("choices", [])]
    return status, "".join(text)


def poison(kind: str, http, base: str, max_tokens: int) -> str:
    """Send one poison request of ``kind``; what happened, in a word."""
    import httpx

    url = f"{base}/v1/completions"
    if kind == "bad-params":
        bad = random.choice([{"temperature": -1}, {"max_tokens": -5}, {"top_p": 7},
                             {"prompt": {"not": "text"}}, {"n": 0}])
        status = http.post(url, json={**body("hello", max_tokens, False), **bad}).status_code
        return "refused" if 400 <= status < 500 else f"status {status}"
    try:
        with http.stream("POST", url, json=body(LONG_PROMPT if kind == "drop-prefill" else PROMPTS[0],
                                                max_tokens, True)) as answer:
            if kind == "drop-stream":
                next(answer.iter_lines(), None)
            answer.close()  # the client goes away
    except httpx.HTTPError:
        pass
    return "dropped"


def soak_one(config: dict, args, log_dir: Path) -> dict:
    import httpx

    from anydraft.bench.processes import free_port
    from anydraft.bench.serve import ServerProcess

    port, label = free_port(), "{workers}w-{backend}-exact-{exact}-batch{max_batch}".format(**config)
    base = f"http://127.0.0.1:{port}"
    fault = Path(tempfile.mkdtemp()) / "fault"
    backend = ["--target-backend", "llamacpp"] if config["backend"] == "llamacpp" else \
        ["--target-backend", "torch", "--dtype", "bfloat16"]
    cmd = [sys.executable, __file__, "serve", "--target", args.target, "--drafter", args.drafter,
           "--drafter-backend", "llamacpp", *backend, "--exact", config["exact"],
           "--max-concurrency", str(config["workers"]), "--max-batch", str(config["max_batch"]),
           "--max-queue", str(args.requests), "--max-queued-per-client", str(args.requests),
           # every client of the soak is 127.0.0.1: one client to the server's fair shares
           "--max-connections", str(4 * args.requests), "--max-connections-per-client", str(4 * args.requests),
           "--served-model-name", MODEL_ID, "--port", str(port), "--log-level", "warning"]
    server = ServerProcess(cmd, log_dir / f"{label}.log", **{FAULT_ENV: str(fault)},
                           ANYDRAFT_LLAMACPP_CONTEXT=str(args.context))
    result = {**config, "label": label}
    try:
        server.wait_ready(base, args.startup_timeout, label)
        limits = httpx.Timeout(args.timeout, connect=30)
        with httpx.Client(timeout=limits) as http:
            reference = {p: complete(http, base, p, args.max_tokens, False)[1] for p in PROMPTS}
            clients = 2 * config["workers"] * config["max_batch"] + 4  # more than the rows: a queue
            with ThreadPoolExecutor(clients) as pool:  # warm: every row and pool in use once
                list(pool.map(lambda i: complete(http, base, PROMPTS[i % len(PROMPTS)], args.max_tokens,
                                                 stream=False), range(clients)))
            warm = rss_mb(server.proc.pid)
            kinds = ["bad-params", "drop-prefill", "drop-stream"]
            plan = [random.choice(kinds) if random.random() < POISON_SHARE else None
                    for _ in range(args.requests)]
            outcomes: list = [None] * args.requests

            def one(i: int):
                if i == args.requests // 2:
                    fault.touch()  # the next step fails: its rows may fail with it
                try:
                    if plan[i]:
                        outcomes[i] = ("poison", plan[i], poison(plan[i], http, base, args.max_tokens))
                    else:
                        prompt = PROMPTS[i % len(PROMPTS)]
                        status, text = complete(http, base, prompt, args.max_tokens, stream=i % 2 == 0)
                        outcomes[i] = ("normal", status, text == reference[prompt], text)
                except httpx.TimeoutException:
                    outcomes[i] = ("hang",)
                except httpx.HTTPError as exc:
                    outcomes[i] = ("normal", f"transport: {exc}", False, "")

            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(one, range(args.requests)))
            result["seconds"] = round(time.perf_counter() - start, 1)
            idle_deadline = time.monotonic() + 30
            while time.monotonic() < idle_deadline:  # let dropped requests' rows end
                health = http.get(f"{base}/health").json()
                if not health.get("active", 0) and not health.get("waiting", 0):
                    break
                time.sleep(0.5)
            after = rss_mb(server.proc.pid)
        normal = [o for o in outcomes if o[0] == "normal"]
        failed = [o for o in normal if o[1] != 200]
        result.update(
            requests=args.requests, poison=sum(1 for o in outcomes if o[0] == "poison"),
            poison_ok=all(o[2] in ("refused", "dropped") for o in outcomes if o[0] == "poison"),
            failed=len(failed), step_fault_bound=config["max_batch"],
            failed_statuses=sorted({str(o[1]) for o in failed}),
            unrelated_failures=max(0, len(failed) - config["max_batch"]),
            hangs=sum(1 for o in outcomes if o[0] == "hang"),
            differ=sum(1 for o in normal if o[1] == 200 and not o[2]),
            fault_fired=not fault.exists(), health=health.get("status"),
            rss_warm_mb=round(warm), rss_after_mb=round(after), rss_ratio=round(after / warm, 3))
        result["ok"] = (result["unrelated_failures"] == 0 and result["hangs"] == 0 and result["poison_ok"]
                        and (config["exact"] == "off" or result["differ"] == 0) and result["fault_fired"]
                        and result["health"] == "ok" and result["rss_ratio"] <= RSS_BOUND)
    except Exception as exc:  # noqa: BLE001 - one configuration's failure is its row of the table
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    finally:
        server.stop()
        crashed = "Traceback" in server.log() and "injected step failure" not in server.log()
        result["tracebacks_other_than_the_fault"] = crashed
    return result


def table(results: list[dict]) -> str:
    cols = ["label", "seconds", "failed", "unrelated_failures", "hangs", "differ", "poison",
            "health", "rss_warm_mb", "rss_after_mb", "rss_ratio", "ok"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join(str(r.get(c, r.get("error", ""))) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        return serve_with_fault_hook(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--drafter", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--context", type=int, default=2048, help="ANYDRAFT_LLAMACPP_CONTEXT")
    parser.add_argument("--timeout", type=float, default=300, help="seconds after which a request hangs")
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--only", default="", help="substrings of the labels to run, comma-separated, "
                                                   "e.g. 'torch' or '2w-llamacpp,4w-torch'")
    parser.add_argument("--seed", type=int, default=61)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="anydraft-soak-"))
    print(f"soak: servers' logs in {logs}", file=sys.stderr)
    results = []
    for workers, backend, exact, max_batch in itertools.product(WORKERS, BACKENDS, EXACT, BATCHES):
        config = {"workers": workers, "backend": backend, "exact": exact, "max_batch": max_batch}
        label = "{workers}w-{backend}-exact-{exact}-batch{max_batch}".format(**config)
        if not any(part in label for part in args.only.split(",")):
            continue
        print(f"soak: {config} ...", file=sys.stderr, flush=True)
        results.append(soak_one(config, args, logs))
        print(f"  {json.dumps(results[-1])}", file=sys.stderr, flush=True)
        (args.out / "soak.json").write_text(json.dumps({"command": " ".join(sys.argv),
                                                         "results": results}, indent=1))
        (args.out / "soak.md").write_text(table(results))
    print(table(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    threading.current_thread().name = "soak"
    sys.exit(main())
