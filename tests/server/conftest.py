"""Real `anydraft serve` processes (tests/server_process.py) and in-process servers over a tiny
random model on disk."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.helpers import byte_tokenizer, tiny_llama
from tests.server_process import MODEL_ID, Server, free_port

API_KEY = "test-secret"
CONTEXT = 4096  # long enough that a 4000-token generation lasts seconds


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    tok = byte_tokenizer()
    tiny_llama(len(tok), max_positions=CONTEXT).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def _servers(model_dir, tmp_path_factory):
    """The servers start together, so their ~5 s start-ups overlap."""
    logs = tmp_path_factory.mktemp("server-logs")
    # main: two workers sharing the weights; a roomy queue that one client may fill (16 at once)
    main = Server(model_dir, logs / "main.log", "--max-concurrency", "2", "--max-queue", "32",
                  "--max-queued-per-client", "32")
    # small: one worker, one waiting slot, an API key, and a drafter (the same tiny model, so
    # `auto` picks sd and greedy drafts are always accepted; --fixed-k, since adaptive drafting
    # would rightly decode plainly with a drafter as slow as the target)
    small = Server(model_dir, logs / "small.log", "--max-concurrency", "1", "--max-queue", "1",
                   "--max-batch", "1", "--drafter", str(model_dir), "--fixed-k", api_key=API_KEY)
    # batched: one worker running up to 4 generations together (continuous batching), drafting
    batched = Server(model_dir, logs / "batched.log", "--max-concurrency", "1", "--max-batch", "4",
                     "--max-queue", "32", "--max-queued-per-client", "32",
                     "--drafter", str(model_dir), "--fixed-k")
    servers = (main, small, batched)
    try:
        for srv in servers:
            srv.wait_ready()
        yield servers
    finally:
        for srv in servers:
            srv.stop()
    for srv in servers:  # no request may have crashed anything inside the server
        assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="session")
def server(_servers) -> Server:
    return _servers[0]


@pytest.fixture(scope="session")
def small_server(_servers) -> Server:
    return _servers[1]


@pytest.fixture(scope="session")
def batched_server(_servers) -> Server:
    return _servers[2]


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


# -- in-process servers over decoders with slowed or failing sessions -----------------------
class SlowSession:
    """A real session that sleeps ``per_call`` + ``per_token`` per token on every feed (a big
    model on a slow CPU), records what it reads, and can answer only ``force`` (e.g. a special
    token: steps that show no text) or fail on its ``fail_at``-th call (a backend error)."""

    batch = None
    exact = False

    def __init__(self, inner, per_call=0.0, per_token=0.0, force=None, fail_at=None, log=None):
        self.inner, self.per_call, self.per_token = inner, per_call, per_token
        self.force, self.fail_at, self.calls = force, fail_at, 0
        self.fed = [] if log is None else log  # one list of ids per feed call

    def __getattr__(self, name):  # vocab_size, max_length
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def feed(self, ids, rows=None):
        import torch

        from anydraft.errors import AnydraftError

        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise AnydraftError("llama.cpp decode failed (status 1)")
        self.fed.append(list(ids))
        time.sleep(self.per_call + self.per_token * len(ids))
        logits = self.inner.feed(ids, rows)
        if self.force is not None:
            logits = torch.full_like(logits, -30.0)
            logits[:, self.force] = 30.0
        return logits

    def rollback(self, n):
        self.inner.rollback(n)


@pytest.fixture
def make_decoder(decoder):
    """``make_decoder(**SlowSession options)``: a fresh decoder over the shared tiny model."""
    import copy

    from anydraft import Decoder
    from anydraft.models.session import HFSession

    def make(**slow):
        dec = Decoder(target=decoder.target.model, tokenizer=copy.deepcopy(decoder.target.tokenizer),
                      dtype="float32")
        dec.sessions = []
        if slow:
            def new_session():
                dec.sessions.append(SlowSession(HFSession(decoder.target.model), **slow))
                return dec.sessions[-1]
            dec.target.new_session = new_session
        return dec
    return make


@contextmanager
def serve_in_thread(app, **uvicorn_options):
    """Run ``app`` under uvicorn on 127.0.0.1 in a thread; yields the base URL. Logging is
    left to pytest (log_config=None), so caplog sees uvicorn's records too."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                            proxy_headers=False, **uvicorn_options)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(15)


@pytest.fixture
def serve():
    """``serve(decoders, **ServerConfig fields)`` -> base URL of an in-process server."""
    from anydraft.server.app import create_app
    from anydraft.server.config import ServerConfig

    with ExitStack() as stack:
        def start(decoders, uvicorn_options=None, **config):
            app = create_app(decoders, ServerConfig(model_id=MODEL_ID, **config))
            start.apps.append(app)  # tests may watch its scheduler directly
            return stack.enter_context(serve_in_thread(app, **(uvicorn_options or {})))
        start.apps = []
        yield start


def health(base: str) -> dict:
    return httpx.get(base + "/health", timeout=5).json()


def wait_idle(base: str, timeout: float) -> float:
    """Seconds until no generation runs or waits; fails after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        h = health(base)
        if h["active"] == 0 and h["waiting"] == 0:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"server still busy after {timeout} s: {h}")


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def scrape_total(base: str, name: str, headers: dict | None = None, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", headers=headers or {}, timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
