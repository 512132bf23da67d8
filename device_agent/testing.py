"""Test kit: hand-written C kernels that implement the SHARED_OBJECT ABI, built with gcc.

For tests of the agent and of everything above it that needs a real artifact. Entries of the one
shared object `build_kernels` makes, all over `x: float32[N]` (INPUT) and `y: float32[N]` (OUTPUT)
unless noted:

    add_one    y = x + 1                        add_two    y = x + 2 (a wrong "reference")
    crash      raise(SIGSEGV)                   hang       spins forever
    fail       returns 1                        alloc_big  returns 3 when malloc(4 GiB) fails
    divzero    integer division by zero (SIGFPE on x86; aarch64 does not trap and returns 0)
    aborts     abort() (SIGABRT)                alloc_huge returns 3 when malloc(100 GB) fails
    stamp      t: int64[2] (OUTPUT) = CLOCK_MONOTONIC ns before and after sleeping STAMP_SLEEP_MS
    jitter     y = x + 1, sleeping JITTER_SLEEP_MS more on every other call (a noisy timing)
    absent     listed in the meta, missing from the object (LOAD_ERROR)

`build_kernels(dir, cc="aarch64-linux-gnu-gcc")` cross-compiles the same source for the qemu
backend. `TIMING_C` (the timing loop a code generator emits, written by hand) is reusable by other
hand-written kernels, such as the benchmark's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec

N = 1024

STAMP_SLEEP_MS = 100
JITTER_SLEEP_MS = 2

TIMING_C = r"""
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
  int32_t warmup, number, repeat;
  double min_repeat_ms, cooldown_ms;
  void *flush_buf;
  int64_t flush_bytes;
} kiln_timing_config;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int32_t run_n(int32_t (*fn)(void **), void **args, int32_t n) {
  for (int32_t i = 0; i < n; ++i)
    if (fn(args) != 0) return 1;
  return 0;
}

/* The timing loop a code generator emits beside each kernel, written out by hand. */
static int32_t kiln_time(int32_t (*fn)(void **), void **args, const kiln_timing_config *cfg,
                         double *samples_s, int32_t *number_used) {
  int32_t number = cfg->number > 0 ? cfg->number : 1;
  if (run_n(fn, args, cfg->warmup)) return 1;
  while (cfg->min_repeat_ms > 0 && number < (1 << 24)) {
    double t0 = now_s();
    if (run_n(fn, args, number)) return 1;
    if ((now_s() - t0) * 1e3 >= cfg->min_repeat_ms) break;
    number *= 2;
  }
  for (int32_t r = 0; r < cfg->repeat; ++r) {
    if (cfg->flush_bytes > 0) {
      volatile char *b = (volatile char *)cfg->flush_buf;
      for (int64_t i = 0; i < cfg->flush_bytes; i += 64) b[i] += 1;
    }
    if (r > 0 && cfg->cooldown_ms > 0) {
      struct timespec d = {(time_t)(cfg->cooldown_ms / 1e3),
                           (long)((cfg->cooldown_ms - 1e3 * (double)(time_t)(cfg->cooldown_ms / 1e3)) * 1e6)};
      nanosleep(&d, NULL);
    }
    double t0 = now_s();
    if (run_n(fn, args, number)) return 1;
    samples_s[r] = (now_s() - t0) / number;
  }
  *number_used = number;
  return 0;
}

#define TIMED(name)                                                                 \
  int32_t name##__time(void **args, const kiln_timing_config *cfg, double *samples_s, \
                       int32_t *number_used) {                                      \
    return kiln_time(name, args, cfg, samples_s, number_used);                      \
  }
"""

KERNELS_C = (
    TIMING_C
    + r"""
#define N %(n)d

int32_t add_one(void **args) {
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  for (int i = 0; i < N; ++i) y[i] = x[i] + 1.0f;
  return 0;
}
TIMED(add_one)

int32_t add_two(void **args) {
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  for (int i = 0; i < N; ++i) y[i] = x[i] + 2.0f;
  return 0;
}
TIMED(add_two)

int32_t crash(void **args) {
  (void)args;
  raise(SIGSEGV);
  return 0;
}
TIMED(crash)

int32_t hang(void **args) {
  (void)args;
  volatile int spin = 1;
  while (spin) {
  }
  return 0;
}
TIMED(hang)

int32_t fail(void **args) {
  (void)args;
  return 1;
}
TIMED(fail)

int32_t alloc_big(void **args) {
  (void)args;
  void *p = malloc((size_t)4 << 30);
  if (p == NULL) return 3;
  free(p);
  return 0;
}
TIMED(alloc_big)

int32_t divzero(void **args) {
  (void)args;
  volatile int32_t zero = 0, one = 1;
  return one / zero;
}
TIMED(divzero)

int32_t aborts(void **args) {
  (void)args;
  abort();
  return 0;
}
TIMED(aborts)

int32_t alloc_huge(void **args) {
  (void)args;
  /* Never touched: where the allocation succeeds (no address-space limit), no memory is used. */
  void *p = malloc((size_t)100 << 30);
  if (p == NULL) return 3;
  free(p);
  return 0;
}
TIMED(alloc_huge)

