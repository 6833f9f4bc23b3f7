"""Prometheus metrics of one server: its own registry, so several apps can live in a process.

Every series carries a ``model`` label (the served model id), as vLLM's do, so dashboards
built for several servers tell them apart. Acceptance is kept as counters (drafts, draft
tokens, accepted tokens, accepted tokens per draft position) so that PromQL can window it:
``rate(anydraft_accepted_tokens_total[5m]) / rate(anydraft_drafted_tokens_total[5m])``.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class _ForModel:
    """A labelled metric with its ``model`` (and ``replica``) labels already filled in."""

    def __init__(self, metric, fixed: tuple[str, ...]):
        self.metric, self.fixed = metric, fixed

    def labels(self, *values):
        return self.metric.labels(*self.fixed, *values)


class Metrics:
    def __init__(self, scheduler=None, model: str = "", replica: str | None = None):
        """``replica``: a Ray Serve replica's id, as a ``replica`` label on every series
        (several replicas' series then stay apart wherever they are gathered)."""
        r = self.registry = CollectorRegistry()
        names, fixed = (("model", "replica"), (model, replica)) if replica else (("model",), (model,))

        def metric(kind, name, doc, labels=(), **kw):
            m = kind(name, doc, [*names, *labels], registry=r, **kw)
            return _ForModel(m, fixed) if labels else m.labels(*fixed)

        self.requests = metric(Counter, "anydraft_requests", "HTTP requests by endpoint and "
                               "status code (499: the client left first)", ["endpoint", "status"])
        self.errors = metric(Counter, "anydraft_errors", "Error responses by OpenAI error type "
                             "and code", ["type", "code"])
        self.generations = metric(Counter, "anydraft_generations", "Generations by finish reason "
                                  "(cancelled: the client went away)", ["finish_reason"])
        self.prompt_tokens = metric(Counter, "anydraft_prompt_tokens", "Prompt tokens processed")
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
                              ["endpoint"], buckets=LATENCY_BUCKETS)
        self.ttft = metric(Histogram, "anydraft_time_to_first_token_seconds",
                           "Time from request arrival to the first text delta",
                           buckets=LATENCY_BUCKETS)
        self.queue_wait = metric(Histogram, "anydraft_queue_wait_seconds",
                                 "Time a request waited for a worker", buckets=LATENCY_BUCKETS)
        self.generation_seconds = metric(Histogram, "anydraft_generation_seconds",
                                         "Decoding time of one generation", buckets=LATENCY_BUCKETS)
        if scheduler is not None:
            metric(Gauge, "anydraft_queue_waiting",
                   "Requests waiting for a worker").set_function(lambda: scheduler.waiting)
            metric(Gauge, "anydraft_active_generations",
                   "Generations running now").set_function(lambda: scheduler.active)
        self._lock = threading.Lock()
        self._totals = {"drafted": 0, "accepted": 0, "new_tokens": 0, "target_calls": 0}

    def record_generation(self, stats: dict, finish_reason: str) -> None:
        self.generations.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0))
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
