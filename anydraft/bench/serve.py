"""`anydraft bench-serve`: the server measured as its clients see it.

`anydraft bench` times one generation at a time inside one process; what a server is worth
under load (batching, queueing, the HTTP stream) only shows from outside. So each
configuration gets its own `anydraft serve` subprocess (a fresh process: no state carried
between configurations), and concurrent streaming clients drive it at each concurrency.

Per request, as vLLM's serving benchmark counts them: TTFT (send -> first content chunk),
ITL (each gap between content chunks; a speculative step streams several tokens in one
chunk, so a gap is a step, not a token), TPOT = (end - TTFT) / (tokens - 1), and the
completion tokens from the stream's `usage`. With ``--repeats`` the configurations run in
turn, round after round, and each level reports the median over rounds (`medians`). Light at
import time (argparse only).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..models.engines import BACKENDS
from ..options import command_line
from .llama_server import SERVERS
from .processes import free_port, stop_process
from .realtime import refuse_realtime

HELP = """Benchmark `anydraft serve` under concurrent load: one server process per
configuration, closed-loop streaming clients (or Poisson arrivals with --rate) at each
--concurrency. Writes results.json (every request, and per level throughput and p50/p99 of
TTFT, ITL and TPOT), summary.md and PNG plots to --out. Exit status 1 when a request failed."""

MODEL_ID = "bench"  # the name each server serves its target under
LOG_TAIL = 30  # lines of a server's log shown when it fails


@dataclass(frozen=True)
class ServeConfig:
    label: str
    args: tuple[str, ...]  # extra `anydraft serve` arguments


def register(sub) -> None:
    """Add the `bench-serve` subcommand to ``sub`` (the subparsers of `anydraft`)."""
    b = sub.add_parser("bench-serve", help="benchmark `anydraft serve` under concurrent load",
                       description=HELP)
    b.add_argument("--target", required=True, help="catalog name, hub id, directory or .gguf")
    b.add_argument("--drafter", default=None,
                   help="drafter model, given to every configuration but `--method ar` ones")
    for flag, choices in (("--dtype", None), ("--drafter-dtype", None),
                          ("--target-backend", ("auto", *BACKENDS)),
                          ("--drafter-backend", ("auto", *BACKENDS)),
                          ("--device", ("auto", "cpu", "cuda"))):
        b.add_argument(flag, default=None, choices=choices,
                       help="passed to `anydraft serve` (default: its default)")
    b.add_argument("--configs", action="append", default=None, metavar="LABEL=ARGS[;LABEL=ARGS]",
                   help="server configurations, each a label and extra `anydraft serve` arguments, "
                        "e.g. 'plain=--method ar --max-batch 1;sd=--method sd' (repeatable); "
                        "default: plain (--method ar) and anydraft (the default method), each "
                        "with --max-batch 1 and --max-batch B")
    b.add_argument("--max-batch", type=int, default=None, metavar="B",
                   help="B of the default configurations (default: the highest --concurrency)")
    b.add_argument("--llama-server", action="store_true",
                   help="add configuration `llama-server` first: llama.cpp's own server on the "
                        "target's GGUF file, with as many --parallel slots as the highest "
                        "--concurrency (continuous batching), the threads and per-request context "
                        "of anydraft's llama.cpp backend; found or built as for `bench --baseline "
                        "llama-server`")
    b.add_argument("--ik-llama-server", action="store_true",
                   help="add configuration `ik-llama-server` first: ik_llama.cpp's own server, "
                        "likewise (built once from the ik-llama-cpp-python sources)")
    b.add_argument("--baseline", default=None,
                   help="the configuration throughput ratios divide by (default: the first)")
    b.add_argument("--concurrency", default="1,2,4,8",
                   help="comma list of client counts, one level each (default 1,2,4,8)")
    b.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals at R requests/s instead of a closed loop; "
                        "--concurrency then caps the requests in flight")
    b.add_argument("--requests-per-level", type=int, default=None, metavar="N",
                   help="requests per (configuration, concurrency) (default: 4 x concurrency, "
                        "at least 16)")
    b.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="run the configurations R times in turn (A, B, A, B, ...; a fresh server "
                        "each time) and report medians: on a noisy machine a ratio's median over "
                        "rounds, each measured within one round, with its range (default 1)")
    b.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request")
    b.add_argument("--temperature", type=float, default=0.0, help="of every request (default greedy)")
    b.add_argument("--seed", type=int, default=0,
                   help="shuffles the prompt order, draws the arrivals, seeds sampling requests")
    b.add_argument("--dataset", default="builtin",
                   help="builtin | spec-bench (../shared/data/spec_bench_questions.jsonl) | PATH.jsonl")
    b.add_argument("--categories", default=None, help="comma list: only these categories")
    b.add_argument("--n", type=int, default=None, help="at most N prompts per category")
    b.add_argument("--completions", action="store_true",
                   help="send raw prompts to /v1/completions (default: chat messages to "
                        "/v1/chat/completions, the target's chat template applied)")
    b.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed request each server gets before its first level")
    b.add_argument("--startup-timeout", type=float, default=900.0,
                   help="seconds a server may take to answer /health (loading, measuring dtypes)")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--out", default=None, help="output directory (default bench-serve-<date>-<time>)")
    b.add_argument("--json", action="store_true", help="no progress lines; print results.json to stdout")
    b.set_defaults(func=cmd_bench_serve)


# -- settings -------------------------------------------------------------------------------
def parse_concurrency(text: str) -> list[int]:
    from ..errors import AnydraftError

    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise AnydraftError(f"--concurrency must be a comma list of integers >= 1 "
                            f"(e.g. 1,2,4,8), got {text!r}")
    return sorted(set(levels))


def default_configs(max_batch: int) -> list[ServeConfig]:
    """{plain AR, anydraft's default method} x {one row at a time, batches of B}."""
    return [ServeConfig(f"{name}-b{b}", (*method, "--max-batch", str(b)))
            for name, method in (("plain", ("--method", "ar")), ("anydraft", ()))
            for b in dict.fromkeys((1, max_batch))]


def parse_configs(texts: list[str]) -> list[ServeConfig]:
    from ..errors import AnydraftError

    configs = []
    for entry in (e.strip() for text in texts for e in text.split(";")):
        if not entry:
            continue
        label, sep, rest = entry.partition("=")
        label = label.strip()
        if not sep or not label or any(c.isspace() for c in label) or "/" in label:
            raise AnydraftError(f"--configs: {entry!r} is not LABEL=ARGS (a label without spaces "
                                "or slashes, then the extra `anydraft serve` arguments)")
        try:
            args = tuple(shlex.split(rest))
        except ValueError as exc:
            raise AnydraftError(f"--configs: cannot split the arguments of {label!r}: {exc}") from None
        configs.append(ServeConfig(label, args))
    labels = [c.label for c in configs]
    if not configs or len(set(labels)) != len(labels):
        raise AnydraftError(f"--configs needs at least one configuration and unique labels, got "
                            f"{', '.join(labels) or 'none'}")
    return configs


def plain_ar(args: tuple[str, ...]) -> bool:
    """Whether a configuration decodes plainly (no drafter is loaded for it)."""
    pairs = zip(args, args[1:], strict=False)
    return "--method=ar" in args or any(a == "--method" and b == "ar" for a, b in pairs)


LLAMA_SERVER = "llama-server"  # the label of `--llama-server`'s configuration
# the plain servers' configurations: label -> the option that adds it (--llama-server, ...)
PLAIN_SERVERS = {name: name.replace("-", "_") for name in SERVERS}


def server_command(args, config: ServeConfig, port: int, max_queue: int) -> list[str]:
    if config.label in PLAIN_SERVERS and getattr(args, PLAIN_SERVERS[config.label], False):
        return llama_server_command(args, port, config.label)
    cmd = [sys.executable, "-m", "anydraft", "serve", "--target", args.target]
    if args.drafter and not plain_ar(config.args):
        cmd += ["--drafter", args.drafter]
    for name in ("dtype", "drafter_dtype", "target_backend", "drafter_backend", "device"):
        if getattr(args, name) is not None:
            cmd += ["--" + name.replace("_", "-"), getattr(args, name)]
    # every request comes from one address: the per-client queue limit must not turn it away
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_ID,
            "--log-level", "warning", "--max-queue", str(max_queue),
            "--max-queued-per-client", str(max_queue)]
    return cmd + list(config.args)  # last: a configuration may override any of the above


