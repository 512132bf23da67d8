"""Agent benchmark: the per-candidate cycle through a real tracker and cpu agents; timing noise.

    .venv/bin/python benchmarks/measure.py [--candidates 200] [--noise-repeats 30] [--rounds 15]

A `kiln-tracker` and three `kiln-agent` processes (cpu backend, one device each) start on 127.0.0.1:
two unpinned agents for the cycle and throughput figures, and one more under its own key whose
executor child is pinned (`--pin-cores`) to one core, used only by the noise matrix.
Every candidate is one full cycle with raw gRPC stubs, the protocol of tuner.measure.pool_runner: Acquire
a lease, Has -> skip or Upload (Has only for an artifact this client has not seen on that agent;
a Measure answered with the hash in missing_sha256 re-uploads and measures again), Measure
(number=1, repeat=1) of a small kernel, Release. Two kinds of candidate, interleaved so that both
see the same machine noise:

    cached   the same artifact every time (after the first cycle on each agent: no Has, no upload)
    upload   a new ~20 KB artifact every time (a constant in the C source differs, so each hash is
             new); all of them are compiled before any timing starts

Then candidates/s with both agents busy (two client threads, cached artifact), and the noise of
the device timings, a matrix: two kernels (~1 ms and ~10 us per call: their loop count is calibrated
on an agent first, and the measured per-call time is printed) under every combination of

    pinning    the pinned agent (executor child on one core) vs an unpinned one
    flush      EvaluatorConfig.flush_cache_bytes 0 vs 8 MiB swept between repeats
    cooldown   EvaluatorConfig.cooldown_ms 0 vs 1 ms slept between repeats

with one call per repeat, and two more settings timed the tuner's own way: repeats of at least
20 ms (`min_repeat_ms`, the calls of a repeat averaged), pinned and not.

Each cell is one Measure of `--noise-repeats` repeats (warmup=2, number=1 to start); its coefficient of
variation (CV = stdev / mean of the repeats) is one sample. Every round measures all cells, in a
seeded shuffled order, so that all settings see the same machine noise; after one discarded warm-up
round, `--rounds` rounds are kept and the median CV per setting is reported, with the setting of the
lowest median CV for the ~1 ms kernel named.

The "vs TVM" column is NOT measured here: TVM 0.27's RPC tracker did the same full cycle in ~98 ms
on this machine according to /work/shared/REFERENCE.md; TVM is not installed in this environment,
so that figure is quoted from there and labelled "quoted" wherever it is printed.

Ends with one line:
    measure: cycle_cached_p50_ms=<ms> cycle_upload_p50_ms=<ms> candidates_per_s=<n> cv_1ms_pct=<x>
where cv_1ms_pct is the lowest median CV (in percent) of the ~1 ms kernel over the noise settings.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from device_agent.testing import TIMING_C, wait_for_ready_file  # noqa: E402
from protos import agent_pb2, agent_pb2_grpc, common_pb2, tracker_pb2, tracker_pb2_grpc  # noqa: E402

KEY = "bench-cpu"
# The noise matrix's pinned agent; never leased by the cycle and throughput figures.
PINNED_KEY = "bench-cpu-pinned"
RPC_S = 30.0
# QUOTED, not measured (TVM is not installed here): REFERENCE.md, TVM 0.27 RPC tracker, full
# candidate cycle on loopback.
TVM_CYCLE_MS = 98.0
TVM_LABEL = f"vs TVM {TVM_CYCLE_MS:.0f} ms (quoted, REFERENCE.md)"
FLUSH_BYTES = 8 << 20
COOLDOWN_MS = 1.0
MIN_REPEAT_MS = 20.0  # the tuner's default (EvaluatorConfig.min_repeat_ms)
N = 256
# ~20 KB: the padding table is read by the kernel, so the linker keeps it.
SMALL_C = (
    TIMING_C
    + r"""
#define N %(n)d
static const volatile unsigned char pad[%(pad)d] = {%(k)d};
int32_t small(void **args) {
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  float k = (float)(pad[0] + %(k)d);
  for (int i = 0; i < N; ++i) y[i] = x[i] * 2.0f + k;
  return 0;
}
TIMED(small)
"""
)
# `sweeps` passes of y = 0.5 y + x over `m` floats: the ~1 ms kernel works on 256 KB (fits in L2: a
# flush between repeats matters), the ~10 us one on 32 KB. The number of sweeps is calibrated on the
# agent (see `calibrate`); the per-call time actually measured is printed.
NOISE_C = (
    TIMING_C
    + r"""
