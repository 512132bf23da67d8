"""The workstation's calls to a tracker: token on every call, TLS when asked, Acquire that survives
a tracker restart.

Acquire sends a `request_id` (one uuid per acquire). When the tracker answers UNAVAILABLE (it is
restarting, or its store is down), the same request is sent again with capped exponential backoff
until the acquire's own deadline: a tracker with a durable store recognises the id and keeps the
request's place in its queue, so a restart does not lose it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping

import grpc

from protos import tracker_pb2, tracker_pb2_grpc
from protos.auth import Role, SecretsError, TlsFiles, call_metadata, load_secrets, open_channel

_LOG = logging.getLogger(__name__)

# Deadline for control calls (Acquire excluded): a healthy tracker answers in milliseconds.
CONTROL_RPC_TIMEOUT_S = 10.0
# Backoff between Acquire attempts while the tracker is unavailable: doubles from the first to
# the cap, so a restarted tracker is found again within about a cap's time.
ACQUIRE_RETRY_FIRST_S = 0.05
ACQUIRE_RETRY_CAP_S = 2.0
# gRPC's own reconnect backoff grows to 120 s by default; keep it near ours so retries can succeed.
_CHANNEL_OPTIONS: list[tuple[str, object]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", int(ACQUIRE_RETRY_CAP_S * 1000)),
]


def read_client_token(path: str) -> str:
    """The token a workstation uses from a pool secrets file: `client`, else `admin`.

    Raises:
        SecretsError: unreadable, malformed, or with neither entry.
    """
    secrets = load_secrets(path)
    for role in (Role.CLIENT, Role.ADMIN):
        if role in secrets.tokens:
            return secrets.tokens[role]
    raise SecretsError(f"{path} has no 'client' (or 'admin') token")


# 1,000 pages of 500 devices: far more than any pool; the bound keeps a misbehaving tracker that
# never ends its pages from looping a client forever.
MAX_LIST_PAGES = 1000


class TrackerClient:
    """A channel to one tracker and the calls the tuner makes on it.

    Args:
        address: HOST:PORT of the tracker.
        token: bearer token sent with every call (None: none sent).
        tls: CA (and client certificate) for a TLS tracker; None or empty: plaintext.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls: TlsFiles | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.address = address
        self._metadata = call_metadata(token)
        self._channel = open_channel(address, tls, options=_CHANNEL_OPTIONS)
        self._stub = tracker_pb2_grpc.TrackerStub(self._channel)
        self._sleep = sleep

    def acquire(
        self,
        key: str,
        tags: Mapping[str, str],
        user: str,
        priority: int,
        timeout_s: float,
        lease_ttl_s: float,
    ) -> tracker_pb2.AcquireResponse:
        """Wait up to `timeout_s` for a lease; retry UNAVAILABLE with the same request id.

        Raises:
            grpc.RpcError: any other error, or UNAVAILABLE still at the deadline.
        """
        request_id = uuid.uuid4().hex
        deadline = time.monotonic() + timeout_s
        backoff_s = ACQUIRE_RETRY_FIRST_S
        attempt = 0
        while True:
            attempt += 1
            remaining_s = max(deadline - time.monotonic(), 0.0)
            request = tracker_pb2.AcquireRequest(
                key=key,
                tag_selector=dict(tags),
                priority=priority,
                user=user,
                timeout_s=remaining_s,
                lease_ttl_s=lease_ttl_s,
                request_id=request_id,
            )
            try:
                response: tracker_pb2.AcquireResponse = self._stub.Acquire(
                    request,
                    timeout=remaining_s + CONTROL_RPC_TIMEOUT_S,
                    metadata=self._metadata,
                )
                return response
            except grpc.RpcError as error:
                left_s = deadline - time.monotonic()
                if error.code() != grpc.StatusCode.UNAVAILABLE or left_s <= 0:
                    raise
                delay_s = min(backoff_s, left_s)
                _LOG.warning(
                    "tracker %s unavailable (%s); acquire attempt %d again in %.2f s",
                    self.address,
                    error.details(),
                    attempt,
                    delay_s,
                )
                self._sleep(delay_s)
                backoff_s = min(backoff_s * 2, ACQUIRE_RETRY_CAP_S)

    def renew(self, lease_id: str, lease_ttl_s: float) -> tracker_pb2.RenewResponse:
        """Extend a lease; the response carries a fresh lease token to use from now on.

        Raises:
            grpc.RpcError: the call failed.
        """
        response: tracker_pb2.RenewResponse = self._stub.Renew(
            tracker_pb2.RenewRequest(lease_id=lease_id, lease_ttl_s=lease_ttl_s),
            timeout=CONTROL_RPC_TIMEOUT_S,
            metadata=self._metadata,
        )
        return response

    def release(self, lease_id: str) -> tracker_pb2.ReleaseResponse:
        """End a lease.

        Raises:
            grpc.RpcError: the call failed.
        """
        response: tracker_pb2.ReleaseResponse = self._stub.Release(
            tracker_pb2.ReleaseRequest(lease_id=lease_id),
            timeout=CONTROL_RPC_TIMEOUT_S,
            metadata=self._metadata,
        )
        return response

    def list_devices(self, key: str = "") -> tracker_pb2.ListDevicesResponse:
        """Every device with `key` ("" = all), with state, holder, heartbeat age, queue depth.

        The tracker answers in pages; this follows them (at most MAX_LIST_PAGES) into one
        response sorted by device id.

        Raises:
            grpc.RpcError: the call failed.
        """
        listing = tracker_pb2.ListDevicesResponse()
        token = ""
        for _ in range(MAX_LIST_PAGES):
            page: tracker_pb2.ListDevicesResponse = self._stub.ListDevices(
                tracker_pb2.ListDevicesRequest(key=key, page_token=token),
                timeout=CONTROL_RPC_TIMEOUT_S,
                metadata=self._metadata,
            )
            listing.devices.extend(page.devices)
            token = page.next_page_token
            if not token:
                break
        return listing

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()
