"""Issue 19, item 9: `anydraft serve` with llama.cpp target and drafter and four workers, under
200 concurrent short requests. Every worker takes sessions from the models' shared spare
contexts at once; a race there answered 500. Every request must get the same greedy answer."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import require_llamacpp, require_model
from tests.server_process import MODEL_ID, Server

REQUESTS = 200


@pytest.mark.real
@pytest.mark.slow
def test_200_concurrent_requests_on_four_llamacpp_workers(tmp_path, monkeypatch):
    require_llamacpp()
    require_model("smollm2-135m")
    monkeypatch.setenv("ANYDRAFT_LLAMACPP_CONTEXT", "512")  # 8 live contexts: keep them small
    monkeypatch.setenv("ANYDRAFT_LLAMACPP_THREADS", "1")  # 4 workers on 2 cores: no spinning
    server = Server("smollm2-135m", tmp_path / "server.log", "--target-backend", "llamacpp",
                    "--drafter", "smollm2-135m", "--drafter-backend", "llamacpp", "--fixed-k",
                    "--max-concurrency", "4",
                    "--max-queue", str(REQUESTS), "--max-queued-per-client", str(REQUESTS),
                    # every client is this one address: the per-address connection cap must admit all
                    "--max-connections-per-client", str(REQUESTS))
    try:
        server.wait_ready()

        def one(i):
            body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hi."}],
                    "temperature": 0, "max_tokens": 2}
            r = httpx.post(f"{server.base}/v1/chat/completions", json=body, timeout=600)
            return r.status_code, r.json()["choices"][0]["message"]["content"] if r.is_success else r.text

        with ThreadPoolExecutor(REQUESTS) as pool:
            answers = list(pool.map(one, range(REQUESTS)))
    finally:
        server.stop()
    assert [status for status, _ in answers] == [200] * REQUESTS, answers[:3]
    assert len({text for _, text in answers}) == 1  # greedy: one answer, whoever served it
    assert "Traceback" not in server.log(), server.log()
