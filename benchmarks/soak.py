"""Tracker soak: one loaded tracker for minutes, watching its RSS, errors and latencies.

    .venv/bin/python benchmarks/soak.py [--minutes 5] [--stores memory,redis] [--bad-calls 0]
        [--devices 1000] [--busy-devices 4] [--waiters 500] [--clients 16] [--client-procs 2]
        [--client-pause-ms 100] [--list-pause-ms 100] [--list-page-size 0]

For each store (memory, then redis over a redis-server this script starts) a real `kiln-tracker`
process is started on port 0 (its --ready-file names the port). This process registers --devices
devices as fake agents of at most MAX_DEVICES_PER_AGENT devices each, keeps them alive with
Heartbeat RPCs at the interval Register returned, and leases the --busy-devices devices of the busy
key and renews them for the whole run. Child processes (grpc.aio, one thread each) then add:
  - --waiters Acquires on the busy key with 10-30 s timeouts, each re-issued when answered NO_DEVICE;
  - --clients clients on the free key looping Acquire (2 s timeout) + Release, timed as one pair,
    --client-pause-ms apart (a tuner measures between leases; 0 makes a closed loop, which
    measures capacity: its p50 is about --clients times the tracker's CPU per pair);
  - one admin looping ListDevices (all devices, following next_page_token when the proto has
    paging), timed per call, --list-pause-ms apart.
Once the tracker reports the waiters queued and after a warm-up, the steady phase lasts --minutes;
the tracker's VmRSS is read at its start and end. With --bad-calls N, before the waiters start, N
undecodable calls (b'\\xff\\xff\\xff\\xff') go round-robin to every Tracker method and the health
service's Check and Watch, and the tracker's RSS before and after them is reported.

Errors, counted from the first waiter to the end: every RPC that ended in a gRPC error, except a
waiter's DEADLINE_EXCEEDED (re-issued on purpose) and the calls this script cancels when it stops;
plus every answer that should not happen here (NO_DEVICE on the free key, a Release the tracker
did not know, a Renew answered DEVICE_LOST, a Heartbeat answered known=false, a waiter granted a
busy device, a ListDevices short of devices). Percentiles come from log histograms (1% buckets).

Each clients process also times two empty health Checks as one, --client-pause-ms apart: the
floor a pair's latency sits on under the same load (gRPC, the processes waking, the tracker's
event loop busy with everything else), without the pool's own work.

Prints a table and ends with one line per store, redis last:
    soak: store=<s> rss_growth_pct=<x> errors=<n> list_p99_ms=<ms> acquire_p50_ms=<ms>
          acquire_p99_ms=<ms> waiters=<n> floor_p50_ms=<ms> [bad_calls_rss_growth_mb=<x>]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402
import grpc.aio  # noqa: E402

from protos import common_pb2, tracker_pb2, tracker_pb2_grpc  # noqa: E402
from tracker.testing import RedisServer  # noqa: E402
from tracker.validation import MAX_DEVICES_PER_AGENT  # noqa: E402

BUSY_KEY = "soak-busy"
FREE_KEY = "soak-free"
SLICES = 5  # the steady phase is reported in this many consecutive slices
START_TIMEOUT_S = 60.0
QUEUE_TIMEOUT_S = 60.0  # how long the waiters may take to be queued before the run goes on anyway
WARMUP_S = 5.0
RPC_TIMEOUT_S = 10.0
WAITER_TIMEOUT_S = (10.0, 30.0)  # spread, so re-issues do not come in one burst
WAITER_DEADLINE_MARGIN_S = 10.0  # past timeout_s: the tracker answers NO_DEVICE well before
CLIENT_ACQUIRE_TIMEOUT_S = 2.0
HOLD_TTL_S = 60.0
RENEW_EVERY_S = 10.0
ERROR_BACKOFF_S = 0.5  # after an error a loop pauses, so a dead tracker is not spun on
WAITER_CHANNELS = 4
MAX_PAGES = 10_000
BAD_CALL = b"\xff\xff\xff\xff"  # a varint that never ends: no protobuf message decodes from it
BAD_CALL_BATCH = 64
HEALTH_CHECK, HEALTH_WATCH = "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"
# Separate TCP connections per channel, as separate clients would have.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
_BUCKET_LOG = math.log(1.01)
_LIST_FIELDS = tracker_pb2.ListDevicesRequest.DESCRIPTOR.fields_by_name
PAGED = "page_token" in _LIST_FIELDS


class Histogram:
    """Latencies (ms) counted in log buckets 1% wide: percentiles within 1%, bounded memory."""

    def __init__(self, buckets: dict[int, int] | None = None, max_ms: float = 0.0) -> None:
        self.buckets: Counter[int] = Counter(buckets or {})
        self.max_ms = max_ms

    def add(self, ms: float) -> None:
        self.buckets[math.floor(math.log(max(ms, 1e-4)) / _BUCKET_LOG)] += 1
        self.max_ms = max(self.max_ms, ms)

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def percentile(self, q: float) -> float:
        """The q-quantile (0..1), nearest rank, as its bucket's middle; nan when empty."""
        rank, seen = min(self.count - 1, int(q * self.count)), 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen > rank:
                return min(math.exp((bucket + 0.5) * _BUCKET_LOG), self.max_ms)
        return math.nan

    def merge(self, other: Histogram) -> Histogram:
        self.buckets.update(other.buckets)
        self.max_ms = max(self.max_ms, other.max_ms)
        return self

    def to_json(self) -> dict[str, Any]:
        return {"buckets": {str(b): n for b, n in self.buckets.items()}, "max_ms": self.max_ms}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Histogram:
        return cls({int(b): n for b, n in data["buckets"].items()}, data["max_ms"])