def llama_server_command(args, port: int, label: str = LLAMA_SERVER) -> list[str]:
    """The plain server ``label`` (`PLAIN_SERVERS`: llama.cpp's or ik_llama.cpp's) for
    ``--llama-server`` / ``--ik-llama-server``: the target's GGUF, a slot per client of the
    highest level, each with the context window of one anydraft llama.cpp session."""
    from ..errors import AnydraftError
    from ..models.llamacpp import _threads, requested_context
    from ..models.loading import resolve
    from . import llama_server

    source = resolve(args.target)
    if source.gguf_file is None:
        raise AnydraftError(f"--{label} needs a GGUF target ({args.target!r} is not one)")
    flavor = llama_server.FLAVORS[label]
    server = llama_server.LlamaServer(str(Path(source.path) / source.gguf_file), _threads(),
                                      requested_context(), parallel=max(parse_concurrency(args.concurrency)),
                                      binary=llama_server.find_or_build(flavor=flavor), port=port,
                                      flavor=flavor)
    return server.command


# -- one server -----------------------------------------------------------------------------
class ServerProcess:
    """`anydraft serve` in a subprocess, its output in ``log_path``."""

    def __init__(self, cmd: list[str], log_path: Path, **env_vars: str):
        import subprocess

        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **env_vars)
        env.pop("ANYDRAFT_API_KEY", None)  # the clients send no key
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def wait_ready(self, base: str, timeout: float, label: str) -> dict:
        """Wait until the server answers /health; its answer."""
        import time

        import httpx

        from ..errors import AnydraftError

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AnydraftError(self.failure(f"exited with status {self.proc.returncode}", label))
            try:
                answer = httpx.get(f"{base}/health", timeout=2)
                if answer.status_code == 200:
                    return answer.json()
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise AnydraftError(self.failure(f"did not answer /health within {timeout:g} s "
                                         "(--startup-timeout)", label))

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def failure(self, what: str, label: str) -> str:
        """The error line of the log first (argparse's or anydraft's), then the log's tail."""
        lines = self.log().splitlines()
        errors = [line for line in lines if ": error: " in line]
        tail = "\n".join("  " + line for line in lines[-LOG_TAIL:]) or "  (empty)"
        return (f"the server for configuration {label!r} {what}"
                + (f": {errors[-1].strip()}" if errors else "")
                + f"\nlast lines of {self.log_path}:\n{tail}")

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self._log.close()


