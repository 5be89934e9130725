"""The gateway's metrics: requests by lane, bucket and outcome, the waits it adds, and in flight and queued per engine.

Per request the gateway touches one counter child (looked up once per label
set) and three histograms; in flight and queued are read from the admission
state when Prometheus scrapes, not set as they change.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from guardian.gateway.admission import Admission
from guardian.listener import ListenerMetrics


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, listener: ListenerMetrics | None = None) -> None:
        r = registry
        self.listener = listener or ListenerMetrics(r)  # shared with the API's listener when both are guardian's
        self.requests = Counter("guardian_gateway_requests", "Requests through the gateway, by lane, bucket and outcome.",
                                ["lane", "bucket", "outcome"], registry=r)  # fmt: skip
        self.queue_wait = Histogram("guardian_gateway_queue_wait_seconds", "Time requests waited for admission.",
                                    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30), registry=r)  # fmt: skip
        self.decision = Histogram("guardian_gateway_decision_seconds", "Bucket and lane decision time per request.",
                                  buckets=(5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3), registry=r)  # fmt: skip
        self.upstream = Histogram("guardian_gateway_upstream_seconds", "Time from admission to the end of the answer.",
                                  buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r)  # fmt: skip
        self.registry = r
        self._counts: dict[tuple[str, str, str], Any] = {}  # the requests counter's children: labels() once per set

    def count(self, lane: str, bucket: str, outcome: str) -> None:
        child = self._counts.get((lane, bucket, outcome))
        if child is None:
            child = self._counts[(lane, bucket, outcome)] = self.requests.labels(lane, bucket, outcome)
        child.inc()


class AdmissionGauges:
    """In flight and queued per engine, read from the admission state when scraped: no gauge set per request."""

    def __init__(self, admission: Mapping[str, Admission]) -> None:
        self.admission = admission

    def collect(self) -> Iterable[Metric]:
        in_flight = GaugeMetricFamily("guardian_gateway_in_flight", "Requests admitted and not finished, per engine.", labels=["engine"])
        queued = GaugeMetricFamily("guardian_gateway_queued", "Requests waiting for admission, per engine.", labels=["engine"])
        flood = GaugeMetricFamily("guardian_gateway_long_prompt_flood",
                                  "1 while a flood of long prompts keeps to its share of the engine's time, per engine.",
                                  labels=["engine"])  # fmt: skip
        for name, adm in self.admission.items():
            in_flight.add_metric([name], adm.in_flight)
            queued.add_metric([name], adm.queued)
            flood.add_metric([name], float(adm.flooding))
        return [in_flight, queued, flood]
