"""Prometheus metrics of one server: its own registry, so several apps can live in a process."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    def __init__(self, scheduler=None):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("anydraft_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("anydraft_errors", "Error responses by OpenAI error type and code",
                              ["type", "code"], registry=r)
        self.generations = Counter("anydraft_generations", "Generations by finish reason "
                                   "(cancelled: the client went away)", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("anydraft_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("anydraft_completion_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("anydraft_drafted_tokens", "Draft tokens offered to the target", registry=r)
        self.accepted = Counter("anydraft_accepted_tokens", "Draft tokens the target accepted", registry=r)
        self.target_calls = Counter("anydraft_target_calls", "Target forward passes", registry=r)
        self.acceptance_rate = Gauge("anydraft_acceptance_rate",
                                     "Accepted / drafted tokens since start (0 without drafts)", registry=r)
        self.mean_accepted = Gauge("anydraft_mean_accepted_tokens",
                                   "Tokens committed per target forward pass since start", registry=r)
        self.request_acceptance = Histogram("anydraft_request_acceptance_rate",
                                            "Per-request acceptance rate (requests with drafts)",
                                            buckets=RATE_BUCKETS, registry=r)
        self.latency = Histogram("anydraft_request_latency_seconds",
                                 "Time from request arrival to the end of the response",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("anydraft_time_to_first_token_seconds",
                              "Time from request arrival to the first text delta",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("anydraft_queue_wait_seconds",
                                    "Time a request waited for a worker", buckets=LATENCY_BUCKETS,
                                    registry=r)
        self.generation_seconds = Histogram("anydraft_generation_seconds",
                                            "Decoding time of one generation",
                                            buckets=LATENCY_BUCKETS, registry=r)
        if scheduler is not None:
            Gauge("anydraft_queue_waiting", "Requests waiting for a worker",
                  registry=r).set_function(lambda: scheduler.waiting)
            Gauge("anydraft_active_generations", "Generations running now",
                  registry=r).set_function(lambda: scheduler.active)
        self._lock = threading.Lock()
        self._totals = {"drafted": 0, "accepted": 0, "new_tokens": 0, "target_calls": 0}

    def record_generation(self, stats: dict, finish_reason: str) -> None:
        self.generations.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0))
        self.completion_tokens.inc(stats.get("new_tokens", 0))
        self.drafted.inc(stats.get("drafted", 0))
        self.accepted.inc(stats.get("accepted", 0))
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
