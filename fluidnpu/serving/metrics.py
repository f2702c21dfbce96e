"""Prometheus metrics of `fluidnpu serve` (prometheus-client, one registry per server), at GET /metrics."""

from __future__ import annotations

from typing import Any


class ServeMetrics:
    """Queue depth, admitted / rejected by reason, device errors, batch sizes, exits taken, latency,
    device busy time and preemptions; the engine updates them, /metrics exposes them."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.queue_depth = Gauge("fluidnpu_queue_depth", "samples admitted and not yet answered", registry=r)
        self.admitted = Counter("fluidnpu_admitted", "samples admitted to the scheduler queue", registry=r)
        self.rejected = Counter("fluidnpu_rejected", "samples rejected, by reason", ["reason"], registry=r)
        self.errors = Counter("fluidnpu_device_errors", "samples answered with a device error", registry=r)
        self.batch = Histogram("fluidnpu_batch_size", "samples per device run", registry=r,
                               buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64))
        self.exits = Counter("fluidnpu_exits", "samples answered, by exit taken", ["exit"], registry=r)
        self.latency = Histogram("fluidnpu_latency_seconds", "admission to exit, per sample", registry=r,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.busy = Counter("fluidnpu_device_busy_seconds", "time the device spent running", registry=r)
        self.preemptions = Gauge("fluidnpu_preemptions", "preemptions by the policy so far", registry=r)

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    @staticmethod
    def parse(text: str) -> dict[str, Any]:
        """Sample values by name (labels joined into the name), for tests and `fluidnpu edge`."""
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, Any] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                                if s.labels else "")
                out[key] = s.value
        return out
