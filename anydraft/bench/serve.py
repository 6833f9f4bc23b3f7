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

Two workloads. ``single``: each request one user message, every prompt read whole (the plain
servers' prompt cache off), so that prefill and decoding are compared alone. ``multi-turn``:
each client holds its own conversations, a shared system prompt then ``--turns`` user turns,
each turn resending the whole history with the answers streamed back (`converse`), as chat and
agent clients do; the servers' prefix / prompt caches on, and the prompt tokens they held
(`cached_tokens`) recorded per turn (`turn_stats`).
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
TTFT, ITL and TPOT), summary.md and PNG plots to --out. Exit status 1 when a request failed.
--workload multi-turn: conversations of --turns turns resending their history, measuring TTFT
of the later turns and the servers' prefix-cache hit rate."""

MODEL_ID = "bench"  # the name each server serves its target under
LOG_TAIL = 30  # lines of a server's log shown when it fails

SINGLE, MULTI_TURN = "single", "multi-turn"  # --workload
DEFAULT_TURNS = 4

# multi-turn: every conversation's first message, the same for all (as an application's own
# instructions are), a few hundred tokens, so that a cache holding it shows at turn 1 as well
SYSTEM_PROMPT = """You are a careful, friendly assistant for software developers and \
technical writers. Follow these instructions in every answer.

1. Answer the question that was asked. If it is ambiguous, state the reading you chose in \
one sentence and answer that reading; do not ask clarifying questions unless answering \
would be impossible without them.
2. Be concise. Lead with the answer, then the reasoning. Prefer short paragraphs and \
numbered steps over long prose. Do not repeat the question back.
3. For code: write complete, runnable examples in the language the user used, with the \
imports they need. Follow the language's common style guide. Name things for what they \
are. Add a comment only where the reason for a line is not obvious from the line itself. \
Mention the time and memory complexity of an algorithm when it matters.
4. For mathematics and reasoning: show the steps that a reader needs to check the result, \
and give the final result on its own line. Check units and edge cases.
5. For writing tasks: match the requested tone, length and format exactly. When asked to \
rewrite, keep the meaning and change only what was asked.
6. When you are not sure of a fact, say so plainly instead of guessing, and say how the \
user could check it. Never invent references, function names or command-line options.
7. Keep earlier turns of the conversation in mind: when the user refers to "it", "the \
second point" or "the example", resolve it against your previous answers.
8. Do not include greetings, apologies or closing offers of further help. Use Markdown \
for lists and code blocks only."""

# multi-turn: the user's later turns where the dataset row has none of its own; generic enough
# to follow any answer
FOLLOW_UPS = ("Make it shorter.", "Now explain the second point in more detail.",
              "Give one more example.", "Summarize your answer in three bullet points.")
WARMUP_MESSAGE = "Say hello in one sentence."  # multi-turn's warm-up turn, in no dataset


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
    b.add_argument("--workload", choices=(SINGLE, MULTI_TURN), default=SINGLE,
                   help="single (default): each request one user message, read whole (the plain "
                        "servers' prompt cache off); multi-turn: each client holds its own "
                        "conversations, a shared system prompt then --turns user turns, each "
                        "resending the whole history with the streamed answers (prefix / prompt "
                        "caches on); reports TTFT of turns >= 2 and the cache hit rate")
    b.add_argument("--turns", type=int, default=None, metavar="T",
                   help=f"user turns of each multi-turn conversation (default {DEFAULT_TURNS}): "
                        "the dataset row's own (Spec-Bench's multi-turn rows have two), then "
                        "generic follow-ups")
    b.add_argument("--concurrency", default="1,2,4,8",
                   help="comma list of client counts, one level each (default 1,2,4,8)")
    b.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals at R requests/s instead of a closed loop; "
                        "--concurrency then caps the requests in flight")
    b.add_argument("--requests-per-level", type=int, default=None, metavar="N",
                   help="requests per (configuration, concurrency) (default: 4 x concurrency, "
                        "at least 16); multi-turn: ceil(N / (turns x c)) conversations per client")
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
    highest level, each with the context window of one anydraft llama.cpp session; for the
    multi-turn workload with its prompt cache on (`with_prompt_cache`)."""
    from ..errors import AnydraftError
    from ..models.llamacpp import _threads, requested_context
    from ..models.loading import resolve
    from . import llama_server

    source = resolve(args.target)
    if source.gguf_file is None:
        raise AnydraftError(f"--{label} needs a GGUF target ({args.target!r} is not one)")
    flavor = llama_server.FLAVORS[label]
    binary = llama_server.find_or_build(flavor=flavor)
    if getattr(args, "workload", SINGLE) == MULTI_TURN:
        flavor = with_prompt_cache(flavor)
    server = llama_server.LlamaServer(str(Path(source.path) / source.gguf_file), _threads(),
                                      requested_context(), parallel=max(parse_concurrency(args.concurrency)),
                                      binary=binary, port=port, flavor=flavor)
    return server.command


def with_prompt_cache(flavor):
    """``flavor`` (a `llama_server.Flavor`) run as its users run it, prompt cache on (its
    default): without the ``--no-cache-prompt`` that the single workload gives it, so that a
    conversation's earlier turns stay in its slot, as anydraft's prefix cache keeps them."""
    import dataclasses

    return dataclasses.replace(flavor, flags=tuple(f for f in flavor.flags if f != "--no-cache-prompt"))


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
def request_body(prompt: str | list[dict], args, seed: int, cache_prompt: bool = False) -> dict:
    """A streamed request of ``prompt``: a text (one user message, or the raw prompt with
    ``--completions``) or a chat's messages."""
    # cache_prompt: off (single), the plain servers (llama.cpp's, ik_llama.cpp's, which has no
    # flag for it) read every prompt, as anydraft does without its prefix cache; on (multi-turn),
    # explicitly, as ik_llama.cpp's default may be off. anydraft's server ignores the field
    body = {"model": MODEL_ID, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "seed": seed, "stream": True, "stream_options": {"include_usage": True},
            "cache_prompt": cache_prompt}
    if isinstance(prompt, list):
        return body | {"messages": prompt}
    if args.completions:
        return body | {"prompt": prompt}
    return body | {"messages": [{"role": "user", "content": prompt}]}


