"""A real `anydraft serve` process (uvicorn on 127.0.0.1) over a tiny random model on disk."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import byte_tokenizer, tiny_llama

MODEL_ID = "tiny"
API_KEY = "test-secret"
REPO = Path(__file__).resolve().parents[2]
CONTEXT = 4096  # long enough that a 4000-token generation lasts seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir: Path, log_path: Path, *extra: str, api_key: str | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "anydraft", "serve", "--target", str(model_dir),
               "--served-model-name", MODEL_ID, "--port", str(self.port), "--dtype", "float32",
               "--log-level", "warning", *extra]
        if api_key:
            cmd += ["--api-key", api_key]
        env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        env.pop("ANYDRAFT_API_KEY", None)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    tok = byte_tokenizer()
    tiny_llama(len(tok), max_positions=CONTEXT).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def _servers(model_dir, tmp_path_factory):
    """Both servers start together, so their ~5 s start-ups overlap."""
    logs = tmp_path_factory.mktemp("server-logs")
    # main: two workers sharing the weights; roomy queue
    main = Server(model_dir, logs / "main.log", "--max-concurrency", "2", "--max-queue", "32")
    # small: one worker, one waiting slot, an API key, and a drafter (the same tiny model, so
    # `auto` picks sd and greedy drafts are always accepted; --fixed-k, since adaptive drafting
    # would rightly decode plainly with a drafter as slow as the target)
    small = Server(model_dir, logs / "small.log", "--max-concurrency", "1", "--max-queue", "1",
                   "--drafter", str(model_dir), "--fixed-k", api_key=API_KEY)
    try:
        main.wait_ready()
        small.wait_ready()
        yield main, small
    finally:
        main.stop()
        small.stop()
    for srv in (main, small):  # no request may have crashed anything inside the server
        assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="session")
def server(_servers) -> Server:
    return _servers[0]


@pytest.fixture(scope="session")
def small_server(_servers) -> Server:
    return _servers[1]


@pytest.fixture(scope="session")
def decoder(model_dir):
    """The same model in-process, for reference outputs."""
    from anydraft import Decoder

    return Decoder(target=str(model_dir), dtype="float32")  # as the servers: outputs compare


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def chat_body(content: str = "hello there", **kw) -> dict:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": 12, **kw}
