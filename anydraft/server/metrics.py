"""Prometheus metrics of one server: its own registry, so several apps can live in a process.

Every series carries a ``model`` label (the served model id), as vLLM's do, so dashboards
built for several servers tell them apart. Acceptance is kept as counters (drafts, draft
tokens, accepted tokens, accepted tokens per draft position) so that PromQL can window it:
``rate(anydraft_accepted_tokens_total[5m]) / rate(anydraft_drafted_tokens_total[5m])``.

The quantities vLLM also exports are offered under vLLM's names as well (`VLLM`), with vLLM's
labels (``model_name``, ``engine``), so dashboards built for a vLLM server read this one too.
The Grafana dashboard docs/grafana-dashboard.json graphs anydraft's own names.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

# anydraft's series -> vLLM's name for the same quantity (vllm/v1/metrics/loggers.py and
# vllm/v1/spec_decode/metrics.py); a counter's exported name gains "_total" in both
VLLM = {
    "anydraft_drafts": "vllm:spec_decode_num_drafts",
    "anydraft_drafted_tokens": "vllm:spec_decode_num_draft_tokens",
    "anydraft_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "anydraft_accepted_tokens_per_position": "vllm:spec_decode_num_accepted_tokens_per_pos",
    "anydraft_prompt_tokens": "vllm:prompt_tokens",
    "anydraft_prefix_cache_queries": "vllm:prefix_cache_queries",
    "anydraft_prefix_cache_hits": "vllm:prefix_cache_hits",
    "anydraft_completion_tokens": "vllm:generation_tokens",
    "anydraft_generations": "vllm:request_success",
    "anydraft_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "anydraft_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "anydraft_queue_wait_seconds": "vllm:request_queue_time_seconds",
    "anydraft_queue_waiting": "vllm:num_requests_waiting",
    "anydraft_active_generations": "vllm:num_requests_running",
}
# vLLM's finished_reason values (stop, length, abort) for anydraft's finish reasons; any other
# (cancelled, timeout, error) ended the request early: abort
VLLM_FINISHED = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
# vLLM's e2e latency is per generation request; ours also times /health, /metrics, ...
GENERATION_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class _ForModel:
    """A labelled metric with its ``model`` (and ``replica``) labels already filled in."""

    def __init__(self, metric, fixed: tuple[str, ...]):
        self.metric, self.fixed = metric, fixed

    def labels(self, *values):
        return self.metric.labels(*self.fixed, *values)


class _Tee:
    """One quantity recorded under anydraft's name and under vLLM's: ``inc``, ``observe`` and
    ``labels`` (the server's calls) reach both. ``relabel`` turns anydraft's label values into
    vLLM's child (None: vLLM has no such series for those values)."""

    def __init__(self, ours, theirs, relabel=None):
        self.ours, self.theirs, self.relabel = ours, theirs, relabel

    def inc(self, amount: float = 1) -> None:
        self.ours.inc(amount)
        if self.theirs is not None:
            self.theirs.inc(amount)

    def observe(self, value: float) -> None:
        self.ours.observe(value)
        if self.theirs is not None:
            self.theirs.observe(value)

    def labels(self, *values):
        theirs = self.relabel(*values) if self.relabel else self.theirs.labels(*values)
        return _Tee(self.ours.labels(*values), theirs)


class Metrics:
    def __init__(self, scheduler=None, model: str = "", replica: str | None = None):
        """``replica``: a Ray Serve replica's id, as a ``replica`` label on every series
        (several replicas' series then stay apart wherever they are gathered)."""
        r = self.registry = CollectorRegistry()
        names, fixed = (("model", "replica"), (model, replica)) if replica else (("model",), (model,))

        vllm_names, vllm_fixed = ("model_name", "engine"), (model, replica or "0")

        def metric(kind, name, doc, labels=(), vllm_labels=None, relabel=None, **kw):
            """anydraft's series ``name``; where vLLM has it too (`VLLM`), a `_Tee` that also
            records vLLM's, labelled ``vllm_labels`` (default: ``labels``) and reached through
            ``relabel`` (a function of vLLM's series, its fixed labels filled in, and anydraft's
            label values)."""
            m = kind(name, doc, [*names, *labels], registry=r, **kw)
            ours = _ForModel(m, fixed) if labels else m.labels(*fixed)
            if name not in VLLM:
                return ours
            vllm_labels = labels if vllm_labels is None else vllm_labels
            v = kind(VLLM[name], doc, [*vllm_names, *vllm_labels], registry=r, **kw)
            theirs = _ForModel(v, vllm_fixed) if vllm_labels else v.labels(*vllm_fixed)
            return _Tee(ours, theirs, relabel and (lambda *values: relabel(theirs, *values)))

        self.requests = metric(Counter, "anydraft_requests", "HTTP requests by endpoint and "
                               "status code (499: the client left first)", ["endpoint", "status"])
        self.errors = metric(Counter, "anydraft_errors", "Error responses by OpenAI error type "
                             "and code", ["type", "code"])
        self.generations = metric(
            Counter, "anydraft_generations", "Generations by finish reason (cancelled: the "
            "client went away)", ["finish_reason"], vllm_labels=["finished_reason"],
            relabel=lambda vllm, reason: vllm.labels(VLLM_FINISHED.get(reason, "abort")))
        self.prompt_tokens = metric(Counter, "anydraft_prompt_tokens", "Prompt tokens processed")
        self.prefix_queries = metric(Counter, "anydraft_prefix_cache_queries",
                                     "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = metric(Counter, "anydraft_prefix_cache_hits",
                                  "Prompt tokens the prefix cache held (not read again)")
        self.completion_tokens = metric(Counter, "anydraft_completion_tokens", "Tokens generated")
        self.drafts = metric(Counter, "anydraft_drafts", "Steps that offered draft tokens to the target")
        self.drafted = metric(Counter, "anydraft_drafted_tokens", "Draft tokens offered to the target")
        self.accepted = metric(Counter, "anydraft_accepted_tokens", "Draft tokens the target accepted")
        self.accepted_per_position = metric(
            Counter, "anydraft_accepted_tokens_per_position",
            "Drafts whose token at this position (0-based) the target accepted", ["position"])
        self.target_calls = metric(Counter, "anydraft_target_calls", "Target forward passes")
        self.acceptance_rate = metric(Gauge, "anydraft_acceptance_rate",
                                      "Accepted / drafted tokens since start (0 without drafts)")
        self.mean_accepted = metric(Gauge, "anydraft_mean_accepted_tokens",
                                    "Tokens committed per target forward pass since start")
        self.request_acceptance = metric(Histogram, "anydraft_request_acceptance_rate",
                                         "Per-request acceptance rate (requests with drafts)",
                                         buckets=RATE_BUCKETS)
        self.latency = metric(Histogram, "anydraft_request_latency_seconds",
                              "Time from request arrival to the end of the response",
                              ["endpoint"], buckets=LATENCY_BUCKETS, vllm_labels=[],
                              relabel=lambda vllm, endpoint:
                                  vllm if endpoint in GENERATION_ENDPOINTS else None)
        self.ttft = metric(Histogram, "anydraft_time_to_first_token_seconds",
                           "Time from request arrival to the first text delta",
                           buckets=LATENCY_BUCKETS)
        self.queue_wait = metric(Histogram, "anydraft_queue_wait_seconds",
                                 "Time a request waited for a worker", buckets=LATENCY_BUCKETS)
        self.generation_seconds = metric(Histogram, "anydraft_generation_seconds",
                                         "Decoding time of one generation", buckets=LATENCY_BUCKETS)
        if scheduler is not None:
            for name, doc, value in (
                    ("anydraft_queue_waiting", "Requests waiting for a worker",
                     lambda: scheduler.waiting),
                    ("anydraft_active_generations", "Generations running now",
                     lambda: scheduler.active)):
                gauge = metric(Gauge, name, doc)
                gauge.ours.set_function(value)
                gauge.theirs.set_function(value)
        self._lock = threading.Lock()
        self._totals = {"drafted": 0, "accepted": 0, "new_tokens": 0, "target_calls": 0}

    def record_generation(self, stats: dict, finish_reason: str) -> None:
        self.generations.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0))
        self.prefix_queries.inc(stats.get("prompt_tokens", 0))
        self.prefix_hits.inc(stats.get("cached_tokens", 0))
        self.completion_tokens.inc(stats.get("new_tokens", 0))
        self.drafts.inc(stats.get("drafts", 0))
        self.drafted.inc(stats.get("drafted", 0))
        self.accepted.inc(stats.get("accepted", 0))
        for position, count in enumerate(stats.get("accepted_per_position", ())):
            self.accepted_per_position.labels(str(position)).inc(count)
        self.target_calls.inc(stats.get("target_calls", 0))
        self.generation_seconds.observe(stats.get("seconds", 0.0))
        if stats.get("drafted"):
            self.request_acceptance.observe(stats.get("acceptance_rate", 0.0))
        with self._lock:
            t = self._totals
            for key in ("drafted", "accepted", "new_tokens", "target_calls"):
                t[key] += stats.get(key, 0)
            self.acceptance_rate.set(t["accepted"] / t["drafted"] if t["drafted"] else 0.0)
            self.mean_accepted.set(t["new_tokens"] / t["target_calls"] if t["target_calls"] else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