# -- the clients ----------------------------------------------------------------------------
def request_body(prompt: str, args, seed: int) -> dict:
    # cache_prompt: the plain servers (llama.cpp's, ik_llama.cpp's, which has no flag for it)
    # read every prompt, as anydraft does; anydraft's server ignores the field
    body = {"model": MODEL_ID, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True},
            "cache_prompt": False}
    if args.completions:
        return body | {"prompt": prompt}
    return body | {"messages": [{"role": "user", "content": prompt}]}


# httpx's words for a pooled keep-alive connection that the server had closed before this
# request went out (llama-server closes idle ones): nothing was read, so the request is sent again
STALE_CONNECTION = "RemoteProtocolError: Server disconnected without sending a response"


async def stream_one(client, url: str, body: dict) -> dict:
    """One streaming request (`stream_once`), sent again once on a new connection where the
    pooled one turned out closed (`STALE_CONNECTION`), timed from the first send."""
    row = await stream_once(client, url, body)
    if (row["error"] or "").startswith(STALE_CONNECTION):
        retry = await stream_once(client, url, body)
        row = {**retry, "sent": row["sent"], "latency": retry["sent"] + retry["latency"] - row["sent"],
               "ttft": None if retry["ttft"] is None else retry["sent"] + retry["ttft"] - row["sent"]}
    return row


async def stream_once(client, url: str, body: dict) -> dict:
    """One streaming request, timed from the send. Content chunks are those with text: the
    chat stream's first chunk (the role alone) and the final one (finish_reason) carry none."""
    import time

    chat = "messages" in body
    t0 = time.perf_counter()
    first = last = None
    gaps, usage, stats, error, finish = [], None, None, None, None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                try:
                    text = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                error = f"HTTP {resp.status_code}: {text}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    obj = json.loads(line[6:])
                    if "error" in obj:
                        error = obj["error"].get("message", str(obj["error"]))
                        break
                    usage = obj.get("usage") or usage
                    stats = obj.get("anydraft") or stats
                    for choice in obj.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        finish = choice.get("finish_reason") or finish
                        if piece:
                            now = time.perf_counter()
                            if first is None:
                                first = now
                            else:
                                gaps.append(now - last)
                            last = now
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else None
    if error is None and usage is None:
        error = "the stream ended without usage"
    ttft = first - t0 if first is not None else None
    return {
        "sent": t0, "latency": end - t0, "ttft": ttft, "itl": gaps,
        "tpot": (end - first) / (tokens - 1) if first is not None and tokens and tokens > 1 else None,
        "completion_tokens": tokens, "prompt_tokens": usage["prompt_tokens"] if usage else None,
        "chunks": len(gaps) + (first is not None), "finish_reason": finish,
        "target_calls": (stats or {}).get("target_calls"), "error": error,
    }


