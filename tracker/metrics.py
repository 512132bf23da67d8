"""Prometheus metrics of one tracker, on its own CollectorRegistry (several trackers per process).

Exposed at http://<host>:<metrics-port>/metrics:

    kiln_tracker_devices{key,state}             gauge, read from the pool at scrape time
    kiln_tracker_queue_depth{key}               gauge, waiting Acquires per requested key
    kiln_tracker_store_up                       gauge, 0 when the last scrape could not read the store
    kiln_tracker_lease_wait_seconds{outcome}    histogram of Acquire waits (granted | no_device)
    kiln_tracker_lease_grants_total             counter
    kiln_tracker_leases_expired_total           counter, leases ended by the reaper
    kiln_tracker_agents_lost_total              counter, agents expired for heartbeat silence
    kiln_tracker_devices_lost_total             counter, devices that went LOST with them
    kiln_tracker_auth_rejections_total{method,code}  counter
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from protos.metrics_http import MetricsHttp
from tracker.model import DeviceState, ExpiryReport
from tracker.pool import DevicePool

_LOG = logging.getLogger(__name__)

_T = TypeVar("_T")
RunOnLoop = Callable[[Coroutine[Any, Any, _T]], _T]
"""Runs a coroutine on the pool's event loop from the scraping thread and returns its result."""

# Acquire waits run from sub-millisecond grants to the queue limit (an hour); buckets span both.
_WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class _PoolCollector(Collector):
    """Devices by key and state and queue depth per key, read from the pool on every scrape."""

    def __init__(self, pool: DevicePool, run: RunOnLoop[Any]) -> None:
        self._pool = pool
        self._run = run

    def collect(self) -> Iterator[Any]:
        devices = GaugeMetricFamily(
            "kiln_tracker_devices", "Registered devices by key and state", labels=["key", "state"]
        )
        queue = GaugeMetricFamily(
            "kiln_tracker_queue_depth", "Waiting Acquire requests per requested key", labels=["key"]
        )
        up = GaugeMetricFamily("kiln_tracker_store_up", "1 when the store answered this scrape")
        try:
            statuses: list[Any] = self._run(self._pool.list_devices())
            depths: dict[str, int] = self._run(self._pool.queue_depths())
        except Exception:
            _LOG.exception("metrics scrape could not read the pool")
            up.add_metric([], 0.0)
            yield up
            return
        counts: dict[tuple[str, str], int] = {}
        for key in {status.spec.key for status in statuses}:
            for state in DeviceState:
                counts[(key, state.value)] = 0
        for status in statuses:
            counts[(status.spec.key, status.state.value)] += 1
        for (key, state_name), count in sorted(counts.items()):
            devices.add_metric([key, state_name], float(count))
        for key, depth in sorted(depths.items()):
            queue.add_metric([key], float(depth))
        up.add_metric([], 1.0)
        yield devices
        yield queue
        yield up


class TrackerMetrics(MetricsHttp):
    """The tracker's counters and histograms; `serve()` exposes them over HTTP."""

    def __init__(self, pool: DevicePool, run: RunOnLoop[Any]) -> None:
        """Count for `pool`; `run` runs its coroutines on its loop (LoopThread.call)."""
        super().__init__()
        self.registry.register(_PoolCollector(pool, run))
        self.lease_wait = Histogram(
            "kiln_tracker_lease_wait_seconds",
            "Time an Acquire waited, by outcome",
            ["outcome"],
            buckets=_WAIT_BUCKETS_S,
            registry=self.registry,
        )
        self.grants = Counter("kiln_tracker_lease_grants", "Leases granted", registry=self.registry)
        self.leases_expired = Counter(
            "kiln_tracker_leases_expired",
            "Leases ended by the reaper (expired, or their agent went silent)",
            registry=self.registry,
        )
        self.agents_lost = Counter(
            "kiln_tracker_agents_lost",
            "Agents expired for heartbeat silence",
            registry=self.registry,
        )
        self.devices_lost = Counter(
            "kiln_tracker_devices_lost",
            "Devices that went LOST with their agent",
            registry=self.registry,
        )
        self.auth_rejections = Counter(
            "kiln_tracker_auth_rejections",
            "Calls rejected for a missing, unknown or wrong-role token",
            ["method", "code"],
            registry=self.registry,
        )

    def observe_acquire(self, wait_s: float, granted: bool) -> None:
        """Record one Acquire's wait and whether it got a lease."""
        self.lease_wait.labels("granted" if granted else "no_device").observe(max(wait_s, 0.0))
        if granted:
            self.grants.inc()

    def observe_expiry(self, report: ExpiryReport) -> None:
        """Count what one reaper sweep ended."""
        if report.ended_leases:
            self.leases_expired.inc(len(report.ended_leases))
        if report.expired_agents:
            self.agents_lost.inc(len(report.expired_agents))
        if report.lost_devices:
            self.devices_lost.inc(len(report.lost_devices))

    def observe_rejection(self, method: str, code: Any) -> None:
        """Count one call the auth interceptor rejected (`code` is a grpc.StatusCode)."""
        self.auth_rejections.labels(method, code.name).inc()