int32_t stamp(void **args) {
  int64_t *t = (int64_t *)args[1];
  struct timespec a, b, d = {0, %(stamp_ms)d * 1000000L};
  clock_gettime(CLOCK_MONOTONIC, &a);
  nanosleep(&d, NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  t[0] = (int64_t)a.tv_sec * 1000000000LL + a.tv_nsec;
  t[1] = (int64_t)b.tv_sec * 1000000000LL + b.tv_nsec;
  return 0;
}
TIMED(stamp)

int32_t jitter(void **args) {
  static int calls = 0;
  const float *x = (const float *)args[0];
  float *y = (float *)args[1];
  for (int i = 0; i < N; ++i) y[i] = x[i] + 1.0f;
  if ((++calls & 1) == 0) {
    struct timespec d = {0, %(jitter_ms)d * 1000000L};
    nanosleep(&d, NULL);
  }
  return 0;
}
TIMED(jitter)
"""
)

KERNEL_NAMES = (
    "add_one",
    "add_two",
    "crash",
    "hang",
    "fail",
    "alloc_big",
    "divzero",
    "aborts",
    "alloc_huge",
    "stamp",
    "jitter",
    "absent",
)


def kernel_entry(symbol: str) -> EntryPoint:
    """The entry point `symbol` over x: float32[N] -> y: float32[N] (stamp: -> t: int64[2])."""
    out = (
        TensorSpec("t", (2,), "int64", ArgRole.OUTPUT)
        if symbol == "stamp"
        else TensorSpec("y", (N,), "float32", ArgRole.OUTPUT)
    )
    args = (TensorSpec("x", (N,), "float32", ArgRole.INPUT), out)
    return EntryPoint(symbol, symbol + "__time", args, flop=float(N))


def build_kernels(directory: str, cc: str = "gcc") -> tuple[bytes, ArtifactMeta]:
    """Compile the kernels into `directory`; return the shared object's bytes and its meta."""
    source = os.path.join(directory, "kernels.c")
    output = os.path.join(directory, "kernels.so")
    with open(source, "w", encoding="utf-8") as f:
        f.write(KERNELS_C % {"n": N, "stamp_ms": STAMP_SLEEP_MS, "jitter_ms": JITTER_SLEEP_MS})
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", output, source],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with open(output, "rb") as f:
        data = f.read()
    meta = ArtifactMeta(
        sha256=hashlib.sha256(data).hexdigest(),
        format="SHARED_OBJECT",
        target="host" if cc == "gcc" else cc.removesuffix("-gcc"),
        entries=tuple(kernel_entry(name) for name in KERNEL_NAMES),
        size_bytes=len(data),
    )
    return data, meta


def upload_chunks(data: bytes, meta: Any, size: int = 64 * 1024) -> Iterator[Any]:
    """An Upload stream (`agent_pb2.UploadChunk`s): `meta` (wire ArtifactMeta) on the first chunk."""
    from protos import agent_pb2

    yield agent_pb2.UploadChunk(meta=meta, data=data[:size])
    for i in range(size, len(data), size):
        yield agent_pb2.UploadChunk(data=data[i : i + size])


def write_tls_files(directory: str) -> dict[str, str]:
    """A throwaway CA, a server certificate for IP 127.0.0.1 and a client certificate (openssl CLI).

    Returns:
        paths by name: ca, server_cert, server_key, client_cert, client_key.
    """
    d = os.path.abspath(directory)
    os.makedirs(d, exist_ok=True)
    paths = {
        "ca": os.path.join(d, "ca.pem"),
        "server_cert": os.path.join(d, "server.pem"),
        "server_key": os.path.join(d, "server.key"),
        "client_cert": os.path.join(d, "client.pem"),
        "client_key": os.path.join(d, "client.key"),
    }
    ca_key = os.path.join(d, "ca.key")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", paths["ca"], "-days", "2",
            "-subj", "/CN=kiln-test-ca")  # fmt: skip
    for who, san in (("server", "IP:127.0.0.1"), ("client", "DNS:kiln-test-client")):
        csr, ext = os.path.join(d, f"{who}.csr"), os.path.join(d, f"{who}.ext")
        with open(ext, "w", encoding="ascii") as f:
            f.write(f"subjectAltName={san}\n")
        openssl("req", *ec, "-keyout", paths[f"{who}_key"], "-out", csr, "-subj", f"/CN={who}")
        openssl("x509", "-req", "-in", csr, "-CA", paths["ca"], "-CAkey", ca_key,
                "-CAcreateserial", "-out", paths[f"{who}_cert"], "-days", "2",
                "-extfile", ext)  # fmt: skip
    return paths


def wait_for_ready_file(proc: subprocess.Popen[bytes], path: str, timeout_s: float = 30.0) -> str:
    """The "host:port" a daemon wrote to its ready file.

    Raises:
        RuntimeError: the process exited or the deadline passed first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, encoding="ascii") as f:
                return f.read().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"no ready file {path}; the process exited with {proc.poll()}")


def child_pids(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc)."""
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            children.append(int(name))
    return children


def is_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of `pid` in clock ticks (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0
    # After the name: state(0) ppid(1) ... utime(11) stime(12).
    return int(fields[11]) + int(fields[12])


def thread_count(pid: int) -> int:
    """How many threads `pid` has (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_until_spinning(pid: int, ticks: int = 20, timeout_s: float = 30.0) -> bool:
    """True once `pid` has used `ticks` more clock ticks of CPU than when called (a busy kernel)."""
    start = cpu_ticks(pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cpu_ticks(pid) - start >= ticks:
            return True
        time.sleep(0.02)
    return False


def wait_until_idle(pids: list[int], quiet_s: float = 0.3, timeout_s: float = 30.0) -> bool:
    """True once none of `pids` used any CPU for `quiet_s` (an executor child done importing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = [cpu_ticks(p) for p in pids]
        time.sleep(quiet_s)
        if [cpu_ticks(p) for p in pids] == before:
            return True
    return False
