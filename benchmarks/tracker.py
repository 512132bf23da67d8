"""Tracker benchmark: register 1,000 devices, then acquire+release round trips from several clients.

    .venv/bin/python benchmarks/tracker.py [--devices 1000] [--register-procs 4] [--clients 4]
                                           [--round-trips 400] [--tvm-python /tmp/tvmvenv/bin/python]

For each store (memory, then redis with a redis-server this script starts) a real `kiln-tracker`
process is started; `--register-procs` processes each run several fake agents that register their
share of the devices with real Register RPCs (and keep heartbeating); then `--clients` processes do
Acquire+Release round trips, each timed as one pair. If TVM's tracker is installed in a separate
virtualenv (`--tvm-python`), the same phases run against `python -m tvm.exec.rpc_tracker`: fake
servers PUT their devices over TVM's socket protocol, clients REQUEST a device and PUT it back,
which is how a TVM server returns itself to the pool after a session. (`pip install apache-tvm`
0.27 installs, but its tracker also needs `pip install tornado`, which the wheel does not pull in.)

Prints a table and ends with one line per store, redis last:
    tracker: register_1000_s=<s> acquire_p50_ms=<ms> acquire_p99_ms=<ms> store=<memory|redis>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc  # noqa: E402
from tracker.testing import RedisServer, free_port  # noqa: E402
from tuner.measure.tracker_client import TrackerClient  # noqa: E402

KEY = "bench"
START_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 10.0
AGENTS_PER_PROC = 5
TVM_TRACKER_MAGIC = 0x2F271
TVM_PUT, TVM_REQUEST, TVM_SUCCESS = 3, 4, 0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Result:
    """What one run against one tracker measured: one client alone, then several at once."""

    store: str
    register_s: float
    single_ms: list[float]
    concurrent_ms: list[float]

    def p(self, q: float, concurrent: bool = True) -> float:
        """A percentile of the concurrent (or single-client) round trips, in ms."""
        return percentile(self.concurrent_ms if concurrent else self.single_ms, q)


# ---------------------------------------------------------------- child roles (own processes)


def _wait_go() -> None:
    """Block until the parent says go (one line on stdin), so start-up is not measured."""
    print("ready", flush=True)
    sys.stdin.readline()


def role_kiln_agents(tracker: str, name: str, devices: int) -> None:
    """Register `devices` devices as AGENTS_PER_PROC agents, then heartbeat until stdin closes."""
    channel = grpc.insecure_channel(tracker)
    stub = tracker_pb2_grpc.TrackerStub(channel)
    grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
    per_agent = [devices // AGENTS_PER_PROC + (i < devices % AGENTS_PER_PROC) for i in range(5)]
    agents = [f"{name}-agent{i}" for i in range(AGENTS_PER_PROC)]
    _wait_go()
    start = time.perf_counter()
    for agent_id, count in zip(agents, per_agent, strict=True):
        specs = [common_pb2.DeviceSpec(key=KEY, backend="null") for _ in range(count)]
        stub.Register(
            tracker_pb2.RegisterRequest(
                agent_id=agent_id, agent_address=f"127.0.0.1:{9000 + len(agent_id)}", devices=specs
            ),
            timeout=RPC_TIMEOUT_S,
        )
    print(f"done {time.perf_counter() - start:.6f}", flush=True)
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(1.0):
            for agent_id in agents:
                with contextlib.suppress(grpc.RpcError):
                    stub.Heartbeat(
                        tracker_pb2.HeartbeatRequest(agent_id=agent_id), timeout=RPC_TIMEOUT_S
                    )

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    sys.stdin.read()  # until the parent closes our stdin
    stop.set()


def role_kiln_client(tracker: str, round_trips: int) -> None:
    """Time `round_trips` Acquire+Release pairs; print the latencies (ms) as JSON."""
    channel = grpc.insecure_channel(tracker)
    stub = tracker_pb2_grpc.TrackerStub(channel)
    grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
    for _ in range(10):  # warm the channel and the server's code paths
        lease = stub.Acquire(tracker_pb2.AcquireRequest(key=KEY, timeout_s=5.0), timeout=10).lease
        stub.Release(tracker_pb2.ReleaseRequest(lease_id=lease.lease_id), timeout=10)
    _wait_go()
    latencies = []
    for _ in range(round_trips):
        start = time.perf_counter()
        reply = stub.Acquire(
            tracker_pb2.AcquireRequest(key=KEY, timeout_s=5.0, user="bench"),
            timeout=RPC_TIMEOUT_S,
        )
        if reply.status != common_pb2.OK:
            raise SystemExit(f"acquire failed: {reply.reason}")
        stub.Release(tracker_pb2.ReleaseRequest(lease_id=reply.lease.lease_id), timeout=10)
        latencies.append((time.perf_counter() - start) * 1000.0)
    print(json.dumps(latencies), flush=True)


class _TvmConnection:
    """One socket speaking TVM's tracker protocol: magic, then [int32 size][JSON] both ways."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=RPC_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(struct.pack("<i", TVM_TRACKER_MAGIC))
        if struct.unpack("<i", self._recv(4))[0] != TVM_TRACKER_MAGIC:
            raise RuntimeError("not a TVM tracker")

    def _recv(self, size: int) -> bytes:
        chunks = b""
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionError("TVM tracker closed the connection")
            chunks += chunk
        return chunks

    def call(self, message: object) -> object:
        data = json.dumps(message).encode()
        self.sock.sendall(struct.pack("<i", len(data)) + data)
        size = struct.unpack("<i", self._recv(4))[0]
        return json.loads(self._recv(size))


