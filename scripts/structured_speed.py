"""Issue 63's speed rows: constrained anydraft against unconstrained anydraft on the same prompts
(what the masks cost), and against llama-server's own `json_schema` on the same GGUF.

Each prompt asks for a JSON object that a schema describes; per prompt and round, in turn:
anydraft (its defaults: `auto`) without a grammar, anydraft with the schema, and llama-server's
`/completion` with the schema (converted to its grammar by llama-server itself), greedy, the
same prompt token ids (the target's chat template), every prompt read whole. Three measures,
medians over prompts x rounds: seconds per answer (what a client waits for the whole object:
llama-server's JSON is pretty-printed, ~40% more tokens for the same content), new tokens over
the request's wall time, and decode rates (tokens after the first over the time after the
prompt read: the masks' cost, free of answer length, since a prompt read weighs more in a
shorter answer).

    python scripts/structured_speed.py --out benchmarks/results/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "year": {"type": "integer"},
        "paradigms": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "creator": {"type": "string"},
        "typed": {"type": "string", "enum": ["static", "dynamic", "gradual"]},
    },
    "required": ["name", "year", "paradigms", "creator", "typed"],
    "additionalProperties": False,
}
SUBJECTS = ["Python", "Rust", "Haskell", "JavaScript", "Go", "C", "Erlang", "Kotlin"]
PROMPT = "Describe the programming language {} as a JSON object with its name, year, paradigms, creator and typing."


def llama_server_json(server, ids: list[int], max_tokens: int) -> tuple[int, float, str, float]:
    """(new tokens, wall seconds, text, decode tokens per second) of llama-server's greedy
    `/completion` under SCHEMA."""
    body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "json_schema": SCHEMA, "stream": False}
    request = urllib.request.Request(f"{server.base}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        answer = json.loads(r.read())
    seconds = time.perf_counter() - start
    timings = answer["timings"]
    decode = (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1000) if timings["predicted_n"] > 1 else 0.0
    return int(timings["predicted_n"]), seconds, answer["content"], decode


def main() -> int:
    from anydraft import Decoder
    from anydraft.bench.llama_server import LlamaServer
    from anydraft.constraints import Grammar
    from anydraft.models.llamacpp import _threads
    from anydraft.models.loading import resolve

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(SUBJECTS))
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    dec = Decoder(args.target, args.drafter, progress=progress)
    grammar = Grammar("json_schema", SCHEMA)
    source = resolve(args.target)
    gguf = os.path.join(source.path, source.gguf_file)
    # warm: the grammar engine's view of the tokenizer is built at the first constrained request
    dec.generate("Say hi as JSON.", 8, grammar=grammar)
    rows = []
    with LlamaServer(gguf, _threads(), 4096, log=args.out / "llama-server.log") as server:
        for round_ in range(args.rounds):
            for subject in SUBJECTS[:args.prompts]:
                prompt = PROMPT.format(subject)
                ids = dec.prompt_ids(prompt)
                row = {"round": round_, "subject": subject}
                for mode in ("free", "schema"):
                    start = time.perf_counter()
                    out = dec.generate(prompt, args.max_tokens, grammar=grammar if mode == "schema" else None)
                    seconds = time.perf_counter() - start
                    after_read = seconds - out.stats["prefill_seconds"]
                    row[mode] = {"tokens": len(out.token_ids), "seconds": round(seconds, 3),
                                 "tok_s": round(len(out.token_ids) / seconds, 2),
                                 "decode_tok_s": round((len(out.token_ids) - 1) / after_read, 2),
                                 "method": out.stats["method"], "accepted": out.stats["accepted"], "text": out.text}
                    if mode == "schema":
                        row[mode]["valid"] = valid(out.text)
                tokens, seconds, text, decode = llama_server_json(server, ids, args.max_tokens)
                row["llama_server_schema"] = {"tokens": tokens, "seconds": round(seconds, 3),
                                              "tok_s": round(tokens / seconds, 2), "decode_tok_s": round(decode, 2),
                                              "text": text, "valid": valid(text)}
                rows.append(row)
                progress(f"{subject} r{round_}: free {row['free']['tok_s']} schema {row['schema']['tok_s']} "
                         f"llama-server+schema {row['llama_server_schema']['tok_s']} tok/s")
        command = server.command
    modes = ("free", "schema", "llama_server_schema")
    med = {m: statistics.median(r[m]["tok_s"] for r in rows) for m in modes}
    decode = {m: statistics.median(r[m]["decode_tok_s"] for r in rows) for m in modes}
    answer = {m: statistics.median(r[m]["seconds"] for r in rows) for m in modes}
    summary = {
        "command": " ".join(sys.argv), "llama_server": command, "target_path": dec.target.path,
        "drafter_path": dec.drafter.path if dec.drafter else None,
        "cpu": cpu_line(), "median_tok_s": med, "median_decode_tok_s": decode, "median_seconds": answer,
        "schema_vs_free": round(med["schema"] / med["free"], 3),
        "schema_vs_free_decode": round(decode["schema"] / decode["free"], 3),
        "schema_vs_llama_server_schema": round(med["schema"] / med["llama_server_schema"], 3),
        "llama_server_seconds_over_schema_seconds": round(answer["llama_server_schema"] / answer["schema"], 3),
        "valid": {m: sum(r[m]["valid"] for r in rows) for m in ("schema", "llama_server_schema")},
        "rows": rows,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# Structured outputs: speed ({summary['cpu']})", "",
             f"Command: `{summary['command']}`; target {summary['target_path']}, drafter {summary['drafter_path']}; "
             f"llama-server: `{' '.join(command)}`.", "",
             "| mode | seconds per answer | tokens per answer | tok/s (wall) | decode tok/s | valid JSON |",
             "|---|---|---|---|---|---|",
             *(f"| {label} | {answer[m]:.2f} | {statistics.median(r[m]['tokens'] for r in rows):.0f} | "
               f"{med[m]:.2f} | {decode[m]:.2f} | "
               f"{'-' if m == 'free' else str(summary['valid'][m]) + '/' + str(len(rows))} |"
               for m, label in zip(modes, ("anydraft, no grammar", "anydraft, json_schema",
                                           "llama-server, json_schema"), strict=True)), "",
             f"anydraft with the schema against without: **{summary['schema_vs_free_decode']:.2f}x** decoding "
             f"(**{summary['schema_vs_free']:.2f}x** wall tok/s, shorter answers); against llama-server with it: "
             f"**{summary['llama_server_seconds_over_schema_seconds']:.2f}x** faster to the whole answer, "
             f"**{summary['schema_vs_llama_server_schema']:.2f}x** its tok/s (medians over {args.prompts} prompts x "
             f"{args.rounds} rounds, {args.max_tokens} tokens at most, greedy)."]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def cpu_line() -> str:
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                           shell=True, capture_output=True, text=True).stdout.strip()
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    return f"{model}, {os.cpu_count()} cores, {platform.machine()}, flags: {flags or 'no AVX-512'}"


if __name__ == "__main__":
    sys.exit(main())
