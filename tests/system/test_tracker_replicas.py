"""Two real `kiln-tracker` processes over one real redis-server never grant one device twice.

One agent registers 3 devices with replica A; 6 clients (3 on each replica) take turns on them.
Every client records, on one clock, when it held each lease; the intervals on a device must never
overlap, and every device's fences must increase in grant order.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from pathlib import Path

import grpc
from test_tracker_restart import RPC_TIMEOUT_S, RedisPool, wait_until

from protos import common_pb2, fencing, tracker_pb2
from protos.auth import Role
from tracker.testing import RedisServer, free_port

CLIENTS_PER_REPLICA = 3
ROUNDS = 8
HOLD_S = 0.02


def test_two_replicas_never_grant_one_device_twice(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        pool = RedisPool(tmp_path, server.url(prefix="replicas:"))
        try:
            pool.start_tracker()
            second = f"127.0.0.1:{free_port()}"
            pool.spawn(
                "tracker-b",
                ["-m", "tracker", "--listen", second, "--store", pool.redis_url,
                 "--heartbeat-interval-s", "0.5", "--token-file", str(pool.secrets_path)],
            )  # fmt: skip
            pool.start_agent("agent-a", "x86", 3)
            replicas = [pool.address, second]
            for address in replicas:
                with grpc.insecure_channel(address) as channel:
                    wait_until(
                        f"3 devices seen through {address}",
                        lambda ch=channel: len(pool.devices(ch)) == 3,  # type: ignore[misc]
                    )
            held: list[tuple[str, float, float, int, str]] = []
            errors: list[str] = []
            lock = threading.Lock()

            def client(address: str) -> None:
                with grpc.insecure_channel(address) as channel:
                    for _ in range(ROUNDS):
                        request = tracker_pb2.AcquireRequest(key="x86", timeout_s=20, user=address)
                        got = pool.call(channel, "Acquire", request, Role.CLIENT)
                        if got.status != common_pb2.OK:
                            with lock:
                                errors.append(f"{address}: {got.reason}")
                            return
                        start = time.monotonic()
                        time.sleep(HOLD_S)
                        end = time.monotonic()
                        lease = got.lease
                        release = tracker_pb2.ReleaseRequest(lease_id=lease.lease_id)
                        released = pool.call(channel, "Release", release, Role.CLIENT)
                        with lock:
                            held.append((lease.device.device_id, start, end, lease.fence, address))
                            if not released.released:
                                errors.append(f"release {lease.lease_id}: {released.reason}")
                        token_fence = fencing.verify(
                            pool.secrets.require_lease_key(),
                            lease.token,
                            lease.lease_id,
                            lease.device.device_id,
                            now_unix=time.time() - 1.0,
                        ).fence
                        if token_fence != lease.fence:
                            with lock:
                                errors.append(f"token fence {token_fence} != {lease.fence}")

            threads = [
                threading.Thread(target=client, args=(address,), daemon=True)
                for address in replicas
                for _ in range(CLIENTS_PER_REPLICA)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(RPC_TIMEOUT_S * ROUNDS)
            assert not any(t.is_alive() for t in threads), "a client never finished"
        finally:
            pool.stop()
    assert not errors, errors
    assert len(held) == 2 * CLIENTS_PER_REPLICA * ROUNDS
    assert {address for *_, address in held} == set(replicas)
    by_device: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for device, start, end, fence, _ in held:
        by_device[device].append((start, end, fence))
    assert len(by_device) == 3
    for device, spans in by_device.items():
        spans.sort()
        for (_, end, fence), (start, _, next_fence) in itertools.pairwise(spans):
            assert end <= start, f"{device} held twice at once"
            assert next_fence > fence, f"{device}: fence {next_fence} after {fence}"
