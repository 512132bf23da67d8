"""A Prometheus registry served at /metrics: what the tracker's and the agent's metrics share.

Imported only by the daemons' metrics modules, which need prometheus_client anyway (the agent's only
with --metrics-port); nothing else in `protos` imports it.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server


class MetricsHttp:
    """Owns `registry` (one per daemon, so several run in one process) and its HTTP endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._http: Any = None
        self._thread: threading.Thread | None = None

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0 = pick a free port); returns the bound port.

        Raises:
            OSError: the address could not be bound.
        """
        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        bound: int = self._http.server_port
        return bound

    def close(self) -> None:
        """Stop the HTTP endpoint, if serving."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