async def run_level(base: str, bodies: list[dict], concurrency: int, rate: float | None,
                    seed: int, on_done) -> tuple[list[dict], float]:
    """Every body once, at most ``concurrency`` in flight: closed loop (all arrive at once,
    so each client sends its next request as its last one ends), or Poisson arrivals at
    ``rate``/s. Returns the rows (``start`` relative to the level's start) and the seconds
    from the level's start to its last answer."""
    import asyncio
    import random
    import time

    import httpx

    url = base + ("/v1/chat/completions" if "messages" in bodies[0] else "/v1/completions")
    arrivals, t = [], 0.0
    rng = random.Random(seed)
    for _ in bodies:
        arrivals.append(t)
        if rate:
            t += rng.expovariate(rate)
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=limits) as client:
        start = time.perf_counter()

        async def one(i: int, body: dict) -> dict:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            async with gate:
                row = await stream_one(client, url, body)
            row["start"] = row.pop("sent") - start
            on_done(row)
            return row

        rows = await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        wall = max(r["start"] + r["latency"] for r in rows)
    return list(rows), wall


# -- numbers --------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile, linearly interpolated; None for no values."""
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def aggregate(rows: list[dict], wall: float) -> dict:
    """One (configuration, concurrency) level. ITL pools every gap of every request."""
    ok = [r for r in rows if r["error"] is None]
    tokens = sum(r["completion_tokens"] for r in ok)
    calls = [r["target_calls"] for r in ok if r["target_calls"]]
    out = {"requests": len(rows), "errors": len(rows) - len(ok), "completion_tokens": tokens,
           "seconds": wall, "throughput": tokens / wall if wall > 0 else None,
           "requests_per_s": len(ok) / wall if wall > 0 else None,
           "tokens_per_target_call": tokens / sum(calls) if len(calls) == len(ok) and calls else None}
    for name, values in (("ttft", [r["ttft"] for r in ok if r["ttft"] is not None]),
                         ("itl", [g for r in ok for g in r["itl"]]),
                         ("tpot", [r["tpot"] for r in ok if r["tpot"] is not None])):
        out[f"{name}_p50"], out[f"{name}_p99"] = percentile(values, 50), percentile(values, 99)
    return out


def full_batch(rows: list[dict], batch: int) -> tuple[float | None, float]:
    """``(tokens/s, seconds)`` while at least ``batch`` requests were decoding at once (each
    from its first token to its end; the tokens after its first spread evenly over that
    time): the rate of a server that load keeps full, which is what the cost curve bounds
    (`batch_gain`). A closed-loop level also ramps up (every prompt read at once) and drains
    (the last requests decode with fewer rows), and its whole-level rate mixes those in."""
    spans = [(r["start"] + r["ttft"], r["start"] + r["latency"], r["completion_tokens"] - 1)
             for r in rows if r["error"] is None and r["ttft"] is not None and r["latency"] > r["ttft"]]
    points = sorted({t for a, b, _ in spans for t in (a, b)})
    seconds = tokens = 0.0
    for lo, hi in zip(points, points[1:], strict=False):
        live = [(a, b, n) for a, b, n in spans if a <= lo and hi <= b]
        if len(live) >= batch:
            seconds += hi - lo
            tokens += sum(n * (hi - lo) / (b - a) for a, b, n in live)
    return (tokens / seconds if seconds else None), seconds