@dataclass
class Recorder:
    """What one process saw: latencies and readings per slice of the steady phase (none before
    it starts), errors and expected outcomes over the whole run."""

    series: dict[str, list[Histogram]] = field(default_factory=dict)
    readings: dict[str, list[list[int]]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    expected: Counter[str] = field(default_factory=Counter)
    started: float | None = None
    slice_s: float = 1.0

    def start(self, duration_s: float) -> None:
        self.slice_s = max(duration_s, 1e-3) / SLICES
        self.started = time.perf_counter()

    def _slice(self) -> int | None:
        if self.started is None:
            return None
        return min(SLICES - 1, int((time.perf_counter() - self.started) / self.slice_s))

    def latency(self, name: str, ms: float) -> None:
        index = self._slice()
        if index is not None:
            self.series.setdefault(name, [Histogram() for _ in range(SLICES)])[index].add(ms)

    def reading(self, name: str, value: int) -> None:
        index = self._slice()
        if index is not None:
            self.readings.setdefault(name, [[] for _ in range(SLICES)])[index].append(value)

    def rpc_error(self, what: str, error: grpc.RpcError) -> None:
        self.errors[f"{what} {error.code().name}"] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "series": {k: [h.to_json() for h in v] for k, v in self.series.items()},
            "readings": self.readings,
            "errors": dict(self.errors),
            "expected": dict(self.expected),
        }

    def merge_json(self, data: dict[str, Any]) -> None:
        for name, hists in data["series"].items():
            mine = self.series.setdefault(name, [Histogram() for _ in range(SLICES)])
            for slot, hist in zip(mine, hists, strict=True):
                slot.merge(Histogram.from_json(hist))
        for name, slices in data["readings"].items():
            mine_r = self.readings.setdefault(name, [[] for _ in range(SLICES)])
            for slot_r, values in zip(mine_r, slices, strict=True):
                slot_r.extend(values)
        self.errors.update(data["errors"])
        self.expected.update(data["expected"])

    def whole(self, name: str) -> Histogram:
        total = Histogram()
        for hist in self.series.get(name, []):
            total.merge(hist)
        return total


def list_request(page_token: str, page_size: int) -> tracker_pb2.ListDevicesRequest:
    """All devices, one page; works whether or not the proto has page_size/page_token yet."""
    fields: dict[str, Any] = {}
    if PAGED:
        fields["page_token"] = page_token
        if page_size and "page_size" in _LIST_FIELDS:
            fields["page_size"] = page_size
    return tracker_pb2.ListDevicesRequest(**fields)


# ---------------------------------------------------------------- child roles (own processes)