def role_tvm_servers(tracker: str, name: str, devices: int, first_port: int) -> None:
    """PUT `devices` devices (one connection per fake server), then hold them until stdin closes."""
    conns = [_TvmConnection(tracker) for _ in range(AGENTS_PER_PROC)]
    _wait_go()
    start = time.perf_counter()
    for index in range(devices):
        conn = conns[index % AGENTS_PER_PROC]
        reply = conn.call([TVM_PUT, KEY, [first_port + index, f"{name}-{index}"], "127.0.0.1"])
        if reply != TVM_SUCCESS:
            raise SystemExit(f"PUT failed: {reply}")
    print(f"done {time.perf_counter() - start:.6f}", flush=True)
    sys.stdin.read()


def role_tvm_client(tracker: str, round_trips: int) -> None:
    """REQUEST a device and PUT it back (a TVM server re-registers after a session), timed."""
    requests, returns = _TvmConnection(tracker), _TvmConnection(tracker)

    def round_trip() -> None:
        reply = requests.call([TVM_REQUEST, KEY, "bench", 0])
        assert isinstance(reply, list) and reply[0] == TVM_SUCCESS, reply
        _, port, _ = reply[1]
        assert returns.call([TVM_PUT, KEY, [port, uuid.uuid4().hex], "127.0.0.1"]) == TVM_SUCCESS

    for _ in range(3):
        round_trip()
    _wait_go()
    latencies = []
    for _ in range(round_trips):
        start = time.perf_counter()
        round_trip()
        latencies.append((time.perf_counter() - start) * 1000.0)
    print(json.dumps(latencies), flush=True)


# ---------------------------------------------------------------- the parent


