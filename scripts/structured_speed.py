"""Issue 63's speed rows: constrained anydraft against unconstrained anydraft on the same prompts
(what the masks cost), against plain constrained decoding (what speculation and the grammar's
forced tokens gain), and against the plain servers' own `json_schema` on the same GGUF
(llama-server and ik_llama.cpp's server, both built on this machine).

Each prompt asks for a JSON object that a schema describes; per prompt and round, in turn:
anydraft (its defaults: `auto`) without a grammar, with the schema, anydraft's plain decoding
(`ar`) with it, and each server's `/completion` with the schema (converted to its grammar by
the server itself), greedy, the same prompt token ids (the target's chat template), every
prompt read whole. Three measures, medians over prompts x rounds: seconds per answer (what a
client waits for the whole object: the servers' grammars let the model pretty-print, more
tokens for the same content), new tokens over the request's wall time, and decode rates
(tokens after the first over the time after the prompt read: free of answer length, since a
prompt read weighs more in a shorter answer).

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
ANYDRAFT_MODES = ("free", "schema", "plain_schema")
MODES = (*ANYDRAFT_MODES, "llama_server_schema", "ik_server_schema")
LABELS = {"free": "anydraft (auto), no grammar", "schema": "anydraft (auto), json_schema",
          "plain_schema": "anydraft ar (plain constrained decoding), json_schema",
          "llama_server_schema": "llama-server, json_schema", "ik_server_schema": "ik_llama.cpp's server, json_schema"}
SUBJECTS = ["Python", "Rust", "Haskell", "JavaScript", "Go", "C", "Erlang", "Kotlin"]
PROMPT = "Describe the programming language {} as a JSON object with its name, year, paradigms, creator and typing."


def server_json(server, ids: list[int], max_tokens: int) -> tuple[int, float, str, float]:
    """(new tokens, wall seconds, text, decode tokens per second) of a llama-server's (llama.cpp's
    or ik_llama.cpp's) greedy `/completion` under SCHEMA."""
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
    from anydraft.bench.llama_server import IK_SERVER, LlamaServer
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
    with (LlamaServer(gguf, _threads(), 4096, log=args.out / "llama-server.log") as server,
          LlamaServer(gguf, _threads(), 4096, log=args.out / "ik-llama-server.log", flavor=IK_SERVER) as ik):
        for round_ in range(args.rounds):
            for subject in SUBJECTS[:args.prompts]:
                prompt = PROMPT.format(subject)
                ids = dec.prompt_ids(prompt)
                row = {"round": round_, "subject": subject}
                for mode in ANYDRAFT_MODES:
                    start = time.perf_counter()
                    out = dec.generate(prompt, args.max_tokens, grammar=None if mode == "free" else grammar,
                                       method="ar" if mode == "plain_schema" else None)
                    seconds = time.perf_counter() - start
                    after_read = seconds - out.stats["prefill_seconds"]
                    row[mode] = {"tokens": len(out.token_ids), "seconds": round(seconds, 3),
                                 "tok_s": round(len(out.token_ids) / seconds, 2),
                                 "decode_tok_s": round((len(out.token_ids) - 1) / after_read, 2),
                                 "method": out.stats["method"], "accepted": out.stats["accepted"], "text": out.text}
                    row[mode]["forced"] = out.stats["forced"]
                    if mode != "free":
                        row[mode]["valid"] = valid(out.text)
                for mode, baseline in (("llama_server_schema", server), ("ik_server_schema", ik)):
                    tokens, seconds, text, decode = server_json(baseline, ids, args.max_tokens)
                    row[mode] = {"tokens": tokens, "seconds": round(seconds, 3),
                                 "tok_s": round(tokens / seconds, 2), "decode_tok_s": round(decode, 2),
                                 "text": text, "valid": valid(text)}
                rows.append(row)
                progress(f"{subject} r{round_}: " + ", ".join(f"{m} {row[m]['tok_s']}" for m in MODES) + " tok/s")
        command, ik_command = server.command, ik.command
    modes = MODES
    med = {m: statistics.median(r[m]["tok_s"] for r in rows) for m in modes}
    decode = {m: statistics.median(r[m]["decode_tok_s"] for r in rows) for m in modes}
    answer = {m: statistics.median(r[m]["seconds"] for r in rows) for m in modes}
    summary = {
        "command": " ".join(sys.argv), "llama_server": command, "ik_server": ik_command,
        "target_path": dec.target.path,
        "drafter_path": dec.drafter.path if dec.drafter else None,
        "cpu": cpu_line(), "median_tok_s": med, "median_decode_tok_s": decode, "median_seconds": answer,
        "schema_vs_free": round(med["schema"] / med["free"], 3),
        "schema_vs_free_decode": round(decode["schema"] / decode["free"], 3),
        "schema_vs_plain_schema": round(med["schema"] / med["plain_schema"], 3),
        "schema_vs_llama_server_schema": round(med["schema"] / med["llama_server_schema"], 3),
        "schema_vs_ik_server_schema": round(med["schema"] / med["ik_server_schema"], 3),
        "llama_server_seconds_over_schema_seconds": round(answer["llama_server_schema"] / answer["schema"], 3),
        "ik_server_seconds_over_schema_seconds": round(answer["ik_server_schema"] / answer["schema"], 3),
        "valid": {m: sum(r[m]["valid"] for r in rows) for m in modes if m != "free"},
        "rows": rows,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# Structured outputs: speed ({summary['cpu']})", "",
             f"Command: `{summary['command']}`; target {summary['target_path']}, drafter {summary['drafter_path']}; "
             f"llama-server: `{' '.join(command)}`; ik_llama.cpp's: `{' '.join(ik_command)}`.", "",
             "| mode | seconds per answer | tokens per answer | tok/s (wall) | decode tok/s | forced tokens | valid JSON |",
             "|---|---|---|---|---|---|---|",
             *(f"| {LABELS[m]} | {answer[m]:.2f} | {statistics.median(r[m]['tokens'] for r in rows):.0f} | "
               f"{med[m]:.2f} | {decode[m]:.2f} | "
               f"{statistics.median(r[m]['forced'] for r in rows) if 'forced' in rows[0][m] else '-'} | "
               f"{'-' if m == 'free' else str(summary['valid'][m]) + '/' + str(len(rows))} |"
               for m in modes), "",
             f"anydraft with the schema against without: **{summary['schema_vs_free_decode']:.2f}x** decoding "
             f"(**{summary['schema_vs_free']:.2f}x** wall tok/s); against plain constrained decoding (ar): "
             f"**{summary['schema_vs_plain_schema']:.2f}x** wall tok/s; against llama-server with the schema: "
             f"**{summary['schema_vs_llama_server_schema']:.2f}x** its tok/s, "
             f"**{summary['llama_server_seconds_over_schema_seconds']:.2f}x** faster to the whole answer; against "
             f"ik_llama.cpp's server: **{summary['schema_vs_ik_server_schema']:.2f}x** its tok/s, "
             f"**{summary['ik_server_seconds_over_schema_seconds']:.2f}x** faster to the whole answer "
             f"(medians over {args.prompts} prompts x {args.rounds} rounds, {args.max_tokens} tokens at most, greedy)."]
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
