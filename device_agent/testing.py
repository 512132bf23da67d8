"""Test kit: hand-written C kernels that implement the SHARED_OBJECT ABI, built with the host gcc.

For tests of the agent and of everything above it that needs a real artifact. Entries of the one
shared object `build_kernels` makes, all over `x: float32[N]` (INPUT) and `y: float32[N]` (OUTPUT):

    add_one    y = x + 1                        add_two    y = x + 2 (a wrong "reference")
    crash      raise(SIGSEGV)                   hang       spins forever
    fail       returns 1                        alloc_big  returns 3 when malloc(4 GiB) fails
    absent     listed in the meta, missing from the object (LOAD_ERROR)
"""

from __future__ import annotations

import hashlib
import os
import subprocess

from device_agent.domain import ArgRole, ArtifactMeta, EntryPoint, TensorSpec

N = 1024

KERNELS_C = r"""
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define N %(n)d

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
"""

KERNEL_NAMES = ("add_one", "add_two", "crash", "hang", "fail", "alloc_big", "absent")


def kernel_entry(symbol: str) -> EntryPoint:
    """The entry point `symbol` over x: float32[N] -> y: float32[N]."""
    args = (
        TensorSpec("x", (N,), "float32", ArgRole.INPUT),
        TensorSpec("y", (N,), "float32", ArgRole.OUTPUT),
    )
    return EntryPoint(symbol, symbol + "__time", args, flop=float(N))


def build_kernels(directory: str, cc: str = "gcc") -> tuple[bytes, ArtifactMeta]:
    """Compile the kernels into `directory`; return the shared object's bytes and its meta."""
    source = os.path.join(directory, "kernels.c")
    output = os.path.join(directory, "kernels.so")
    with open(source, "w", encoding="utf-8") as f:
        f.write(KERNELS_C % {"n": N})
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
        target="host",
        entries=tuple(kernel_entry(name) for name in KERNEL_NAMES),
        size_bytes=len(data),
    )
    return data, meta
