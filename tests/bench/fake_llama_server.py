#!/usr/bin/env python3
"""A stand-in for llama.cpp's `llama-server` (tests/bench/test_llama_server.py): takes its
command line, answers /health, and /completion with the token ids 1, 2, 3, ... (n_predict of
them) and llama-server's timings; appends each request's body, and its own argv and GLIBC_TUNABLES once, as JSON
lines to $FAKE_LLAMA_SERVER_LOG."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(entry) -> None:
    with open(os.environ["FAKE_LLAMA_SERVER_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log(body)
        n = body["n_predict"]
        self.reply({"tokens": list(range(1, n + 1)), "stop_type": "limit",
                    "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 5.0,
                                "predicted_n": n, "predicted_ms": 2.0 * (n - 1)}})


if __name__ == "__main__":
    args = sys.argv[1:]
    log({"argv": args, "glibc_tunables": os.environ.get("GLIBC_TUNABLES")})
    port = int(args[args.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