async def _waiter(stub: Any, rec: Recorder, rng: random.Random) -> None:
    """Wait on the busy key until cancelled, re-issuing each answer."""
    while True:
        timeout_s = rng.uniform(*WAITER_TIMEOUT_S)
        request = tracker_pb2.AcquireRequest(key=BUSY_KEY, timeout_s=timeout_s, user="soak-waiter")
        try:
            reply = await stub.Acquire(request, timeout=timeout_s + WAITER_DEADLINE_MARGIN_S)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                rec.expected["waiter Acquire DEADLINE_EXCEEDED, re-issued"] += 1
            else:
                rec.rpc_error("waiter Acquire", error)
                await asyncio.sleep(ERROR_BACKOFF_S)
            continue
        if reply.status == common_pb2.NO_DEVICE:
            rec.expected["waiter Acquire NO_DEVICE, re-issued"] += 1
            continue
        rec.errors["waiter Acquire granted a busy device"] += 1
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.Release(
                tracker_pb2.ReleaseRequest(lease_id=reply.lease.lease_id), timeout=RPC_TIMEOUT_S
            )


async def _admin(stub: Any, rec: Recorder, devices: int, pause_s: float, page_size: int) -> None:
    """ListDevices in a loop: per-call and whole-listing latency, busy-key queue depth."""
    while True:
        token, seen, depth, lost, pages, start = "", 0, 0, 0, 0, time.perf_counter()
        try:
            while pages < MAX_PAGES:
                pages += 1
                call_start = time.perf_counter()
                reply = await stub.ListDevices(
                    list_request(token, page_size), timeout=RPC_TIMEOUT_S
                )
                rec.latency("list", (time.perf_counter() - call_start) * 1000.0)
                for status in reply.devices:
                    if status.spec.key == BUSY_KEY:
                        depth = max(depth, status.queue_depth)
                    lost += status.state == tracker_pb2.LOST
                seen += len(reply.devices)
                token = getattr(reply, "next_page_token", "")
                if not token:
                    break
        except grpc.aio.AioRpcError as error:
            rec.rpc_error("admin ListDevices", error)
            await asyncio.sleep(ERROR_BACKOFF_S)
            continue
        rec.latency("listing", (time.perf_counter() - start) * 1000.0)
        rec.reading("queued", depth)
        rec.reading("pages", pages)
        if seen < devices:
            rec.errors[f"admin ListDevices listed {seen} of {devices} devices"] += 1
        if lost:
            rec.errors["admin ListDevices saw LOST devices"] += 1
        await asyncio.sleep(pause_s)


