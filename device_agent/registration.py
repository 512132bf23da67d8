"""Keeps this agent's devices registered with the tracker.

Register all devices, then Heartbeat every `heartbeat_interval_s` the tracker returned. A heartbeat
answered `known=false` (the tracker restarted or expired us) means register again at once; an
unreachable tracker means register again, forever, with capped exponential backoff and jitter.

A graceful stop ends the thread first (so no heartbeat can register the devices again), then calls
Deregister once, so the tracker removes the devices instead of listing them LOST. A failed
Deregister is one warning: the devices go LOST as after a crash.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import grpc

from protos import tracker_pb2_grpc
from protos.auth import TlsFiles, call_metadata, open_channel

# The retry jitter's own generator: a background thread drawing from the global `random` would
# shift the draws of whoever else uses it in the process (hypothesis flags tests whose strategies
# see the global state move under them).
_JITTER = random.Random()
_LOG = logging.getLogger(__name__)
# Used when the tracker answers a zero interval, and the floor that keeps a bad one from spinning.
_DEFAULT_HEARTBEAT_S = 5.0
_MIN_HEARTBEAT_S = 0.05


class Registrar:
    """A thread that registers and heartbeats until `stop()`.

    Args:
        tracker_address: host:port of the tracker.
        register_request: builds the RegisterRequest (called on every registration).
        heartbeat_request: builds the HeartbeatRequest.
        rpc_timeout_s: deadline of each call to the tracker.
        backoff_initial_s: first wait after a failed registration; doubles up to `backoff_cap_s`.
        token: the pool's `agent` token, sent as bearer metadata on every call (None: no auth).
        tls: how to reach the tracker over TLS (None or empty: plaintext).
        on_fence_floors: called after each registration with the tracker's fence floors
            (device id -> lowest lease fence still valid), so leases the tracker ended while
            this agent was away are refused at once.
        deregister_request: builds the DeregisterRequest `stop()` sends (None: never deregister).
    """

    def __init__(
        self,
        tracker_address: str,
        register_request: Callable[[], object],
        heartbeat_request: Callable[[], object],
        rpc_timeout_s: float,
        backoff_initial_s: float,
        backoff_cap_s: float,
        token: str | None = None,
        tls: TlsFiles | None = None,
        on_fence_floors: Callable[[dict[str, int]], None] | None = None,
        deregister_request: Callable[[], object] | None = None,
    ) -> None:
        self.tracker_address = tracker_address
        self._register_request = register_request
        self._heartbeat_request = heartbeat_request
        self._rpc_timeout_s = rpc_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_cap_s = backoff_cap_s
        self._on_fence_floors = on_fence_floors
        self._deregister_request = deregister_request
        self._stop = threading.Event()
        # gRPC's own reconnect backoff grows to 120 s by default; cap it at ours, so an agent whose
        # tracker was down a long while registers within backoff_cap_s of it coming back.
        backoff_ms = int(backoff_initial_s * 1000)
        self._metadata = call_metadata(token)
        self._channel = open_channel(
            tracker_address,
            tls,
            options=[
                ("grpc.initial_reconnect_backoff_ms", backoff_ms),
                ("grpc.min_reconnect_backoff_ms", backoff_ms),
                ("grpc.max_reconnect_backoff_ms", int(backoff_cap_s * 1000)),
            ],
        )
        self._stub = tracker_pb2_grpc.TrackerStub(self._channel)
        self._thread = threading.Thread(target=self._loop, name="kiln-registrar", daemon=True)
        self.registered = threading.Event()  # set after the first successful registration

    def start(self) -> None:
        """Start registering in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating, join the thread, then deregister once (when built to).

        The join waits for a call in flight (one RPC deadline); Deregister has a deadline of its
        own, and when it fails the stop goes on after one warning. Idempotent.
        """
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._rpc_timeout_s + 1.0)
            if self._thread.is_alive():
                _LOG.warning("the registration thread did not end within its deadline")
        try:
            if self._deregister_request is not None:
                self._deregister(self._deregister_request())
        finally:
            self._channel.close()

    def _deregister(self, request: object) -> None:
        try:
            reply = self._stub.Deregister(
                request, timeout=self._rpc_timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as e:
            _LOG.warning(
                "could not deregister from tracker %s (%s); its devices will show LOST",
                self.tracker_address,
                e.code() if hasattr(e, "code") else e,
            )
            return
        _LOG.info("deregistered %d device(s) from tracker %s", reply.removed, self.tracker_address)

    def _loop(self) -> None:
        backoff_s = self._backoff_initial_s
        while not self._stop.is_set():
            try:
                interval_s = self._register()
                backoff_s = self._backoff_initial_s
                while not self._stop.wait(interval_s):
                    reply = self._stub.Heartbeat(
                        self._heartbeat_request(),
                        timeout=self._rpc_timeout_s,
                        metadata=self._metadata,
                    )
                    if not reply.known:
                        _LOG.warning(
                            "tracker %s forgot this agent; registering again", self.tracker_address
                        )
                        break
            except grpc.RpcError as e:
                delay_s = backoff_s * _JITTER.uniform(0.5, 1.0)
                _LOG.warning(
                    "tracker %s unreachable (%s); registering again in %.2f s",
                    self.tracker_address,
                    e.code() if hasattr(e, "code") else e,
                    delay_s,
                )
                self._stop.wait(delay_s)
                backoff_s = min(backoff_s * 2, self._backoff_cap_s)

    def _register(self) -> float:
        reply = self._stub.Register(
            self._register_request(), timeout=self._rpc_timeout_s, metadata=self._metadata
        )
        interval_s = reply.heartbeat_interval_s or _DEFAULT_HEARTBEAT_S
        if self._on_fence_floors is not None and reply.fence_floors:
            self._on_fence_floors(dict(reply.fence_floors))
        _LOG.info(
            "registered with tracker %s; heartbeat every %.2f s", self.tracker_address, interval_s
        )
        self.registered.set()
        return max(interval_s, _MIN_HEARTBEAT_S)