#define M %(m)d
int32_t noise(void **args) {
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  for (int r = 0; r < %(sweeps)d; ++r)
    for (int i = 0; i < M; ++i) y[i] = y[i] * 0.5f + x[i];
  return 0;
}
TIMED(noise)
"""
)
# (label, target seconds per call, floats, sweeps to calibrate with): the label is the target.
NOISE_KERNELS = (("1 ms", 1e-3, 64 * 1024, 24), ("10 us", 10e-6, 4 * 1024, 4))


@dataclass(frozen=True)
class Built:
    data: bytes
    meta: common_pb2.ArtifactMeta


def build(source: str, symbol: str, n: int, workdir: Path, tag: str) -> Built:
    """Compile `source` with gcc -O2 into a shared object and describe its one entry."""
    c_path, so_path = workdir / f"{tag}.c", workdir / f"{tag}.so"
    c_path.write_text(source)
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", str(so_path), str(c_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    data = so_path.read_bytes()
    args = [
        common_pb2.TensorSpec(name="x", shape=[n], dtype="float32", role=common_pb2.INPUT),
        common_pb2.TensorSpec(name="y", shape=[n], dtype="float32", role=common_pb2.OUTPUT),
    ]
    entry = common_pb2.EntryPoint(symbol=symbol, timing_symbol=symbol + "__time", args=args)
    meta = common_pb2.ArtifactMeta(
        sha256=hashlib.sha256(data).hexdigest(),
        format=common_pb2.SHARED_OBJECT,
        target="host",
        entries=[entry],
        size_bytes=len(data),
    )
    return Built(data, meta)


def build_small(k: int, workdir: Path) -> Built:
    return build(SMALL_C % {"n": N, "pad": 4 * 1024, "k": k}, "small", N, workdir, f"small{k}")


def build_noise(m: int, sweeps: int, workdir: Path) -> Built:
    return build(NOISE_C % {"m": m, "sweeps": sweeps}, "noise", m, workdir, f"noise{m}x{sweeps}")


class Pool:
    """A tracker, two unpinned cpu agents (KEY) and one cpu agent whose executor child is pinned
    to `pin_core` (PINNED_KEY), as child processes; ends them (by pid) on exit, also when a start
    fails."""

    def __init__(self, workdir: Path, pin_core: int) -> None:
        self.workdir = workdir
        self.pin_core = pin_core
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tracker = ""

    def _spawn(self, name: str, args: list[str]) -> str:
        ready = self.workdir / f"{name}.ready"
        with open(self.workdir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, *args, "--ready-file", str(ready), "--log-level", "warning"],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return wait_for_ready_file(proc, str(ready), 60.0)

    def _spawn_agent(self, name: str, key: str, extra: list[str]) -> None:
        agent = ["-m", "device_agent", "--tracker", self.tracker, "--key", key]
        agent += ["--cache-dir", str(self.workdir / f"cache-{name}"), "--listen", "127.0.0.1:0"]
        self._spawn(name, agent + extra)

    def __enter__(self) -> Pool:
        try:
            self.tracker = self._spawn("tracker", ["-m", "tracker", "--listen", "127.0.0.1:0"])
            for i in range(2):
                # Not pinned: on a shared 2-core host a pinned child waits for its one core to wake.
                self._spawn_agent(f"agent{i}", KEY, [])
            self._spawn_agent("pinned", PINNED_KEY, ["--pin-cores", str(self.pin_core)])
            self._wait_registered({KEY: 2, PINNED_KEY: 1})
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_registered(self, want: dict[str, int]) -> None:
        with grpc.insecure_channel(self.tracker) as channel:
            stub = tracker_pb2_grpc.TrackerStub(channel)
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                have = {}
                for key in want:
                    request = tracker_pb2.ListDevicesRequest(key=key)
                    have[key] = len(stub.ListDevices(request, timeout=RPC_S).devices)
                if have == want:
                    return
                time.sleep(0.05)
        raise RuntimeError(f"the agents did not register within 60 s (wanted {want})")

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15.0)


class Client:
    """One client thread's stubs: a tracker channel and a channel per agent address."""

    def __init__(self, tracker: str) -> None:
        self._tracker_channel = grpc.insecure_channel(tracker)
        self.tracker = tracker_pb2_grpc.TrackerStub(self._tracker_channel)
        self._agents: dict[str, tuple[grpc.Channel, agent_pb2_grpc.AgentStub]] = {}
        self.held: set[tuple[str, str]] = set()  # (agent address, sha256) known to be there
        # Milliseconds per RPC of every cycle, by phase: where a cycle's time goes.
        self.phases: dict[str, list[float]] = {
            "Acquire": [],
            "Has": [],
            "Upload": [],
            "Measure": [],
            "Release": [],
        }

    def agent(self, address: str) -> agent_pb2_grpc.AgentStub:
        if address not in self._agents:
            channel = grpc.insecure_channel(address)
            self._agents[address] = (channel, agent_pb2_grpc.AgentStub(channel))
        return self._agents[address][1]

    def close(self) -> None:
        for channel, _ in self._agents.values():
            channel.close()
        self._tracker_channel.close()

    def cycle(
        self, art: Built, config: common_pb2.EvaluatorConfig, key: str = KEY
    ) -> common_pb2.MeasureResult:
        """Acquire (a device of `key`), Has -> skip or Upload (Has only for an artifact new to that
        agent), Measure, Release: one candidate."""
        clock = [time.perf_counter()]

        def lap(phase: str) -> None:
            clock.append(time.perf_counter())
            self.phases[phase].append((clock[-1] - clock[-2]) * 1e3)

        acquired = self.tracker.Acquire(
            tracker_pb2.AcquireRequest(key=key, timeout_s=RPC_S, user="bench"), timeout=RPC_S * 2
        )
        lap("Acquire")
        if acquired.status != common_pb2.OK:
            raise RuntimeError(f"no device: {acquired.reason}")
        lease = acquired.lease
        try:
            agent = self.agent(lease.device.agent_address)
            sha = art.meta.sha256
            held = (lease.device.agent_address, sha)
            if held not in self.held:  # as PoolRunner: ask Has once per (agent, artifact)
                present = agent.Has(agent_pb2.HasRequest(sha256=sha), timeout=RPC_S).present
                lap("Has")
                if not present:
                    agent.Upload(_chunks(art), timeout=RPC_S)
                    lap("Upload")
                self.held.add(held)
            request = agent_pb2.MeasureRequest(
                device_id=lease.device.device_id,
                lease_id=lease.lease_id,
                lease_token=lease.token,
                artifact_sha256=sha,
                symbol=art.meta.entries[0].symbol,
                config=config,
            )
            result: common_pb2.MeasureResult = agent.Measure(request, timeout=RPC_S)
            if sha in result.missing_sha256:  # evicted since: upload and measure again
                agent.Upload(_chunks(art), timeout=RPC_S)
                result = agent.Measure(request, timeout=RPC_S)
            lap("Measure")
        finally:
            self.tracker.Release(tracker_pb2.ReleaseRequest(lease_id=lease.lease_id), timeout=RPC_S)
            lap("Release")
        if result.status != common_pb2.OK:
            raise RuntimeError(f"measure failed: {common_pb2.Status.Name(result.status)}")
        return result


