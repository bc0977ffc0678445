"""Prometheus metrics of one server, in a registry of its own (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """What the engine loop records; `render()` is the /metrics body (Prometheus text format)."""

    def __init__(self, max_num_seqs: int):
        r = self.registry = CollectorRegistry()
        self.running = Gauge("treeflash_requests_running", "Requests in a slot, decoding", registry=r)
        self.waiting = Gauge("treeflash_requests_waiting", "Requests queued or being prefilled", registry=r)
        self.finished = Counter("treeflash_requests_finished", "Requests ended, by finish reason "
                                "(abort: the client went away or the server shut down)", ["finish_reason"],
                                registry=r)
        self.prompt_tokens = Counter("treeflash_prompt_tokens", "Prompt tokens of the requests that started",
                                     registry=r)
        self.cached_prompt_tokens = Counter(
            "treeflash_prompt_tokens_cached", "Prompt tokens not prefilled: an earlier prompt's prefill had left "
            "their rows in the caches (prefix reuse)", registry=r)
        self.generation_tokens = Counter("treeflash_generation_tokens", "Tokens generated", registry=r)
        self.acceptance_length = Histogram(
            "treeflash_acceptance_length", "Tokens a request got from one round (accepted drafts + 1)",
            buckets=tuple(range(1, 17)) + (24, 32, 48, 64), registry=r)
        self.batch_size = Histogram(
            "treeflash_batch_size", "Requests decoded together in one round",
            buckets=tuple(sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, max_num_seqs})), registry=r)
        self.time_to_first_token = Histogram(
            "treeflash_time_to_first_token_seconds", "From a request's arrival to its first token",
            buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "treeflash_inter_token_latency_seconds",
            "Time between a request's tokens (a round's tokens share its interval equally)",
            buckets=LATENCY_BUCKETS, registry=r)
        self.request_latency = Histogram(
            "treeflash_request_latency_seconds", "From a request's arrival to its end", buckets=LATENCY_BUCKETS,
            registry=r)
        for reason in ("stop", "length", "abort"):
            self.finished.labels(reason)  # present (at 0) before the first request ends

    def render(self) -> bytes:
        return generate_latest(self.registry)
