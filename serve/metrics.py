"""Prometheus metrics of one server (its own registry, so several apps can live in one process).

python -c "from prodip.serve.metrics import ServeMetrics; print(ServeMetrics().render()[0][:80])"
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class ServeMetrics:
    """Counters, gauges and histograms exposed at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "prodip_requests", "HTTP requests by route and status code", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("prodip_prompt_tokens", "prompt tokens prefilled (tokens)", registry=r)
        self.generated_tokens = Counter("prodip_generated_tokens", "tokens generated (tokens)", registry=r)
        self.time_to_first_token = Histogram(
            "prodip_time_to_first_token_seconds",
            "request submit to first generated token (seconds)",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_latency = Histogram(
            "prodip_generation_seconds", "submit to last token (seconds)", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.tokens_per_second = Histogram(
            "prodip_decode_tokens_per_second",
            "per-sequence decode rate after the first token (tokens/s)",
            buckets=_RATE_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            "prodip_decode_batch_rows",
            "sequences decoded together per decode step (rows)",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.queue_depth = Gauge("prodip_queue_depth", "sequences waiting for a batch slot", registry=r)
        self.running = Gauge("prodip_running_sequences", "sequences in the running batch", registry=r)

    def set_queue(self, waiting: int, running: int) -> None:
        """Scheduler callback (engine thread): current waiting and running sequences."""
        self.queue_depth.set(waiting)
        self.running.set(running)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
