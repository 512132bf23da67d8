"""create_server(): a started gRPC server with its DevicePool and Reaper, for the CLI and tests."""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any, NamedTuple

import grpc

from protos import tracker_pb2_grpc
from tracker.config import TrackerConfig
from tracker.pool import DevicePool
from tracker.reaper import Reaper
from tracker.service import TrackerService
from tracker.store import open_store

_LOG = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


class ServingTracker(NamedTuple):
    """A running tracker; unpacks as (server, port, pool, reaper)."""

    server: Any  # grpc.Server
    port: int
    pool: DevicePool
    reaper: Reaper
    host: str

    @property
    def address(self) -> str:
        """host:port a client on this machine can dial."""
        host = "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host
        return f"{host}:{self.port}"

    def stop(self, grace_s: float = 2.0) -> None:
        """Answer waiting Acquires, stop the reaper, then stop the server within `grace_s`."""
        self.pool.close()
        self.reaper.stop()
        self.server.stop(grace=grace_s).wait(grace_s + 1.0)


def create_server(
    listen: str = "127.0.0.1:0", config: TrackerConfig | None = None
) -> ServingTracker:
    """Bind `listen` (port 0 picks a free one), start serving and start the reaper.

    Raises:
        UnknownStore: config.store names no implementation.
        OSError: `listen` could not be bound.
    """
    config = config or TrackerConfig()
    pool = DevicePool(open_store(config.store), config)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="tracker"),
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            # gRPC sets SO_REUSEPORT by default: a second tracker on a taken port would then bind
            # too and split the pool's state. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ],
    )
    tracker_pb2_grpc.add_TrackerServicer_to_server(TrackerService(pool), server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as error:
        raise OSError(f"cannot listen on {listen}: {error}") from error
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    reaper = Reaper(pool, config.reap_interval_s)
    reaper.start()
    host = listen.rsplit(":", 1)[0]
    _LOG.info("tracker serving on %s:%d (store %s)", host, port, config.store)
    return ServingTracker(server, port, pool, reaper, host)