def _spawn(args: Sequence[str]) -> subprocess.Popen[str]:
    """A child role of this script; TVM's fake servers and clients need only plain sockets."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _expect(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(word):
        raise RuntimeError(f"child {proc.args!r} said {line!r}, expected {word!r}")
    return line


def _go(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        _expect(proc, "ready")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def _stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def _daemon(args: Sequence[str], workdir: Path, name: str, python: str) -> Iterator[None]:
    with open(workdir / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [python, *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_ready(path: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} never appeared")
        time.sleep(0.05)
    return path.read_text().splitlines()[0]


def _round_trips(role_prefix: str, tracker: str, clients: int, count: int) -> list[float]:
    """Latencies (ms) of `count` round trips from each of `clients` client processes at once."""
    script = str(Path(__file__).resolve())
    procs = [
        _spawn(
            [script, "--role", f"{role_prefix}-client", "--tracker", tracker, "--count", str(count)]
        )
        for _ in range(clients)
    ]
    try:
        _go(procs)
        latencies: list[float] = []
        for proc in procs:
            assert proc.stdout is not None
            latencies += json.loads(proc.stdout.readline())
    finally:
        _stop(procs)
    return latencies


def _phases(
    args: argparse.Namespace, role_prefix: str, tracker: str
) -> tuple[float, list[float], list[float]]:
    """Register from several processes, then round trips from one client, then from several."""
    script = str(Path(__file__).resolve())
    per_proc = [
        args.devices // args.register_procs + (i < args.devices % args.register_procs)
        for i in range(args.register_procs)
    ]
    registrars = []
    for i, count in enumerate(per_proc):
        role = [script, "--role", f"{role_prefix}-agents", "--tracker", tracker]
        registrars.append(
            _spawn(
                [
                    *role,
                    "--name",
                    f"p{i}",
                    "--count",
                    str(count),
                    "--first-port",
                    str(20000 + i * 1000),
                ]
            )
        )
    try:
        _go(registrars)
        start = time.perf_counter()
        for proc in registrars:
            _expect(proc, "done")
        register_s = time.perf_counter() - start
        single = _round_trips(role_prefix, tracker, 1, args.round_trips)
        concurrent = _round_trips(role_prefix, tracker, args.clients, args.round_trips)
    finally:
        _stop(registrars)
    return register_s, single, concurrent


def _count_devices(tracker: str) -> int:
    client = TrackerClient(tracker)  # follows ListDevices' pages
    try:
        return len(client.list_devices().devices)
    finally:
        client.close()


def run_kiln(args: argparse.Namespace, store: str, workdir: Path, label: str) -> Result:
    """Start kiln-tracker over `store`, run both phases, check the pool, stop it."""
    ready = workdir / f"tracker-{label}.ready"
    tracker_args = ["-m", "tracker", "--listen", "127.0.0.1:0", "--store", store,
                    "--ready-file", str(ready), "--log-level", "warning"]  # fmt: skip
    with _daemon(tracker_args, workdir, f"tracker-{label}", sys.executable):
        tracker = _wait_ready(ready)
        register_s, single, concurrent = _phases(args, "kiln", tracker)
        listed = _count_devices(tracker)
    if listed < args.devices:
        raise RuntimeError(f"{label}: only {listed} of {args.devices} devices registered")
    return Result(label, register_s, single, concurrent)


def run_tvm(args: argparse.Namespace, workdir: Path) -> Result:
    port = free_port()
    tracker_args = ["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                    "--port-end", str(port + 1), "--silent"]  # fmt: skip
    with _daemon(tracker_args, workdir, "tvm-tracker", args.tvm_python):
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                _TvmConnection(address).sock.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        register_s, single, concurrent = _phases(args, "tvm", address)
    return Result("tvm", register_s, single, concurrent)


def replica_handoff(redis_url: str, rounds: int = 50) -> list[float]:
    """ms from a release on one replica to the grant of that device to a waiter on another.

    Two DevicePools in this process over one Redis, each on an event loop of its own (as in two
    tracker processes), no reaper: the waiter learns of the release only through the store's
    pub/sub channel (the reaper's sweep is the fallback, every 0.5 s).
    """
    from protos.aio_loop import LoopThread
    from tracker.config import TrackerConfig
    from tracker.model import DeviceSpec, LeaseRequest
    from tracker.pool import DevicePool
    from tracker.store import open_store
    from tracker.testing import Blocking, BlockingPool

    loops = [LoopThread("handoff-waiting"), LoopThread("handoff-releasing")]
    stores = [Blocking(open_store(redis_url + "handoff:"), loop) for loop in loops]
    waiting_side, releasing_side = (
        BlockingPool(DevicePool(store.target, TrackerConfig()), store.loop) for store in stores
    )
    times: list[float] = []
    try:
        for pool in (waiting_side, releasing_side):
            pool.start()
        releasing_side.register("handoff-agent", "127.0.0.1:1", [DeviceSpec("", "handoff")])
        for index in range(rounds):
            held = releasing_side.acquire(LeaseRequest(key="handoff")).lease
            assert held is not None
            got: list[float] = []

            def wait(index: int = index, got: list[float] = got) -> None:
                request = LeaseRequest(key="handoff", timeout_s=10.0, request_id=f"h{index}")
                lease = waiting_side.acquire(request).lease
                got.append(time.perf_counter())
                assert lease is not None
                waiting_side.release(lease.lease_id)

            thread = threading.Thread(target=wait)
            thread.start()
            deadline = time.monotonic() + 10.0
            while waiting_side.waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            start = time.perf_counter()
            releasing_side.release(held.lease_id)
            thread.join(15.0)
            times.append((got[0] - start) * 1000.0)
    finally:
        for pool in (waiting_side, releasing_side):
            pool.close()
        for store in stores:
            store.close()
        for loop in loops:
            loop.stop()
    return times


def tvm_status(python: str) -> str:
    """ "" when TVM's tracker can run under `python`, else why not."""
    if not Path(python).exists():
        return f"{python} does not exist (python3 -m venv /tmp/tvmvenv && pip install apache-tvm)"
    probe = subprocess.run(
        [python, "-c", "import tvm.rpc.tracker"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        last = probe.stderr.strip().splitlines()[-1:]
        return f"`import tvm.rpc.tracker` failed ({last}); try `pip install tornado` there"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with --role, one of its child processes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--register-procs", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--round-trips", type=int, default=400, help="per client")
    parser.add_argument("--tvm-python", default="/tmp/tvmvenv/bin/python")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--tracker", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="p", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--first-port", type=int, default=20000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    roles = {
        "kiln-agents": lambda: role_kiln_agents(args.tracker, args.name, args.count),
        "kiln-client": lambda: role_kiln_client(args.tracker, args.count),
        "tvm-agents": lambda: role_tvm_servers(
            args.tracker, args.name, args.count, args.first_port
        ),
        "tvm-client": lambda: role_tvm_client(args.tracker, args.count),
    }
    if args.role:
        roles[args.role]()
        return 0

    results: list[Result] = []
    why_no_tvm = tvm_status(args.tvm_python)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        workdir = Path(tmp)
        with RedisServer(workdir / "redis") as redis_server:
            redis_url = redis_server.url(prefix=f"bench-{os.getpid()}:")
            results.append(run_kiln(args, "memory", workdir, "memory"))
            if not why_no_tvm:
                results.append(run_tvm(args, workdir))
            results.append(run_kiln(args, redis_url, workdir, "redis"))
            handoff = replica_handoff(redis_server.url() + "?prefix=")

    print()
    print(
        f"{args.devices} devices registered from {args.register_procs} processes; acquire+release "
        f"round trips: 1 client, then {args.clients} at once, {args.round_trips} each"
    )
    print(
        f"{'tracker':<8} {'register_s':>10} {'1 client p50':>13} {'p99':>7}   "
        f"{args.clients} clients: {'p50_ms':>7} {'p90_ms':>7} {'p99_ms':>7}"
    )
    for r in results:
        print(
            f"{r.store:<8} {r.register_s:>10.3f} {r.p(0.5, False):>13.3f} {r.p(0.99, False):>7.3f}"
            f"   {'':>10} {r.p(0.5):>7.3f} {r.p(0.9):>7.3f} {r.p(0.99):>7.3f}"
        )
    print(
        f"redis replicas: release on one -> grant to a waiter on another, p50 "
        f"{percentile(handoff, 0.5):.2f} ms, max {max(handoff):.2f} ms ({len(handoff)} hand-offs, "
        f"woken by pub/sub)"
    )
    by_store = {r.store: r for r in results}
    if "tvm" in by_store:
        tvm = by_store["tvm"]
        for store in ("memory", "redis"):
            ours = by_store[store]
            print(
                f"tvm / kiln-{store}: register {tvm.register_s / ours.register_s:.1f}x, "
                f"acquire p50 {tvm.p(0.5, False) / ours.p(0.5, False):.1f}x (1 client) "
                f"{tvm.p(0.5) / ours.p(0.5):.1f}x ({args.clients} clients), "
                f"p99 {tvm.p(0.99) / ours.p(0.99):.1f}x (higher = kiln faster)"
            )
    else:
        print(f"TVM's tracker not measured: {why_no_tvm}")
    print(
        f"targets: register_1000_s < 5, acquire_p50_ms < 2, acquire_p99_ms < 20 "
        f"(figures below: {args.clients} concurrent clients)"
    )
    for store in ("memory", "redis"):
        r = by_store[store]
        print(
            f"tracker: register_1000_s={r.register_s:.3f} acquire_p50_ms={r.p(0.5):.3f} "
            f"acquire_p99_ms={r.p(0.99):.3f} store={store}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