def _chunks(art: Built) -> Iterator[agent_pb2.UploadChunk]:
    yield agent_pb2.UploadChunk(meta=art.meta, data=art.data)


ONE = common_pb2.EvaluatorConfig(number=1, repeat=1)


def timed_cycle(client: Client, art: Built) -> float:
    start = time.perf_counter()
    client.cycle(art, ONE)
    return (time.perf_counter() - start) * 1e3


def throughput(tracker: str, art: Built, total: int) -> float:
    """Candidates per second from two client threads, each doing total/2 full cycles."""
    clients = [Client(tracker) for _ in range(2)]
    for c in clients:  # connect both agents' channels before timing
        for _ in range(3):
            c.cycle(art, ONE)
    barrier = threading.Barrier(2)

    def work(c: Client) -> None:
        barrier.wait()
        for _ in range(total // 2):
            c.cycle(art, ONE)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(work, clients))
    wall = time.perf_counter() - start
    for c in clients:
        c.close()
    return (total // 2) * 2 / wall


def cv(samples: list[float]) -> float:
    return statistics.stdev(samples) / statistics.mean(samples)


def outliers(samples: list[float]) -> float:
    """The fraction of samples over 1.5x the median: repeats another process preempted."""
    median = statistics.median(samples)
    return sum(s > 1.5 * median for s in samples) / len(samples)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Setting:
    """One point of the noise matrix: the agent (pinned or not) and the EvaluatorConfig knobs."""

    pinned: bool
    flush_bytes: int
    cooldown_ms: float
    min_repeat_ms: float = 0.0  # > 0: a repeat averages as many calls as fill this (number grows)

    def label(self, pin_core: int, pad: bool = True) -> str:
        pin = f"core {pin_core}" if self.pinned else "no"
        flush = f"{self.flush_bytes >> 20} MiB" if self.flush_bytes else "0"
        calls = f" repeat>={self.min_repeat_ms:g} ms" if self.min_repeat_ms else ""
        if not pad:
            return f"pin={pin} flush={flush} cooldown={self.cooldown_ms:g} ms{calls}"
        return f"pin={pin:<6} flush={flush:<5} cooldown={self.cooldown_ms:g} ms{calls}"

    def config(self, repeats: int) -> common_pb2.EvaluatorConfig:
        return common_pb2.EvaluatorConfig(
            warmup=2,
            number=1,
            repeat=repeats,
            min_repeat_ms=self.min_repeat_ms,
            flush_cache_bytes=self.flush_bytes,
            cooldown_ms=self.cooldown_ms,
        )


# Every combination of pinning, flush and cooldown with one call per repeat, and the tuner's
# own way (repeats of at least MIN_REPEAT_MS, calls averaged) pinned and not.
SETTINGS = (
    *(
        Setting(pinned, flush, cooldown)
        for pinned in (False, True)
        for flush in (0, FLUSH_BYTES)
        for cooldown in (0.0, COOLDOWN_MS)
    ),
    Setting(False, 0, 0.0, MIN_REPEAT_MS),
    Setting(True, 0, 0.0, MIN_REPEAT_MS),
)


def calibrate(
    client: Client, workdir: Path, m: int, sweeps: int, target_s: float
) -> tuple[Built, int]:
    """The noise kernel over `m` floats with as many sweeps as take ~`target_s` per call on an
    (unpinned) agent: timed, then rebuilt with the sweeps scaled to the target, twice at most and
    not once within 10% of it. Returns the kernel and its sweeps. Bounded: at most 3 builds and 2
    Measure calls."""
    config = common_pb2.EvaluatorConfig(warmup=3, number=1, repeat=15)
    art = build_noise(m, sweeps, workdir)
    for _ in range(2):
        per_call = statistics.median(client.cycle(art, config).samples_s)
        scaled = max(1, round(target_s * sweeps / per_call))
        if abs(per_call - target_s) <= 0.1 * target_s or scaled == sweeps:
            break
        sweeps, art = scaled, build_noise(m, scaled, workdir)
    return art, sweeps


@dataclass
class Cell:
    """One (setting, kernel) of the noise matrix: per kept round, the CV, the outlier fraction and
    the median per-call time of that round's repeats."""

    cvs: list[float]
    stolen: list[float]
    per_call_s: list[float]


def noise_matrix(
    client: Client, kernels: dict[str, Built], repeats: int, rounds: int
) -> dict[tuple[Setting, str], Cell]:
    """Every (setting, kernel) once per round, in a seeded shuffled order per round so that all
    settings share the machine's noise; round 0 is a warm-up (uploads, executor start, page faults)
    and is dropped. Bounded: (rounds + 1) x len(SETTINGS) x len(kernels) Measure calls."""
    cells = [(setting, label) for setting in SETTINGS for label in kernels]
    out = {cell: Cell([], [], []) for cell in cells}
    for rnd in range(rounds + 1):
        order = list(cells)
        random.Random(rnd).shuffle(order)
        for setting, label in order:
            key = PINNED_KEY if setting.pinned else KEY
            result = client.cycle(kernels[label], setting.config(repeats), key)
            if result.number_used != 1 and not setting.min_repeat_ms:
                raise RuntimeError(f"expected number=1, the agent used {result.number_used}")
            if rnd == 0:
                continue
            samples = list(result.samples_s)
            cell = out[(setting, label)]
            cell.cvs.append(cv(samples))
            cell.stolen.append(outliers(samples))
            cell.per_call_s.append(statistics.median(samples))
    return out


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def print_noise(
    matrix: dict[tuple[Setting, str], Cell],
    shapes: dict[str, str],
    repeats: int,
    rounds: int,
    core: int,
) -> Setting:
    """The noise table; returns the setting with the lowest median CV for the first kernel."""
    labels = list(shapes)
    base = SETTINGS[0]  # unpinned, no flush, no cooldown
    print(
        f"noise: {repeats} repeats per cell (warmup=2, number=1), {rounds} rounds kept after 1 "
        "warm-up, cells shuffled within each round"
    )
    for label in labels:
        per_call = fmt_time(statistics.median(matrix[(base, label)].per_call_s))
        print(
            f"  ~{label} kernel: {shapes[label]}, {per_call} per call (unpinned, no flush/cooldown)"
        )
    print("CV = stdev/mean of one cell's repeats; med = median over rounds, range = min-max;")
    print(">1.5x = median share of repeats over 1.5x their median (preempted)")
    print()
    width = 51
    block = f"  {'per call':>9}{'CV med':>8}{'CV range':>13}{'>1.5x':>6}"
    print(
        f"{'':<{width}}" + "".join(f"{'~' + label + ' kernel':^{len(block)}}" for label in labels)
    )
    print(f"{'setting':<{width}}" + block * len(labels))
    for setting in SETTINGS:
        row = f"{setting.label(core):<{width}}"
        for label in labels:
            cell = matrix[(setting, label)]
            spread = f"{min(cell.cvs) * 100:.2f}-{max(cell.cvs) * 100:.2f}%"
            row += (
                f"  {fmt_time(statistics.median(cell.per_call_s)):>9}"
                f"{statistics.median(cell.cvs) * 100:>7.2f}%"
                f"{spread:>13}"
                f"{statistics.median(cell.stolen) * 100:>5.0f}%"
            )
        print(row)
    print()
    winners = {
        label: min(SETTINGS, key=lambda st: statistics.median(matrix[(st, label)].cvs))
        for label in labels
    }
    for label, winner in winners.items():
        median = statistics.median(matrix[(winner, label)].cvs) * 100
        print(f"lowest median CV, ~{label} kernel: {winner.label(core, pad=False)} ({median:.2f}%)")
    return winners[labels[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--noise-repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if args.candidates < 2 or args.noise_repeats < 2 or args.rounds < 1:
        parser.error("--candidates and --noise-repeats must be at least 2, --rounds at least 1")
    pin_core = max(os.sched_getaffinity(0))  # the pinned agent's executor child runs here

    with tempfile.TemporaryDirectory(prefix="kiln-measure-bench-") as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            fresh = list(pool.map(lambda k: build_small(k, workdir), range(1, args.candidates + 1)))
        cached = build_small(0, workdir)
        sizes = sorted(len(b.data) for b in fresh)
        print(
            f"built {len(fresh) + 1} artifacts in {time.perf_counter() - t0:.1f} s "
            f"(new ones {sizes[0]}-{sizes[-1]} bytes)"
        )
        with Pool(workdir, pin_core) as pool_:
            client = Client(pool_.tracker)
            for _ in range(10):  # warm: channels, executor children, the cached artifact
                client.cycle(cached, ONE)
            for values in client.phases.values():
                values.clear()
            cached_ms, upload_ms = [], []
            for art in fresh:  # interleaved: cached, upload, cached, upload, ...
                cached_ms.append(timed_cycle(client, cached))
                upload_ms.append(timed_cycle(client, art))
            phases = {k: list(v) for k, v in client.phases.items()}
            per_s = throughput(pool_.tracker, cached, args.candidates)
            t_noise = time.perf_counter()
            kernels, shapes = {}, {}
            for label, target, m, sweeps in NOISE_KERNELS:
                kernels[label], used = calibrate(client, workdir, m, sweeps, target)
                shapes[label] = f"{m // 1024} Ki floats x {used} sweeps"
            matrix = noise_matrix(client, kernels, args.noise_repeats, args.rounds)
            noise_s = time.perf_counter() - t_noise
            client.close()

    cached_p50, upload_p50 = statistics.median(cached_ms), statistics.median(upload_ms)
    print()
    print(f"{'cycle (ms)':<24}{'p50':>8}{'p90':>8}{'p99':>8}  {TVM_LABEL}")
    for label, values in (("cached artifact", cached_ms), ("new ~20 KB upload", upload_ms)):
        p50 = statistics.median(values)
        print(
            f"{label:<24}{p50:>8.2f}{percentile(values, 0.9):>8.2f}"
            f"{percentile(values, 0.99):>8.2f}  {TVM_CYCLE_MS / p50:>.1f}x"
        )
    print(f"{'candidates/s, 2 agents busy':<32}{per_s:>8.0f}")
    print()
    print(
        "one RPC, p50 ms: "
        + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items())
    )
    print()
    best = print_noise(matrix, shapes, args.noise_repeats, args.rounds, pin_core)
    cv_1ms = statistics.median(matrix[(best, NOISE_KERNELS[0][0])].cvs) * 100
    print(f"(noise matrix: {noise_s:.1f} s)")
    print()
    print(
        f"measure: cycle_cached_p50_ms={cached_p50:.2f} cycle_upload_p50_ms={upload_p50:.2f} "
        f"candidates_per_s={per_s:.0f} cv_1ms_pct={cv_1ms:.2f}"
    )


if __name__ == "__main__":
    main()
