"""vLLM's names for the quantities vLLM exports too (server/metrics.py `VLLM`), beside ours."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from anydraft.server.metrics import VLLM, Metrics

STATS = {"prompt_tokens": 7, "new_tokens": 12, "drafts": 3, "drafted": 9, "accepted": 6,
         "accepted_per_position": [3, 2, 1], "target_calls": 5, "seconds": 0.5,
         "acceptance_rate": 6 / 9}


def samples(metrics: Metrics) -> list:
    return [s for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples]


def value(metrics: Metrics, name: str, **labels) -> float:
    return sum(s.value for s in samples(metrics)
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def busy_metrics(replica=None) -> Metrics:
    """Metrics of a server that served one generation, timing every histogram once."""
    m = Metrics(SimpleNamespace(waiting=2, active=1), model="m", replica=replica)
    m.record_generation(STATS, "eos")
    m.generations.labels("cancelled").inc()
    m.latency.labels("/v1/completions").observe(0.3)
    m.latency.labels("/health").observe(0.01)
    m.ttft.observe(0.1)
    m.queue_wait.observe(0.05)
    m.requests.labels("/v1/completions", "200").inc()
    m.errors.labels("invalid_request_error", "").inc()
    return m


def exported() -> dict[str, set[str]]:
    """Every series name a busy server exports, with its label names."""
    series: dict[str, set[str]] = {}
    for s in samples(busy_metrics()):
        series.setdefault(s.name, set()).update(s.labels)
    return series


def test_spec_decode_series_under_vllms_names_count_what_ours_do():
    m = busy_metrics()
    for ours, theirs in [("anydraft_drafts", "vllm:spec_decode_num_drafts"),
                         ("anydraft_drafted_tokens", "vllm:spec_decode_num_draft_tokens"),
                         ("anydraft_accepted_tokens", "vllm:spec_decode_num_accepted_tokens"),
                         ("anydraft_prompt_tokens", "vllm:prompt_tokens"),
                         ("anydraft_completion_tokens", "vllm:generation_tokens")]:
        assert value(m, theirs + "_total", model_name="m", engine="0") == \
            value(m, ours + "_total", model="m") > 0, theirs
    for position, count in enumerate(STATS["accepted_per_position"]):
        assert value(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", model_name="m",
                     position=str(position)) == count
    assert value(m, "vllm:num_requests_waiting", model_name="m") == 2
    assert value(m, "vllm:num_requests_running", model_name="m") == 1


def test_vllm_labels_and_finish_reasons():
    m = busy_metrics(replica="r1")
    vllm = [s for s in samples(m) if s.name.startswith("vllm:")]
    assert vllm and all(s.labels["model_name"] == "m" and s.labels["engine"] == "r1" for s in vllm)
    assert "model" not in {k for s in vllm for k in s.labels}
    # vLLM's reasons: eos is "stop", a cancelled generation "abort"
    assert value(m, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(m, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(m, "anydraft_generations_total", finish_reason="cancelled") == 1


def test_vllm_latency_times_generation_requests_only():
    m = busy_metrics()
    assert value(m, "anydraft_request_latency_seconds_count") == 2
    assert value(m, "vllm:e2e_request_latency_seconds_count") == 1
    assert value(m, "vllm:e2e_request_latency_seconds_sum") == 0.3
    assert value(m, "vllm:time_to_first_token_seconds_count") == 1
    assert value(m, "vllm:request_queue_time_seconds_count") == 1


def test_every_vllm_name_is_exported():
    names = {s.name for s in samples(busy_metrics())}
    for theirs in VLLM.values():
        assert {theirs, theirs + "_total", theirs + "_count"} & names, theirs