def add_ratios(levels: list[dict], baseline: str, configs: list[dict]) -> None:
    """``throughput_vs_baseline``: throughput / the baseline's at the same concurrency;
    ``vs_c1``: / the same configuration's at concurrency 1, and ``full_batch_vs_c1`` so for
    the full-batch rate (`full_batch`); ``curve_allows``: what the target's cost curve allows
    that ratio to be (`batch_gain`)."""
    base = {lv["concurrency"]: lv["throughput"] for lv in levels if lv["config"] == baseline}
    alone = {lv["config"]: lv for lv in levels if lv["concurrency"] == 1}
    by_label = {c["label"]: c for c in configs}
    for lv in levels:
        b, tput = base.get(lv["concurrency"]), lv["throughput"]
        one = alone.get(lv["config"], {})
        lv["throughput_vs_baseline"] = tput / b if b and tput is not None else None
        for key, ratio in (("throughput", "vs_c1"), ("full_batch", "full_batch_vs_c1")):
            lv[ratio] = lv[key] / one[key] if one.get(key) and lv.get(key) is not None else None
        config = by_label.get(lv["config"], {})
        lv["curve_allows"] = batch_gain(config.get("cost_curve"), lv["concurrency"],
                                        config.get("max_batch"))


SUMMED = ("requests", "errors", "completion_tokens")  # over rounds; every other number: median


def medians(levels: list[dict]) -> list[dict]:
    """One level per (configuration, concurrency) from its rounds' (`run_configs`): the
    requests, errors and tokens summed, every other number the median of the rounds' (a
    ratio the median of the rounds' ratios, each measured within its round: the machine's
    drift between rounds cancels), ``rounds`` how many, and ``vs_baseline_range`` the
    rounds' lowest and highest throughput ratio."""
    import statistics

    groups: dict = {}
    for lv in levels:
        groups.setdefault((lv["config"], lv["concurrency"]), []).append(lv)
    out = []
    for (config, concurrency), rounds in groups.items():
        level = {"config": config, "concurrency": concurrency, "rounds": len(rounds)}
        for key in rounds[0]:
            if key in level or key == "round":
                continue
            values = [lv[key] for lv in rounds if lv[key] is not None]
            level[key] = (sum(values) if key in SUMMED
                          else statistics.median(values) if values else None)
        ratios = [lv["throughput_vs_baseline"] for lv in rounds if lv["throughput_vs_baseline"]]
        level["vs_baseline_range"] = [min(ratios), max(ratios)] if ratios else None
        out.append(level)
    return out


def batch_gain(curve: dict | None, concurrency: int, max_batch: int | None) -> float | None:
    """Throughput over one request at a time that the target's measured cost curve allows for
    plain decoding at ``concurrency``: B = min(c, max_batch) rows of one token each per call,
    a call costing v(B) = T(B) / T(1) single-token calls, so B / v(B) (issue 21's bound; it
    leaves out prompt reads and everything but the target). None without a curve."""
    if not curve or not max_batch:
        return None
    from .bound import verify_costs

    rows = min(concurrency, max_batch)
    # v(B) = T(B) / T(1) is the cost of verifying B - 1 drafts; a JSON object's keys are strings
    costs = [1.0] + verify_costs({int(m): s for m, s in curve.items()}, rows - 1)
    return rows / costs[rows - 1]


# -- the report -----------------------------------------------------------------------------
def _ms(v) -> str:
    return "–" if v is None else f"{v * 1000:.1f}"


def _times(v) -> str:
    return "–" if v is None else f"{v:.2f}x"


def servers_table(servers: list[dict], repeats: int) -> list[str]:
    """"The servers": each configuration's target path, max batch and target cost curve, one
    row for the rounds whose servers had the same ones."""
    rows = {}  # (config, target path, max batch, curve) -> those rounds
    for c in servers:
        curve = c.get("cost_curve") or {}
        points = ", ".join(f"M={m}: {curve[m] * 1000:.0f}" for m in sorted(curve, key=int)) or "–"
        key = (c["label"], c.get("target_path") or "–", c.get("max_batch") or "–", points)
        rows.setdefault(key, []).append(str(c["round"]))
    lines = ["## The servers", "", "| config | target runs on | max batch | target cost curve, ms to "
             "score M tokens |", "|---|---|---|---|"]
    for (label, path, max_batch, points), rounds in rows.items():
        if repeats > 1:
            label += f" (round{'s' * (len(rounds) > 1)} {', '.join(rounds)})"
        lines.append(f"| {label} | {path} | {max_batch} | {points} |")
    return lines


