"""Our own failures (a backend error mid-generation) are 500s with an error id that the log
line of the failure carries too; the request's own mistakes stay 4xx."""

from __future__ import annotations

import json
import logging
import re
import threading

import httpx
import pytest

from tests.server.conftest import chat_body, scrape_total, wait_for

CHAT = "/v1/chat/completions"
ERROR_ID = re.compile(r"err-[0-9a-f]{16}")


def _logged_ids(caplog) -> list[str]:
    return [m for r in caplog.records if r.levelno >= logging.ERROR
            for m in ERROR_ID.findall(r.getMessage())]


def test_backend_failure_is_a_500_with_a_logged_error_id(make_decoder, serve, caplog):
    base = serve([make_decoder(fail_at=3)])  # the third target call fails
    r = httpx.post(base + CHAT, json=chat_body(max_tokens=20), timeout=30)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("server_error", "internal_error")
    error_id = ERROR_ID.search(err["message"]).group()
    assert "decode failed" not in err["message"]  # the details are in the log, not the reply
    assert _logged_ids(caplog) == [error_id]  # one log line for one failure
    assert scrape_total(base, "anydraft_requests_total", endpoint=CHAT, status="500") == 1


def test_backend_failure_while_streaming_sends_a_500_error_event(make_decoder, serve, caplog):
    base = serve([make_decoder(fail_at=3)])
    with httpx.stream("POST", base + CHAT, json=chat_body(max_tokens=20, stream=True),
                      timeout=30) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    err = events[-1]["error"]
    assert (err["type"], err["code"]) == ("server_error", "internal_error")
    assert _logged_ids(caplog) == [ERROR_ID.search(err["message"]).group()]


def test_request_errors_stay_4xx(make_decoder, serve, caplog):
    base = serve([make_decoder()])
    r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "   "}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value"
    assert not _logged_ids(caplog)


def test_a_bug_in_a_handler_is_one_500_and_one_log_line(make_decoder, serve, caplog, monkeypatch):
    from anydraft.server.scheduler import Scheduler

    def broken(self, job):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Scheduler, "submit", broken)
    base = serve([make_decoder()])
    r = httpx.post(base + CHAT, json=chat_body(), timeout=30)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert _logged_ids(caplog) == [ERROR_ID.search(r.json()["error"]["message"]).group()]
    assert len([rec for rec in caplog.records if rec.levelno >= logging.ERROR]) == 1, caplog.text
    assert scrape_total(base, "anydraft_requests_total", endpoint=CHAT, status="500") == 1


def test_the_logged_500_carries_the_cause_and_its_traceback(make_decoder, serve, caplog):
    """Issue 42: the 500's log line had a `DecodingFailed` without its cause, so no traceback."""
    base = serve([make_decoder(fail_at=3)])
    r = httpx.post(base + CHAT, json=chat_body(max_tokens=20), timeout=30)
    assert r.status_code == 500
    [record] = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    exc = record.exc_info[1]
    assert "llama.cpp decode failed" in str(exc) and exc.__traceback__ is not None
    assert "in feed" in caplog.text  # the frame that raised, in the logged traceback


def test_a_row_that_fails_ends_alone_and_the_others_of_its_batch_go_on(make_decoder, serve,
                                                                       monkeypatch):
    """Issue 42: a request whose own step failed (its sampling) failed every request decoding
    beside it in the batch; now it alone gets the 500 error event."""
    from anydraft.sampling import SamplingParams

    probs, beside = SamplingParams.probs, []

    def poisoned(self, logits):
        if self.temperature == 0.5:  # the poisoned request's own distributions
            beside.append(scheduler.active)
            raise RuntimeError("probability tensor contains inf/nan")
        return probs(self, logits)

    monkeypatch.setattr(SamplingParams, "probs", poisoned)
    base = serve([make_decoder()], max_batch=4)
    scheduler = serve.apps[0].state.server.scheduler
    running, results = threading.Event(), {}

    def run(name, **body):
        events = []
        with httpx.stream("POST", base + CHAT, json=chat_body(stream=True, **body), timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 3 and name == 0:
                    running.set()
        results[name] = events

    threads = [threading.Thread(target=run, args=(i,), kwargs={"max_tokens": 300}) for i in range(3)]
    for t in threads:
        t.start()
    assert running.wait(30)
    wait_for(lambda: scheduler.active == 3, what="the three streams to run")
    run("poisoned", temperature=0.5, max_tokens=300)
    for t in threads:
        t.join(60)
    assert beside and beside[0] == 4  # it failed in a step of all four
    assert results["poisoned"][-1] == "[DONE]"
    assert json.loads(results["poisoned"][-2])["error"]["code"] == "internal_error"
    for i in range(3):
        assert results[i][-1] == "[DONE]", results[i][-3:]
        last = json.loads(results[i][-2])
        assert last["choices"][0]["finish_reason"] == "length", last


def test_health_is_degraded_while_a_worker_cannot_make_its_rows(make_decoder, serve):
    """Issue 61: a worker whose batch's rows could not be made (a llama.cpp context that does
    not fit) died, later requests hung, and /health said ok."""
    dec = make_decoder()

    def new_rows(max_rows):
        raise MemoryError("failed to allocate the KV cache")

    dec.new_rows = new_rows
    base = serve([dec], max_batch=2)
    for _ in range(2):  # each request fails; the worker tries again for each
        r = httpx.post(base + CHAT, json=chat_body(), timeout=15)
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error", r.text
    health = httpx.get(base + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert health.json()["faults"] == {
        "anydraft-worker-0": "cannot make its batch's rows: MemoryError: failed to allocate the KV cache"}


@pytest.mark.parametrize("workers", [2, 1])
def test_health_is_degraded_once_a_worker_died(make_decoder, serve, monkeypatch, workers):
    """A worker that dies all the same (a bug in the scheduler) is named in /health; the
    others go on serving (200), and with none left the server answers 503."""
    from anydraft.server.scheduler import Scheduler

    serve_jobs = Scheduler._serve

    def last_one_broken(self, index, decoder):
        if index == workers - 1:
            raise RuntimeError("a bug")
        return serve_jobs(self, index, decoder)

    monkeypatch.setattr(Scheduler, "_serve", last_one_broken)
    base = serve([make_decoder() for _ in range(workers)])
    scheduler = serve.apps[0].state.server.scheduler
    wait_for(lambda: scheduler.faults, what="the worker to die")
    health = httpx.get(base + "/health", timeout=5)
    r = httpx.post(base + CHAT, json=chat_body(), timeout=15)
    assert health.json()["status"] == "degraded"
    assert health.json()["faults"] == {f"anydraft-worker-{workers - 1}": "died: RuntimeError: a bug"}
    if workers > 1:
        assert health.status_code == 200 and r.status_code == 200
    else:
        assert health.status_code == 503 and r.status_code == 503
        assert r.json()["error"]["code"] == "no_workers"
