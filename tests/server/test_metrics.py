"""/metrics is valid Prometheus text and its counters move."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import chat_body


def scrape(server) -> dict:
    r = httpx.get(server.base + "/metrics", headers=server.headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            samples[key] = s.value
    return samples


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))


def test_metrics_parse_and_move(server):
    before = scrape(server)
    r = httpx.post(server.base + "/v1/chat/completions", json=chat_body(max_tokens=8), timeout=30)
    assert r.status_code == 200
    httpx.post(server.base + "/v1/chat/completions", json=chat_body(temperature=9))
    after = scrape(server)
    chat = "/v1/chat/completions"
    assert total(after, "anydraft_requests_total", endpoint=chat, status="200") == \
        total(before, "anydraft_requests_total", endpoint=chat, status="200") + 1
    assert total(after, "anydraft_requests_total", endpoint=chat, status="400") == \
        total(before, "anydraft_requests_total", endpoint=chat, status="400") + 1
    assert total(after, "anydraft_errors_total", type="invalid_request_error") > \
        total(before, "anydraft_errors_total", type="invalid_request_error")
    new = r.json()["usage"]["completion_tokens"]
    assert total(after, "anydraft_completion_tokens_total") == \
        total(before, "anydraft_completion_tokens_total") + new
    assert total(after, "anydraft_target_calls_total") > total(before, "anydraft_target_calls_total")
    assert total(after, "anydraft_request_latency_seconds_count", endpoint=chat) == \
        total(before, "anydraft_request_latency_seconds_count", endpoint=chat) + 2
    assert total(after, "anydraft_time_to_first_token_seconds_count") > \
        total(before, "anydraft_time_to_first_token_seconds_count")
    # committed tokens per target call (no drafter here: auto copies from the prompt, so >= 1)
    assert total(after, "anydraft_mean_accepted_tokens") == pytest.approx(
        total(after, "anydraft_completion_tokens_total") / total(after, "anydraft_target_calls_total"))
    assert total(after, "anydraft_mean_accepted_tokens") >= 1.0
    for name in ("anydraft_acceptance_rate", "anydraft_queue_waiting",
                 "anydraft_active_generations", "anydraft_queue_wait_seconds_bucket"):
        assert any(n == name for n, _ in after), name


def test_acceptance_metrics_with_a_drafter(small_server):
    r = httpx.post(small_server.base + "/v1/completions", headers=small_server.headers,
                   json={"model": "tiny", "prompt": "hello world", "temperature": 0,
                         "max_tokens": 16}, timeout=30)
    assert r.status_code == 200
    after = scrape(small_server)
    assert total(after, "anydraft_drafted_tokens_total") > 0
    assert total(after, "anydraft_acceptance_rate") > 0.5
    assert total(after, "anydraft_mean_accepted_tokens") > 1.0
    # what vLLM users graph: drafts, and accepted tokens per draft position, all counters
    drafts = total(after, "anydraft_drafts_total")
    assert 0 < drafts <= total(after, "anydraft_target_calls_total")
    per_position = {dict(ls)["position"]: v for (n, ls), v in after.items()
                    if n == "anydraft_accepted_tokens_per_position_total"}
    assert sum(per_position.values()) == total(after, "anydraft_accepted_tokens_total")
    assert per_position["0"] <= drafts and per_position["0"] > 0
    ordered = [per_position[str(i)] for i in range(len(per_position))]
    assert ordered == sorted(ordered, reverse=True)  # position i+1 needs position i accepted
    assert total(after, "anydraft_drafted_tokens_total") >= drafts
    # the same counts under vLLM's names (server/metrics.py VLLM), for dashboards built for vLLM
    for ours, theirs in [("anydraft_drafts_total", "vllm:spec_decode_num_drafts_total"),
                         ("anydraft_drafted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
                         ("anydraft_accepted_tokens_total",
                          "vllm:spec_decode_num_accepted_tokens_total")]:
        assert total(after, theirs, model_name="tiny") == total(after, ours) > 0, theirs
    assert total(after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") == \
        per_position["0"]


def test_every_series_has_the_model_label(server):
    httpx.post(server.base + "/v1/chat/completions", json=chat_body(max_tokens=2), timeout=30)
    samples = scrape(server)
    ours = [(n, dict(ls)) for n, ls in samples if n.startswith("anydraft_")]
    assert len(ours) > 20 and all(ls.get("model") == "tiny" for _, ls in ours), ours