def write_summary(out: Path, meta: dict, levels: list[dict], plots: list[str],
                  rounds: list[dict] = ()) -> Path:
    """summary.md: ``levels`` (`medians`), and each of the ``rounds`` where there were
    several."""
    s, m = meta["settings"], meta["machine"]
    repeats = s["repeats"]
    mode = (f"Poisson arrivals at {s['rate']:g} requests/s, at most c in flight" if s["rate"]
            else "closed loop: c clients, each sending its next request when its last one ends")
    lines = [
        f"# anydraft bench-serve: {s['target']} <- {s['drafter'] or '(no drafter)'}", "",
        f"- command: `{meta['command']}`",
        f"- machine: {m['platform']}, {m['processor']}, {m['cpu_count']} CPUs, device "
        f"{m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}",
        *(f"- {line}" for line in m.get("hardware", [])),
        f"- versions: anydraft {m['versions']['anydraft']} ({m['git_commit'] or 'no git'}), "
        f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}, "
        f"Python {m['python']}; {m['date']}",
        f"- load: {mode}; {s['requests_per_level'] or 'max(16, 4c)'} requests per level; "
        f"dataset {s['dataset']} "
        f"({s['prompts']} prompts), {'/v1/completions' if s['completions'] else '/v1/chat/completions'}, "
        f"max_tokens {s['max_tokens']}, temperature {s['temperature']}, seed {s['seed']}",
        *([f"- rounds: {repeats}, each running every configuration once, in turn; a level's "
           "requests and errors are summed over them, every other number is the median of the "
           "rounds', and vs is the median of the ratios each round measured (lowest-highest "
           "in brackets)"] if repeats > 1 else []),
        "- configurations (extra `anydraft serve` arguments):",
        *(f"  - {c['label']}: `{shlex.join(c['args']) or '(none)'}`" for c in meta["configs"]),
        "", "## Per configuration and concurrency", "",
    ]
    head = ["config", "c", "requests", "errors", "tok/s", f"vs {s['baseline']}",
            "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "TPOT p50 ms",
            "TPOT p99 ms", "tokens / target call", "vs c=1", "full batch tok/s (s)",
            "full batch vs c=1", "curve allows"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for lv in levels:
        ratio, tpc = lv["throughput_vs_baseline"], lv["tokens_per_target_call"]
        spread = lv.get("vs_baseline_range")
        cells = [lv["config"], str(lv["concurrency"]), str(lv["requests"]),
                 f"**{lv['errors']}**" if lv["errors"] else "0",
                 "–" if lv["throughput"] is None else f"{lv['throughput']:.1f}",
                 _times(ratio) + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and spread[0] != spread[1] else ""),
                 *(_ms(lv[f"{k}_{p}"]) for k in ("ttft", "itl", "tpot") for p in ("p50", "p99")),
                 "–" if tpc is None else f"{tpc:.2f}",
                 _times(lv.get("vs_c1")),
                 "–" if lv.get("full_batch") is None else f"{lv['full_batch']:.1f} ({lv['full_batch_seconds']:.0f})",
                 _times(lv.get("full_batch_vs_c1")), _times(lv.get("curve_allows"))]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if repeats > 1:
        lines += ["## Each round", "", f"| config | c | round | tok/s | vs {s['baseline']} | "
                  "tokens / target call | full batch tok/s (s) |", "|---|---|---|---|---|---|---|"]
        order = {c["label"]: i for i, c in enumerate(meta["configs"])}
        for lv in sorted(rounds, key=lambda lv: (order[lv["config"]], lv["concurrency"], lv["round"])):
            tpc = lv["tokens_per_target_call"]
            lines.append(" | ".join([
                f"| {lv['config']}", str(lv["concurrency"]), str(lv["round"]),
                "–" if lv["throughput"] is None else f"{lv['throughput']:.1f}",
                _times(lv["throughput_vs_baseline"]), "–" if tpc is None else f"{tpc:.2f}",
                "–" if lv.get("full_batch") is None
                else f"{lv['full_batch']:.1f} ({lv['full_batch_seconds']:.0f})"]) + " |")
        lines.append("")
    lines += servers_table(meta["servers"], repeats) + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += [
        "## How to read this", "",
        "- tok/s: completion tokens of the level's successful requests / seconds from its "
        "first request sent to its last answer. vs: that throughput / the baseline "
        "configuration's at the same c.",
        "- TTFT: send -> first chunk with text (queueing and the prompt read included). "
        "ITL: every gap between chunks with text, pooled over the level's requests (a "
        "speculative step streams several tokens in one chunk: a gap is a step). "
        "TPOT: (end - TTFT) / (tokens - 1) per request.",
        "- tokens / target call: completion tokens / the target's forward passes, from the "
        "`anydraft` statistics each stream ends with (1.00 when decoding plainly).",
        "- vs c=1: throughput / the same configuration's at c = 1. full batch: tokens/s while "
        "B = min(c, max_batch) requests were decoding at once (past their first token; each "
        "request's tokens spread evenly over its decoding), and for how many seconds: the rate "
        "the server keeps under that load without end, which the whole level's mixes with its "
        "ramp-up and drain; vs c=1 likewise. curve allows: what the target's measured cost "
        "curve (The servers) allows that to be for plain decoding, B / v(B) with v(B) = "
        "T(B) / T(1), prompt reads left out.",
        "",
    ]
    path = out / "summary.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_plots(out: Path, levels: list[dict]) -> list[str]:
    """Throughput and p99 ITL against concurrency, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    configs = list(dict.fromkeys(lv["config"] for lv in levels))
    for key, scale, ylabel, title, name in (
            ("throughput", 1, "completion tokens / s", "Throughput", "throughput.png"),
            ("itl_p99", 1000, "p99 inter-token latency (ms)", "p99 ITL (per streamed chunk)",
             "itl_p99.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for config in configs:
            pts = [(lv["concurrency"], lv[key] * scale) for lv in levels
                   if lv["config"] == config and lv[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=config)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({lv["concurrency"] for lv in levels}),
                      [str(c) for c in sorted({lv["concurrency"] for lv in levels})])
        ax.set_xlabel("concurrency (clients)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} vs concurrency")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        names.append(name)
    return names


# -- the run --------------------------------------------------------------------------------
def run_configs(args, configs: list[ServeConfig], prompts: list[dict], per_level: dict[int, int],
                out: Path, bar) -> tuple[list[dict], list[dict], list[dict]]:
    """Each configuration's server started, warmed up, driven at each concurrency (the keys
    of ``per_level``, with that many requests) and stopped; ``args.repeats`` rounds of them
    all, in turn, so that a machine's drift falls on every configuration alike. Returns what
    each server ran, one row per request, and one aggregate per (round, configuration,
    concurrency)."""
    import asyncio

    from ..errors import AnydraftError

    servers, requests, levels = [], [], []
    max_queue = max(64, *per_level.values())
    for round_, config in ((n, c) for n in range(1, args.repeats + 1) for c in configs):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        cmd = server_command(args, config, port, max_queue)
        name = config.label if args.repeats == 1 else f"{config.label}-{round_}"
        servers.append({"label": config.label, "round": round_, "args": list(config.args),
                        "server_command": shlex.join(cmd)})
        bar.note(f"[{name}] starting: {shlex.join(cmd[1:])}")
        server = ServerProcess(cmd, out / f"server-{name}.log")
        try:
            health = server.wait_ready(base, args.startup_timeout, config.label)
            servers[-1].update(max_batch=health.get("max_batch"), cost_curve=health.get("cost_curve"),
                               target_path=health.get("target_path"))
            if not args.no_warmup:  # first-request costs (allocations, lazy imports) untimed
                row = asyncio.run(run_level(base, [request_body(prompts[0]["prompt"], args, args.seed)],
                                            1, None, args.seed, lambda r: None))[0][0]
                if row["error"]:
                    raise AnydraftError(server.failure(f"failed its warm-up request ({row['error']})",
                                                       config.label))
            for c in per_level:
                picked = [prompts[i % len(prompts)] for i in range(per_level[c])]
                bodies = [request_body(p["prompt"], args, args.seed + i) for i, p in enumerate(picked)]
                note = f"{name} c={c}"
                rows, wall = asyncio.run(run_level(base, bodies, c, args.rate, args.seed,
                                                   lambda r, note=note: bar.step(note)))
                for i, (p, r) in enumerate(zip(picked, rows, strict=True)):
                    requests.append({"config": config.label, "round": round_, "concurrency": c,
                                     "index": i, "prompt_id": p["id"], **r})
                level = {"config": config.label, "round": round_, "concurrency": c,
                         **aggregate(rows, wall)}
                level["full_batch"], level["full_batch_seconds"] = full_batch(
                    rows, min(c, servers[-1]["max_batch"] or c))
                levels.append(level)
                bad = [r["error"] for r in rows if r["error"]]
                bar.note(f"[{name}] c={c}: {level['throughput'] or 0:.1f} tok/s, p99 ITL "
                         f"{_ms(level['itl_p99'])} ms" + (f"; {len(bad)} failed: {bad[0]}" if bad else ""))
        finally:
            server.stop()
    return servers, requests, levels


# -- the command ----------------------------------------------------------------------------
def cmd_bench_serve(args) -> int:
    import random

    from ..errors import AnydraftError
    from ..models.loading import resolve, resolve_device
    from .datasets import load_dataset
    from .report import machine_info
    from .runner import Progress

    levels_c = parse_concurrency(args.concurrency)
    if args.max_tokens < 1:
        raise AnydraftError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.requests_per_level is not None and args.requests_per_level < 1:
        raise AnydraftError(f"--requests-per-level must be >= 1, got {args.requests_per_level}")
    if args.rate is not None and not args.rate > 0:
        raise AnydraftError(f"--rate must be a positive number of requests/s, got {args.rate}")
    if args.max_batch is not None and args.max_batch < 1:
        raise AnydraftError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.repeats < 1:
        raise AnydraftError(f"--repeats must be >= 1, got {args.repeats}")
    refuse_realtime()
    configs = (parse_configs(args.configs) if args.configs
               else default_configs(args.max_batch or max(levels_c)))
    for label, option in reversed(PLAIN_SERVERS.items()):  # llama-server first, the default baseline
        if getattr(args, option, False):
            if label in {c.label for c in configs}:
                raise AnydraftError(f"--{label} adds configuration {label!r}: give yours another label")
            configs.insert(0, ServeConfig(label, ()))
    baseline = args.baseline or configs[0].label
    if baseline not in {c.label for c in configs}:
        raise AnydraftError(f"--baseline {baseline!r} is none of the configurations: "
                            f"{', '.join(c.label for c in configs)}")
    for spec in filter(None, (args.target, args.drafter)):
        resolve(spec)  # an unknown model fails here, before any server starts
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    prompts = load_dataset(args.dataset, categories, args.n)
    random.Random(args.seed).shuffle(prompts)  # one order, the same for every level and config
    per_level = {c: args.requests_per_level or max(16, 4 * c) for c in levels_c}
    out = Path(args.out or datetime.datetime.now().strftime("bench-serve-%Y%m%d-%H%M%S"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnydraftError(f"cannot create --out directory {out}: {exc}") from exc

    meta = {
        "machine": machine_info(resolve_device(args.device or "auto")),
        "command": command_line(args),
        "settings": {"target": args.target, "drafter": args.drafter, "dataset": args.dataset,
                     "prompts": len(prompts), "concurrency": levels_c, "rate": args.rate,
                     "requests_per_level": args.requests_per_level,  # None: max(16, 4c)
                     "max_tokens": args.max_tokens, "temperature": args.temperature,
                     "seed": args.seed, "completions": args.completions, "baseline": baseline,
                     "warmup": not args.no_warmup, "repeats": args.repeats},
        "configs": [],  # each configuration's first server
        "servers": [],  # every server started, each round's
    }
    bar = Progress(args.repeats * len(configs) * sum(per_level.values()), quiet=args.json)
    bar.note(f"bench-serve: {len(configs)} configuration(s) x concurrency "
             f"{','.join(map(str, levels_c))}"
             + (f" x {args.repeats} rounds" if args.repeats > 1 else "")
             + f", {len(prompts)} prompts -> {out}")
    try:
        meta["servers"], requests, rounds = run_configs(args, configs, prompts, per_level, out, bar)
    finally:
        bar.bar.close()
    meta["configs"] = [server for server in meta["servers"] if server["round"] == 1]
    for n in range(1, args.repeats + 1):  # each round's ratios within that round
        add_ratios([lv for lv in rounds if lv["round"] == n], baseline,
                   [server for server in meta["servers"] if server["round"] == n])
    levels = medians(rounds)
    results = out / "results.json"
    results.write_text(json.dumps({"meta": meta, "levels": levels, "rounds": rounds,
                                   "requests": requests}, indent=2) + "\n", encoding="utf-8")
    plots = [] if args.no_plots else write_plots(out, levels)
    summary = write_summary(out, meta, levels, plots, rounds)
    if args.json:
        print(results.read_text(encoding="utf-8"), end="")
    else:
        print(summary.read_text(encoding="utf-8"))
        bar.note(f"wrote {results}, {summary}" + "".join(f", {out / p}" for p in plots))
    failed = sum(lv["errors"] for lv in levels)
    if failed:
        print(f"anydraft bench-serve: {failed} request(s) failed (see {results})", file=sys.stderr)
        return 1
    return 0