def cached_tokens(usage: dict | None, timings: dict | None) -> int | None:
    """The prompt tokens a server's cache held for a request, as it reports them: OpenAI's
    ``usage.prompt_tokens_details.cached_tokens`` (anydraft's server, llama-server's recent
    ones), else llama-server's ``timings.cache_n``; None where it reports neither."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    if (timings or {}).get("cache_n") is not None:
        return int(timings["cache_n"])
    return None


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
    chat stream's first chunk (the role alone) and the final one (finish_reason) carry none.
    ``text`` is the answer streamed back (a conversation's next turn sends it)."""
    import time

    chat = "messages" in body
    t0 = time.perf_counter()
    first = last = None
    gaps, pieces, usage, stats, timings, error, finish = [], [], None, None, None, None, None
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
                    timings = obj.get("timings") or timings  # llama-server's, on its last chunk
                    for choice in obj.get("choices", []):
                        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        finish = choice.get("finish_reason") or finish
                        if piece:
                            pieces.append(piece)
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
        "cached_tokens": cached_tokens(usage, timings),
        "chunks": len(gaps) + (first is not None), "finish_reason": finish,
        "target_calls": (stats or {}).get("target_calls"), "error": error, "text": "".join(pieces),
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
            del row["text"]  # the answers are not kept
            row["start"] = row.pop("sent") - start
            on_done(row)
            return row

        rows = await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        wall = max(r["start"] + r["latency"] for r in rows)
    return list(rows), wall


# -- multi-turn conversations ---------------------------------------------------------------
def conversation_rows(prompts: list[dict]) -> list[dict]:
    """The dataset rows conversations start from: those with turns of their own beyond the
    first (Spec-Bench's multi-turn rows) where there are any, else every row."""
    several = [p for p in prompts if len(p.get("turns", ())) > 1]
    return several or prompts


def user_turns(row: dict, turns: int) -> list[str]:
    """A conversation's ``turns`` user messages: the row's own (``turns``, else its prompt),
    then `FOLLOW_UPS` in order, as many as needed."""
    own = list(row.get("turns") or [row["prompt"]])[:turns]
    return own + [FOLLOW_UPS[i % len(FOLLOW_UPS)] for i in range(turns - len(own))]


