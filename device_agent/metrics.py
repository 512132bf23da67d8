"""Prometheus metrics of one agent, on its own CollectorRegistry (several agents per process).

Exposed at http://<host>:<metrics-port>/metrics (`kiln-agent --metrics-port P`), every value read
at scrape time from the agent's plain counters (`device_agent.stats`) and its cache, quarantine and
devices, so serving a request costs no more with metrics on than off:

    kiln_agent_info{agent_id,backend,version}    gauge, always 1
    kiln_agent_measurements_total{method,status} counter, finished Measures ("measure") and Runs
                                                 ("run") by result status (OK, CRASH, ...)
    kiln_agent_uploads_total{outcome}            counter, Upload calls: stored, invalid, too_large,
                                                 hash_mismatch, truncated, cancelled, error
    kiln_agent_upload_bytes_total                counter, bytes of the stored uploads
    kiln_agent_cache_bytes                       gauge, artifact cache size (metas counted)
    kiln_agent_cache_artifacts                   gauge, artifacts in the cache
    kiln_agent_quarantined_entries               gauge, entries refused for killing executors
    kiln_agent_executor_restarts_total{reason}   counter, executor children replaced: died,
                                                 timeout, cancelled, malformed
    kiln_agent_devices{state}                    gauge, devices busy (running a job) or idle

This module needs prometheus_client (the `tracker` extra, or `pip install prometheus-client`): the
agent imports it only when asked for metrics (`server.create_server(metrics_port=...)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from device_agent.stats import UPLOAD_OUTCOMES
from protos.metrics_http import MetricsHttp

if TYPE_CHECKING:
    from device_agent.agent import Agent


class _AgentCollector(Collector):
    """Every kiln_agent_* family, read from the agent on each scrape."""

    def __init__(self, agent: Agent, version: str) -> None:
        self._agent = agent
        self._version = version

    def collect(self) -> Iterator[Any]:
        agent = self._agent
        stats = agent.stats.snapshot()
        info = GaugeMetricFamily(
            "kiln_agent_info",
            "This agent's id, backend and version",
            labels=["agent_id", "backend", "version"],
        )
        info.add_metric([agent.agent_id, agent.backend.name, self._version], 1.0)
        yield info
        jobs = CounterMetricFamily(
            "kiln_agent_measurements",
            "Finished Measures and Runs by method and result status",
            labels=["method", "status"],
        )
        for (method, status), count in sorted(stats.jobs.items()):
            jobs.add_metric([method, status], float(count))
        yield jobs
        uploads = CounterMetricFamily(
            "kiln_agent_uploads", "Upload calls by outcome", labels=["outcome"]
        )
        counts = {**dict.fromkeys(UPLOAD_OUTCOMES, 0), **stats.uploads}
        for outcome, count in sorted(counts.items()):
            uploads.add_metric([outcome], float(count))
        yield uploads
        yield CounterMetricFamily(
            "kiln_agent_upload_bytes", "Bytes of the stored uploads", value=stats.upload_bytes
        )
        artifacts, size = agent.cache.usage()
        yield GaugeMetricFamily(
            "kiln_agent_cache_bytes", "Bytes in the artifact cache, metas counted", value=size
        )
        yield GaugeMetricFamily(
            "kiln_agent_cache_artifacts", "Artifacts in the cache", value=artifacts
        )
        yield GaugeMetricFamily(
            "kiln_agent_quarantined_entries",
            "Artifact entries refused for killing their executor too often",
            value=agent.quarantined_entries(),
        )
        restarts = CounterMetricFamily(
            "kiln_agent_executor_restarts",
            "Executor children replaced after a death, a timeout, a cancel or a malformed answer",
            labels=["reason"],
        )
        for reason, count in sorted(stats.executor_restarts.items()):
            restarts.add_metric([reason], float(count))
        yield restarts
        devices = GaugeMetricFamily(
            "kiln_agent_devices", "Devices by state: busy (running a job) or idle", labels=["state"]
        )
        busy = agent.busy_devices()
        devices.add_metric(["busy"], float(busy))
        devices.add_metric(["idle"], float(len(agent.devices) - busy))
        yield devices


class AgentMetrics(MetricsHttp):
    """One agent's metrics registry; `serve()` exposes it over HTTP until `close()`."""

    def __init__(self, agent: Agent, version: str) -> None:
        super().__init__()
        self.registry.register(_AgentCollector(agent, version))