async def _client(stub: Any, rec: Recorder, pause_s: float) -> None:
    """Acquire a free-key device and release it, timed as one pair, until cancelled."""
    request = tracker_pb2.AcquireRequest(
        key=FREE_KEY, timeout_s=CLIENT_ACQUIRE_TIMEOUT_S, user="soak-client"
    )
    while True:
        start = time.perf_counter()
        try:
            reply = await stub.Acquire(request, timeout=RPC_TIMEOUT_S)
            if reply.status != common_pb2.OK:
                rec.errors[f"client Acquire {common_pb2.Status.Name(reply.status)}"] += 1
                await asyncio.sleep(ERROR_BACKOFF_S)
                continue
            released = await stub.Release(
                tracker_pb2.ReleaseRequest(lease_id=reply.lease.lease_id), timeout=RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            rec.rpc_error("client Acquire/Release", error)
            await asyncio.sleep(ERROR_BACKOFF_S)
            continue
        rec.latency("pair", (time.perf_counter() - start) * 1000.0)
        if not released.released:
            rec.errors["client Release released=false"] += 1
        await asyncio.sleep(pause_s)


async def _floor(channel: Any, rec: Recorder, pause_s: float) -> None:
    """Two empty health Checks, timed as one, --client-pause-ms apart, until cancelled: the floor
    a pair sits on under the same load (gRPC, the processes waking, the tracker's event loop
    busy with everything else), without the pool's own work."""
    check = channel.unary_unary(HEALTH_CHECK)
    while True:
        start = time.perf_counter()
        try:
            await check(b"", timeout=RPC_TIMEOUT_S)
            await check(b"", timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            rec.rpc_error("floor Health/Check", error)
            await asyncio.sleep(ERROR_BACKOFF_S)
            continue
        rec.latency("floor", (time.perf_counter() - start) * 1000.0)
        await asyncio.sleep(pause_s)


async def _child(args: argparse.Namespace) -> None:
    """Run one role: say ready, start on "go", record from "measure <s>", report on "stop"."""
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "stop")  # the parent went away

    threading.Thread(target=read_commands, daemon=True).start()
    waiters = args.role == "waiters"
    count = WAITER_CHANNELS + 1 if waiters else args.count + 1  # clients: + the floor's
    channels = [
        grpc.aio.insecure_channel(args.tracker, options=CHANNEL_OPTIONS) for _ in range(count)
    ]
    rec, tasks = Recorder(), []
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT_S)
        stubs = [tracker_pb2_grpc.TrackerStub(channel) for channel in channels]
        print("ready", flush=True)
        while (command := await commands.get()) != "go":
            if command == "stop":
                return
        if waiters:
            rng = random.Random(os.getpid())
            tasks = [asyncio.create_task(_waiter(stubs[i % WAITER_CHANNELS], rec, rng))
                     for i in range(args.count)]  # fmt: skip
            admin = _admin(stubs[-1], rec, args.devices, args.pause_ms / 1000.0, args.page_size)
            tasks.append(asyncio.create_task(admin))
        else:
            tasks = [asyncio.create_task(_client(stub, rec, args.pause_ms / 1000.0))
                     for stub in stubs[:-1]]  # fmt: skip
            tasks.append(asyncio.create_task(_floor(channels[-1], rec, args.pause_ms / 1000.0)))
        while (command := await commands.get()) != "stop":
            if command.startswith("measure "):
                rec.start(float(command.split()[1]))
        print(json.dumps(rec.to_json()), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in channels:
            await channel.close()


# ---------------------------------------------------------------- the parent


def read_rss_kb(pid: int) -> int:
    """VmRSS of `pid` in KiB (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def read_cpu_s(pid: int) -> float:
    """User + system CPU seconds `pid` has used, all its threads (0 once it is gone)."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class Keepalive:
    """Heartbeats every agent and renews the held leases from one thread, until stopped."""

    def __init__(self, stub: Any, agents: dict[str, Any], interval_s: float, rec: Recorder) -> None:
        self.stub, self.agents, self.interval_s, self.rec = stub, agents, interval_s, rec
        self.leases: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-keepalive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(RPC_TIMEOUT_S * 2)

    def _run(self) -> None:
        next_renew = time.monotonic() + RENEW_EVERY_S
        while not self._stop.wait(self.interval_s):
            start = time.perf_counter()
            beats = {agent: self.stub.Heartbeat.future(
                         tracker_pb2.HeartbeatRequest(agent_id=agent), timeout=RPC_TIMEOUT_S)
                     for agent in self.agents}  # fmt: skip
            for agent, beat in beats.items():
                try:
                    if not beat.result().known:
                        self.rec.errors["Heartbeat known=false (agent expired)"] += 1
                        self.stub.Register(self.agents[agent], timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as error:
                    self.rec.rpc_error("Heartbeat", error)
            self.rec.latency("heartbeat", (time.perf_counter() - start) * 1000.0)
            if time.monotonic() >= next_renew:
                next_renew += RENEW_EVERY_S
                for lease_id in self.leases:
                    renew = tracker_pb2.RenewRequest(lease_id=lease_id, lease_ttl_s=HOLD_TTL_S)
                    try:
                        if self.stub.Renew(renew, timeout=RPC_TIMEOUT_S).status != common_pb2.OK:
                            self.rec.errors["holder Renew DEVICE_LOST"] += 1
                    except grpc.RpcError as error:
                        self.rec.rpc_error("holder Renew", error)


@dataclass
class BadCalls:
    """The --bad-calls phase: answers by method and status, tracker RSS before and after."""

    sent: int
    answers: Counter[str]
    rss_before_kb: int
    rss_after_kb: int


def send_bad_calls(address: str, count: int, pid: int) -> BadCalls:
    """`count` undecodable calls, round-robin over every Tracker method and health Check/Watch."""
    service = tracker_pb2.DESCRIPTOR.services_by_name["Tracker"]
    paths = [f"/{service.full_name}/{method.name}" for method in service.methods]
    paths += [HEALTH_CHECK, HEALTH_WATCH]
    answers: Counter[str] = Counter()
    rss_before = read_rss_kb(pid)
    with grpc.insecure_channel(address) as channel:
        # No serializers: the bytes go out as they are and answers come back as bytes.
        calls = {path: channel.unary_unary(path) for path in paths}
        calls[HEALTH_WATCH] = channel.unary_stream(HEALTH_WATCH)
        for first in range(0, count, BAD_CALL_BATCH):
            batch = [
                paths[i % len(paths)] for i in range(first, min(count, first + BAD_CALL_BATCH))
            ]
            pending = [(path, calls[path](BAD_CALL, timeout=RPC_TIMEOUT_S) if path == HEALTH_WATCH
                        else calls[path].future(BAD_CALL, timeout=RPC_TIMEOUT_S))
                       for path in batch]  # fmt: skip
            for path, call in pending:
                name = path.rsplit("/", 1)[1]
                try:
                    if path == HEALTH_WATCH:
                        next(iter(call), None)  # a stream that answers at all is cut off here
                        call.cancel()
                    else:
                        call.result()
                    answers[f"{name} OK"] += 1
                except grpc.RpcError as error:
                    answers[f"{name} {error.code().name}"] += 1
    time.sleep(1.0)  # let the server drop what the calls left behind
    return BadCalls(count, answers, rss_before, read_rss_kb(pid))


@dataclass
class StoreResult:
    """One store's run."""

    store: str
    register_s: float
    steady_s: float
    rss_kb: list[int]  # at the start of the steady phase, then at the end of each slice
    rss_peak_kb: int
    rec: Recorder
    queued_at_start: int
    cpu_pct: dict[str, float]
    load_1m: float
    bad: BadCalls | None
    log_lines: list[str]

    @property
    def rss_growth_pct(self) -> float:
        return (self.rss_kb[-1] / self.rss_kb[0] - 1.0) * 100.0 if self.rss_kb[0] else math.nan

    @property
    def errors(self) -> int:
        return sum(self.rec.errors.values())

    @property
    def waiters(self) -> int:
        """Median queue depth of the busy key over the admin's steady-phase listings."""
        values = [v for slice_ in self.rec.readings.get("queued", []) for v in slice_]
        return int(statistics.median(values)) if values else self.queued_at_start


@contextlib.contextmanager
def started(args: Sequence[str], log_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process (stdin and stdout piped, stderr to `log_path`), stopped by its pid."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=REPO_ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The child's next stdout line, or RuntimeError after `timeout_s` or when it exits."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{proc.args!r} said nothing within {timeout_s} s (rc {proc.poll()})")
    return line


def tell(procs: Sequence[subprocess.Popen[str]], command: str) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()


def busy_queue_depth(stub: Any, rec: Recorder) -> int:
    try:
        reply = stub.ListDevices(
            tracker_pb2.ListDevicesRequest(key=BUSY_KEY), timeout=RPC_TIMEOUT_S
        )
    except grpc.RpcError as error:
        rec.rpc_error("ListDevices (queue depth poll)", error)
        return 0
    return max((status.queue_depth for status in reply.devices), default=0)


def register(stub: Any, devices: int, busy: int) -> dict[str, Any]:
    """Register `devices` devices (the first `busy` with the busy key) as few agents as allowed."""
    agents: dict[str, Any] = {}
    for first in range(0, devices, MAX_DEVICES_PER_AGENT):
        specs = [common_pb2.DeviceSpec(key=BUSY_KEY if i < busy else FREE_KEY, backend="null")
                 for i in range(first, min(devices, first + MAX_DEVICES_PER_AGENT))]  # fmt: skip
        agent_id = f"soak-agent-{len(agents)}"
        agents[agent_id] = tracker_pb2.RegisterRequest(
            agent_id=agent_id, agent_address=f"127.0.0.1:{20000 + len(agents)}", devices=specs
        )
    return agents


def run_store(
    args: argparse.Namespace, label: str, url: str, workdir: Path, redis_pid: int = 0
) -> StoreResult:
    """Start a tracker over `url`, load it, measure it, stop everything this started."""
    ready, log_path = workdir / f"tracker-{label}.ready", workdir / f"tracker-{label}.log"
    script = str(Path(__file__).resolve())
    rec = Recorder()
    tracker_args = ["-m", "tracker", "--listen", "127.0.0.1:0", "--store", url,
                    "--ready-file", str(ready), "--log-level", "warning"]  # fmt: skip
    with contextlib.ExitStack() as stack:
        tracker = stack.enter_context(started(tracker_args, log_path))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if tracker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tracker not ready:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        address = ready.read_text().splitlines()[0]
        channel = stack.enter_context(grpc.insecure_channel(address))
        stub = tracker_pb2_grpc.TrackerStub(channel)
        agents = register(stub, args.devices, args.busy_devices)
        start = time.perf_counter()
        interval_s = min(stub.Register(r, timeout=RPC_TIMEOUT_S).heartbeat_interval_s
                         for r in agents.values())  # fmt: skip
        register_s = time.perf_counter() - start
        keepalive = Keepalive(stub, agents, interval_s, rec)
        keepalive.start()
        stack.callback(keepalive.stop)
        for _ in range(args.busy_devices):
            reply = stub.Acquire(tracker_pb2.AcquireRequest(
                key=BUSY_KEY, timeout_s=5.0, lease_ttl_s=HOLD_TTL_S, user="soak-holder"),
                timeout=RPC_TIMEOUT_S)  # fmt: skip
            if reply.status != common_pb2.OK:
                raise RuntimeError(f"could not lease a busy device: {reply.reason}")
            keepalive.leases.append(reply.lease.lease_id)
        bad = send_bad_calls(address, args.bad_calls, tracker.pid) if args.bad_calls else None

        role = [script, "--tracker", address, "--devices", str(args.devices)]
        per_proc = [args.clients // args.client_procs + (i < args.clients % args.client_procs)
                    for i in range(args.client_procs)]  # fmt: skip
        children = [stack.enter_context(started(
            [*role, "--role", "waiters", "--count", str(args.waiters),
             "--pause-ms", str(args.list_pause_ms), "--page-size", str(args.list_page_size)],
            workdir / f"waiters-{label}.log"))]  # fmt: skip
        children += [stack.enter_context(started(
            [*role, "--role", "clients", "--count", str(n), "--pause-ms", str(args.client_pause_ms)],
            workdir / f"clients-{label}.log")) for n in per_proc if n]  # fmt: skip
        for child in children:
            if read_line(child, START_TIMEOUT_S).strip() != "ready":
                raise RuntimeError(f"{child.args!r} did not say ready")
        tell(children, "go")
        deadline = time.monotonic() + QUEUE_TIMEOUT_S
        while (queued := busy_queue_depth(stub, rec)) < args.waiters:
            if time.monotonic() > deadline:
                print(f"{label}: only {queued} of {args.waiters} waiters queued after "
                      f"{QUEUE_TIMEOUT_S:.0f} s; going on", file=sys.stderr)  # fmt: skip
                break
            time.sleep(0.5)
        time.sleep(WARMUP_S)

        steady_s = args.minutes * 60.0
        pids = {"tracker": tracker.pid, "children": 0, "this": os.getpid()}
        if redis_pid:
            pids["redis"] = redis_pid
        cpu_before = {name: read_cpu_s(pid) for name, pid in pids.items() if pid}
        cpu_before["children"] = sum(read_cpu_s(child.pid) for child in children)
        rss, peak = [read_rss_kb(tracker.pid)], 0
        start = time.perf_counter()
        rec.start(steady_s)
        tell(children, f"measure {steady_s}")
        for index in range(1, SLICES + 1):
            while (now := time.perf_counter() - start) < steady_s * index / SLICES:
                time.sleep(min(1.0, steady_s * index / SLICES - now))
                peak = max(peak, read_rss_kb(tracker.pid))
                if tracker.poll() is not None:
                    raise RuntimeError(f"tracker exited:\n{log_path.read_text()[-2000:]}")
            rss.append(read_rss_kb(tracker.pid))
        elapsed = time.perf_counter() - start
        cpu_pct = {name: (read_cpu_s(pid) - cpu_before[name]) / elapsed * 100.0
                   for name, pid in pids.items() if pid}  # fmt: skip
        cpu_pct["children"] = (
            (sum(read_cpu_s(c.pid) for c in children) - cpu_before["children"]) / elapsed * 100.0
        )
        load_1m = os.getloadavg()[0]
        tell(children, "stop")
        for child in children:
            rec.merge_json(json.loads(read_line(child, RPC_TIMEOUT_S * 3)))
    log_lines = [line for line in log_path.read_text(errors="replace").splitlines()
                 if " WARNING " in line or " ERROR " in line or "Traceback" in line]  # fmt: skip
    return StoreResult(label, register_s, elapsed, rss, max(peak, *rss), rec, queued, cpu_pct,
                       load_1m, bad, log_lines)  # fmt: skip


# ---------------------------------------------------------------- the report


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{what} x{n}" for what, n in counter.most_common()) or "none"


def report(args: argparse.Namespace, results: Sequence[StoreResult]) -> None:
    procs = 1 + min(args.client_procs, args.clients)
    print()
    print(
        f"{args.devices:,} devices ({math.ceil(args.devices / MAX_DEVICES_PER_AGENT)} agents), "
        f"{args.busy_devices} busy devices held; {args.waiters} waiters on the busy key "
        f"({WAITER_TIMEOUT_S[0]:.0f}-{WAITER_TIMEOUT_S[1]:.0f} s timeouts); {args.clients} "
        f"clients: Acquire+Release on the free key, {args.client_pause_ms:g} ms apart; 1 admin: "
        f"ListDevices {args.list_pause_ms:g} ms apart (paging: {'yes' if PAGED else 'no'})"
    )
    print(
        f"load: {procs} child processes, one asyncio thread each (waiters+admin over "
        f"{WAITER_CHANNELS + 1} channels; {args.clients} clients in {procs - 1}, one channel "
        f"each); this process registers, heartbeats and renews (1 thread). Steady phase "
        f"{args.minutes:g} min after {WARMUP_S:g} s of warm-up; pair = Acquire+Release"
    )
    print()
    head = (f"{'store':<7} {'slice_s':>9} {'pairs':>7} {'pairs/s':>7} {'p50_ms':>7} "
            f"{'p99_ms':>7} {'max_ms':>7} {'lists':>6} {'list_p50':>8} {'list_p99':>8} "
            f"{'list_max':>8} {'queued':>6} {'rss_mb':>7}")  # fmt: skip
    print(head)
    for r in results:
        pairs, lists = r.rec.series.get("pair", []), r.rec.series.get("list", [])
        queued = r.rec.readings.get("queued", [[] for _ in range(SLICES)])
        slice_s = r.steady_s / SLICES
        rows = [(f"{i * slice_s:.0f}-{(i + 1) * slice_s:.0f}", pairs[i] if pairs else Histogram(),
                 lists[i] if lists else Histogram(), queued[i], r.rss_kb[i + 1], slice_s)
                for i in range(SLICES)]  # fmt: skip
        rows.append(("all", r.rec.whole("pair"), r.rec.whole("list"),
                     [v for s in queued for v in s], r.rss_kb[-1], r.steady_s))  # fmt: skip
        for name, pair, listed, depth, rss_kb, span_s in rows:
            print(
                f"{r.store:<7} {name:>9} {pair.count:>7} {pair.count / span_s:>7.0f} "
                f"{_ms(pair.percentile(0.5)):>7} {_ms(pair.percentile(0.99)):>7} "
                f"{_ms(pair.max_ms):>7} {listed.count:>6} {_ms(listed.percentile(0.5)):>8} "
                f"{_ms(listed.percentile(0.99)):>8} {_ms(listed.max_ms):>8} "
                f"{int(statistics.median(depth)) if depth else '-':>6} {rss_kb / 1024:>7.1f}"
            )
    print()
    print(f"{'store':<7} {'register_s':>10} {'rss_start':>9} {'rss_end':>8} {'peak':>7} "
          f"{'growth%':>7} {'pages':>5} {'listing_p99':>11} {'hb_p99':>7} {'hb_max':>7} {'errors':>6}   "
          f"cpu % of a core (tracker, redis, children, this; load 1m)")  # fmt: skip
    for r in results:
        hb, listing = r.rec.whole("heartbeat"), r.rec.whole("listing")
        per_listing = [v for slice_ in r.rec.readings.get("pages", []) for v in slice_]
        pages = max(per_listing) if per_listing else "-"
        cpu = ", ".join(f"{name} {r.cpu_pct[name]:.0f}" for name in
                        ("tracker", "redis", "children", "this") if name in r.cpu_pct)  # fmt: skip
        print(
            f"{r.store:<7} {r.register_s:>10.3f} {r.rss_kb[0] / 1024:>9.1f} "
            f"{r.rss_kb[-1] / 1024:>8.1f} {r.rss_peak_kb / 1024:>7.1f} {r.rss_growth_pct:>7.2f} "
            f"{pages:>5} {_ms(listing.percentile(0.99)):>11} {_ms(hb.percentile(0.99)):>7} "
            f"{_ms(hb.max_ms):>7} {r.errors:>6}   {cpu}; load {r.load_1m:.2f}"
        )
    for r in results:
        print(f"{r.store} errors: {_counts(r.rec.errors)}")
        print(f"{r.store} expected: {_counts(r.rec.expected)}")
        if r.bad is not None:
            grew = (r.bad.rss_after_kb - r.bad.rss_before_kb) / 1024
            print(f"{r.store} bad calls: {r.bad.sent} sent, rss {r.bad.rss_before_kb / 1024:.1f} -> "
                  f"{r.bad.rss_after_kb / 1024:.1f} MB ({grew:+.2f} MB, "
                  f"{grew * 1024 / r.bad.sent:.2f} KB/call); answers: {_counts(r.bad.answers)}")  # fmt: skip
        print(f"{r.store} tracker log: {len(r.log_lines)} warning/error lines"
              + "".join(f"\n    {line[:160]}" for line in r.log_lines[:3]))  # fmt: skip
    for r in results:
        floor = r.rec.whole("floor")
        print(f"{r.store} floor: two empty health Checks, {args.client_pause_ms:g} ms apart "
              f"under the same load, p50 {_ms(floor.percentile(0.5))} ms, p99 "
              f"{_ms(floor.percentile(0.99))} ms ({floor.count} pairs); the pair's p50 is "
              f"{r.rec.whole('pair').percentile(0.5) / floor.percentile(0.5):.1f}x it")  # fmt: skip
    print("targets: rss_growth_pct < 10, errors = 0, list_p99_ms < 50 with 500 waiters, "
          "acquire_p50_ms < 2, acquire_p99_ms < 20 (pair = Acquire+Release)")  # fmt: skip
    for r in results:
        pair = r.rec.whole("pair")
        line = (f"soak: store={r.store} rss_growth_pct={r.rss_growth_pct:.2f} errors={r.errors} "
                f"list_p99_ms={r.rec.whole('list').percentile(0.99):.3f} "
                f"acquire_p50_ms={pair.percentile(0.5):.3f} "
                f"acquire_p99_ms={pair.percentile(0.99):.3f} waiters={r.waiters} "
                f"floor_p50_ms={r.rec.whole('floor').percentile(0.5):.3f}")  # fmt: skip
        if r.bad is not None:
            line += (
                f" bad_calls_rss_growth_mb={(r.bad.rss_after_kb - r.bad.rss_before_kb) / 1024:.2f}"
            )
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak (or, with --role, one of its child processes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=5.0, help="steady phase per store")
    parser.add_argument("--stores", default="memory,redis", help="comma-separated, run in order")
    parser.add_argument("--bad-calls", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--busy-devices", type=int, default=4)
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--client-pause-ms", type=float, default=100.0)
    parser.add_argument("--list-pause-ms", type=float, default=100.0)
    parser.add_argument("--list-page-size", type=int, default=0, help="0: the tracker's default")
    parser.add_argument("--role", choices=["waiters", "clients"], help=argparse.SUPPRESS)
    parser.add_argument("--tracker", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pause-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--page-size", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        asyncio.run(_child(args))
        return 0
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"memory", "redis"}:
        parser.error("--stores takes memory and/or redis")
    if args.minutes <= 0 or args.busy_devices < 1 or args.devices <= args.busy_devices:
        parser.error("need --minutes > 0 and 1 <= --busy-devices < --devices")
    args.client_procs = max(1, args.client_procs)
    results = []
    with tempfile.TemporaryDirectory(prefix="kiln-soak-") as tmp:
        workdir = Path(tmp)
        for store in stores:
            if store == "memory":
                results.append(run_store(args, store, "memory", workdir))
                continue
            with RedisServer(workdir / "redis") as redis_server:
                assert redis_server.process is not None
                url = redis_server.url(prefix=f"soak-{os.getpid()}:")
                pid = redis_server.process.pid
                results.append(run_store(args, store, url, workdir, pid))
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