def plan_conversations(rows: list[dict], levels: dict[int, int], turns: int) -> dict[int, list[dict]]:
    """Each concurrency c's conversations ({id, turns}) for ``levels[c]`` requests: c clients
    with ceil(requests / (turns x c)) conversations each (at least one). The levels take rows
    one after another (wrapping round only when there are too few), so that a later level's
    conversations are new to a server that kept an earlier level's; every configuration gets
    the same plan."""
    plan, start = {}, 0
    for c, requests in levels.items():
        count = c * max(1, -(-requests // (turns * c)))
        plan[c] = [{"id": rows[i % len(rows)]["id"], "turns": user_turns(rows[i % len(rows)], turns)}
                   for i in range(start, start + count)]
        start += count
    return plan


async def converse(send, user: list[str], system: str = SYSTEM_PROMPT) -> list[dict]:
    """One conversation: turn t (from 1) sends the whole history, ``system``, every earlier
    user turn and answer, then ``user[t - 1]``, as ``await send(messages, t)`` (a
    `stream_one` row); its answer's text joins the history. A failed turn ends the conversation
    (the next one has no answer to send). Returns the turns' rows, each with its ``turn``, the
    text dropped."""
    messages = [{"role": "system", "content": system}]
    rows = []
    for turn, text in enumerate(user, start=1):
        messages.append({"role": "user", "content": text})
        row = await send(list(messages), turn)
        answer = row.pop("text", "")
        rows.append({"turn": turn, **row})
        if row["error"] is not None:
            break
        messages.append({"role": "assistant", "content": answer})
    return rows


async def run_conversations(base: str, conversations: list[dict], concurrency: int, body,
                            on_done) -> tuple[list[dict], float]:
    """A closed loop of ``concurrency`` clients, client k holding conversations k, k + c, ...
    one after another (`converse`); ``body(messages, conversation, turn)`` is a turn's request.
    Returns the rows in (conversation, turn) order, each with its ``conversation``, ``client``
    and ``prompt_id``, ``start`` relative to the level's start, and the seconds from the
    level's start to its last answer."""
    import asyncio
    import time

    import httpx

    url = base + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=limits) as client:
        start = time.perf_counter()

        async def send(j: int, messages: list[dict], turn: int) -> dict:
            row = await stream_one(client, url, body(messages, j, turn))
            row["start"] = row.pop("sent") - start
            on_done(row)
            return row

        async def one_client(k: int) -> list[dict]:
            rows = []
            for j in range(k, len(conversations), concurrency):
                done = await converse(lambda m, t, j=j: send(j, m, t), conversations[j]["turns"])
                rows += [{"conversation": j, "client": k, "prompt_id": conversations[j]["id"], **r}
                         for r in done]
            return rows

        clients = await asyncio.gather(*(one_client(k) for k in range(min(concurrency, len(conversations)))))
    rows = sorted((r for rows in clients for r in rows), key=lambda r: (r["conversation"], r["turn"]))
    return rows, max(r["start"] + r["latency"] for r in rows)


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


def turn_stats(rows: list[dict]) -> dict:
    """A multi-turn level's numbers by turn: TTFT p50/p90 over every turn and over the warm
    ones (turn >= 2, whose history a cache can hold), and the cache hit rate: the warm turns'
    cached prompt tokens / their prompt tokens, over the requests whose server reported
    cached tokens (None where none did)."""
    ok = [r for r in rows if r["error"] is None]
    warm = [r for r in ok if r["turn"] >= 2]
    reported = [r for r in warm if r["cached_tokens"] is not None and r["prompt_tokens"] is not None]
    cached, prompt = (sum(r[k] for r in reported) for k in ("cached_tokens", "prompt_tokens"))
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    warm_ttft = [r["ttft"] for r in warm if r["ttft"] is not None]
    return {"conversations": len({r["conversation"] for r in rows}), "warm_requests": len(warm),
            "ttft_p90": percentile(ttft, 90),
            "warm_ttft_p50": percentile(warm_ttft, 50), "warm_ttft_p90": percentile(warm_ttft, 90),
            "warm_cached_tokens": cached if reported else None,
            "warm_prompt_tokens": prompt if reported else None,
            "cache_hit_rate": cached / prompt if reported and prompt else None}


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


# over rounds; every other number: median
SUMMED = ("requests", "errors", "completion_tokens", "conversations", "warm_requests",
          "warm_cached_tokens", "warm_prompt_tokens")


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


def _percent(v) -> str:
    return "–" if v is None else f"{v * 100:.1f}%"


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
    multi = s.get("workload") == MULTI_TURN
    mode = (f"Poisson arrivals at {s['rate']:g} requests/s, at most c in flight" if s["rate"]
            else f"multi-turn, closed loop: c clients, each holding its own conversations one "
                 f"after another, {s['turns']} turns each (a shared system prompt, then each turn "
                 "the whole history and a new user message; the plain servers' prompt cache on)" if multi
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
        f"- load: {mode}; {s['requests_per_level'] or 'max(16, 4c)'} requests per level"
        + (" (rounded up to whole conversations per client)" if multi else "") + "; "
        f"dataset {s['dataset']} "
        f"({s['prompts']} prompts"
        + (f"; conversations start from {s['conversation_prompts']} of them, their own later "
           "turns first, then generic follow-ups" if multi else "")
        + f"), {'/v1/completions' if s['completions'] else '/v1/chat/completions'}, "
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
    if multi:
        lines += multi_turn_table(levels) + [""]
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
        *([] if not multi else [
            "- Multi-turn: conversations: how many the level ran (c clients, each its own, one "
            "after another); TTFT p50/p90: over every turn; warm: over turns >= 2, whose history "
            "(system prompt, earlier turns and answers) a prefix cache can hold. cached / prompt "
            "tokens: of the warm turns, the prompt tokens the server reported its cache held "
            "(`usage.prompt_tokens_details.cached_tokens`, llama-server's `timings.cache_n`) and "
            "all their prompt tokens; hit rate: the first over the second (– where the server "
            "reported none)."]),
        "",
    ]
    path = out / "summary.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def multi_turn_table(levels: list[dict]) -> list[str]:
    """summary.md's multi-turn table: TTFT over every turn and the warm ones, and the prefix
    cache's hits (`turn_stats`)."""
    head = ["config", "c", "conversations", "requests", "errors", "tok/s", "TTFT p50 ms",
            "TTFT p90 ms", "warm TTFT p50 ms", "warm TTFT p90 ms", "warm cached / prompt tokens",
            "cache hit rate"]
    lines = ["## Multi-turn: TTFT by turn and the prefix cache", "",
             "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for lv in levels:
        cached, prompt = lv["warm_cached_tokens"], lv["warm_prompt_tokens"]
        cells = [lv["config"], str(lv["concurrency"]), str(lv["conversations"]), str(lv["requests"]),
                 f"**{lv['errors']}**" if lv["errors"] else "0",
                 "–" if lv["throughput"] is None else f"{lv['throughput']:.1f}",
                 *(_ms(lv[k]) for k in ("ttft_p50", "ttft_p90", "warm_ttft_p50", "warm_ttft_p90")),
                 "–" if cached is None else f"{cached} / {prompt}", _percent(lv["cache_hit_rate"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_plots(out: Path, levels: list[dict]) -> list[str]:
    """Throughput and p99 ITL against concurrency, one line per configuration; multi-turn:
    the warm turns' p50 TTFT and the cache hit rate too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    configs = list(dict.fromkeys(lv["config"] for lv in levels))
    plots = [("throughput", 1, "completion tokens / s", "Throughput", "throughput.png"),
             ("itl_p99", 1000, "p99 inter-token latency (ms)", "p99 ITL (per streamed chunk)",
              "itl_p99.png")]
    if any("warm_ttft_p50" in lv for lv in levels):
        plots += [("warm_ttft_p50", 1000, "p50 TTFT of turns >= 2 (ms)", "Warm-turn TTFT",
                   "warm_ttft_p50.png"),
                  ("cache_hit_rate", 100, "warm-turn prompt tokens cached (%)", "Cache hit rate",
                   "cache_hit_rate.png")]
    for key, scale, ylabel, title, name in plots:
        fig, ax = plt.subplots(figsize=(6, 4))
        for config in configs:
            pts = [(lv["concurrency"], lv[key] * scale) for lv in levels
                   if lv["config"] == config and lv.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=config)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({lv["concurrency"] for lv in levels}),
                      [str(c) for c in sorted({lv["concurrency"] for lv in levels})])
        ax.set_xlabel("concurrency (clients)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} vs concurrency")
        ax.set_ylim(bottom=0)
        if ax.lines:  # none where no configuration has the number (a server reporting no cache)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        names.append(name)
    return names


# -- the run --------------------------------------------------------------------------------
def run_configs(args, configs: list[ServeConfig], prompts: list[dict], per_level: dict[int, int],
                out: Path, bar, conversations: dict[int, list[dict]] | None = None
                ) -> tuple[list[dict], list[dict], list[dict]]:
    """Each configuration's server started, warmed up, driven at each concurrency (the keys
    of ``per_level``, with that many requests; multi-turn: ``conversations[c]``, `run_conversations`)
    and stopped; ``args.repeats`` rounds of them all, in turn, so that a machine's drift falls
    on every configuration alike. Returns what each server ran, one row per request, and one
    aggregate per (round, configuration, concurrency)."""
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
                # multi-turn: the system prompt, as a server in use would have read it already
                warmup = (request_body(prompts[0]["prompt"], args, args.seed) if conversations is None
                          else request_body([{"role": "system", "content": SYSTEM_PROMPT},
                                             {"role": "user", "content": WARMUP_MESSAGE}],
                                            args, args.seed, cache_prompt=True))
                row = asyncio.run(run_level(base, [warmup], 1, None, args.seed, lambda r: None))[0][0]
                if row["error"]:
                    raise AnydraftError(server.failure(f"failed its warm-up request ({row['error']})",
                                                       config.label))
            for c in per_level:
                note = f"{name} c={c}"
                if conversations is None:
                    picked = [prompts[i % len(prompts)] for i in range(per_level[c])]
                    bodies = [request_body(p["prompt"], args, args.seed + i) for i, p in enumerate(picked)]
                    rows, wall = asyncio.run(run_level(base, bodies, c, args.rate, args.seed,
                                                       lambda r, note=note: bar.step(note)))
                    rows = [{"prompt_id": p["id"], **r} for p, r in zip(picked, rows, strict=True)]
                else:
                    turns = len(conversations[c][0]["turns"])

                    def body(messages, j, turn, turns=turns):
                        return request_body(messages, args, args.seed + j * turns + turn - 1,
                                            cache_prompt=True)

                    rows, wall = asyncio.run(run_conversations(base, conversations[c], c, body,
                                                               lambda r, note=note: bar.step(note)))
                for i, r in enumerate(rows):
                    requests.append({"config": config.label, "round": round_, "concurrency": c,
                                     "index": i, **r})
                level = {"config": config.label, "round": round_, "concurrency": c,
                         **aggregate(rows, wall), **({} if conversations is None else turn_stats(rows))}
                level["full_batch"], level["full_batch_seconds"] = full_batch(
                    rows, min(c, servers[-1]["max_batch"] or c))
                levels.append(level)
                bad = [r["error"] for r in rows if r["error"]]
                warm = ("" if conversations is None else
                        f", warm TTFT p50 {_ms(level['warm_ttft_p50'])} ms, cache hit "
                        f"{_percent(level['cache_hit_rate'])}")
                bar.note(f"[{name}] c={c}: {level['throughput'] or 0:.1f} tok/s, p99 ITL "
                         f"{_ms(level['itl_p99'])} ms{warm}" + (f"; {len(bad)} failed: {bad[0]}" if bad else ""))
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
    multi = args.workload == MULTI_TURN
    if not multi and args.turns is not None:
        raise AnydraftError("--turns is for --workload multi-turn")
    turns = (DEFAULT_TURNS if args.turns is None else args.turns) if multi else None
    if multi and turns < 1:
        raise AnydraftError(f"--turns must be >= 1, got {turns}")
    if multi and args.rate is not None:
        raise AnydraftError("--workload multi-turn runs a closed loop (a conversation's next turn "
                            "waits for its answer): leave out --rate")
    if multi and args.completions:
        raise AnydraftError("--workload multi-turn sends chat messages: leave out --completions")
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
    prompts = load_dataset(args.dataset, categories, args.n, turns=multi)
    random.Random(args.seed).shuffle(prompts)  # one order, the same for every level and config
    per_level = {c: args.requests_per_level or max(16, 4 * c) for c in levels_c}
    conversations = None
    if multi:
        conversations = plan_conversations(conversation_rows(prompts), per_level, turns)
        per_level = {c: len(plan) * turns for c, plan in conversations.items()}
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
                     "warmup": not args.no_warmup, "repeats": args.repeats,
                     "workload": args.workload, "turns": turns,
                     # multi-turn: the rows conversations start from, and the shared system prompt
                     **({"conversation_prompts": len(conversation_rows(prompts)),
                         "system_prompt": SYSTEM_PROMPT} if multi else {})},
        "configs": [],  # each configuration's first server
        "servers": [],  # every server started, each round's
    }
    bar = Progress(args.repeats * len(configs) * sum(per_level.values()), quiet=args.json)
    bar.note(f"bench-serve: {len(configs)} configuration(s) x concurrency "
             f"{','.join(map(str, levels_c))}"
             + (f" x {args.repeats} rounds" if args.repeats > 1 else "")
             + (f", conversations of {turns} turns" if multi else "")
             + f", {len(prompts)} prompts -> {out}")
    if multi and sum(map(len, conversations.values())) > len(conversation_rows(prompts)):
        bar.note(f"note: {sum(map(len, conversations.values()))} conversations from "
                 f"{len(conversation_rows(prompts))} dataset rows: some repeat, and a server may "
                 "still hold a repeated one's turns (use a dataset with more rows, or fewer requests)")
    try:
        meta["servers"], requests, rounds = run_configs(args, configs, prompts, per_level, out, bar,
                                                        conversations)
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

