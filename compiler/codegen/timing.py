"""The native timing entry beside each CPU kernel, so no Python overhead enters a sample.

ABI (protos/common.proto, EntryPoint):

    int32_t <symbol>__time(void **args, const kiln_timing_config *cfg, double *samples_s,
                           int32_t *number_used);

    typedef struct kiln_timing_config {
      int32_t warmup;         /* offset  0: untimed calls first */
      int32_t number;         /* offset  4: calls per repeat; the start of growth; < 1 means 1 */
      int32_t repeat;         /* offset  8: samples written to samples_s */
      double min_repeat_ms;   /* offset 16: grow number until a repeat lasts this long; <= 0 off */
      double cooldown_ms;     /* offset 24: sleep before each repeat; <= 0 off */
      void *flush_buf;        /* offset 32: swept (read and written) before each repeat; NULL off */
      int64_t flush_bytes;    /* offset 40: bytes of flush_buf to sweep; <= 0 off */
    } kiln_timing_config;     /* 48 bytes on LP64 */

Fields are in that order with natural C alignment and no packing, so a ctypes.Structure with the
same fields (c_int32 x3, c_double x2, c_void_p, c_int64) mirrors it. The entry runs `warmup`
calls; if min_repeat_ms > 0 it times whole repeats, scaling `number` up (at most 100x a step, at
most 2**30) until one lasts min_repeat_ms; then for each repeat it sweeps the flush buffer and
sleeps the cooldown, both outside the timed region, times `number` calls with
clock_gettime(CLOCK_MONOTONIC) and writes the mean seconds per call to samples_s[r]. Without a
flush or a cooldown, the growth's last run (the final `number` calls, timed alike) is the first
repeat's sample: with 3 repeats of at least 20 ms that is a quarter of a measurement's time. It writes the
final `number` to *number_used (if not NULL). It returns 0, -1 for a NULL cfg (or NULL samples_s
with repeat > 0), or the first nonzero code a kernel call returned.

The loop itself is the timing harness, `HARNESS_SOURCE`: one C file compiled once per target
(and compiler and flags) into an object of the build cache, and linked into every shared object
whose source calls it (`compiler.toolchain` looks for `HARNESS_SYMBOL`). Each kernel's entry is a
one-line call of the harness with the kernel's address, so a unit no longer compiles a copy of
the loop per kernel, nor the headers it needs: that was about a sixth of a dense candidate's
compile time. The kernel is called through a function pointer: an indirect call costs what the
call through the PLT in a per-kernel copy did (a kernel is global in a -fPIC object), so an
empty kernel times the same either way. The harness has hidden visibility, so each shared
object calls its own copy.
"""

from __future__ import annotations

from compiler.codegen.c import check_symbol

TIMING_SUFFIX = "__time"
BAD_ARGUMENTS = -1
HARNESS_SYMBOL = "kiln_timing_time"

# What a unit needs to define timing entries: the config stays opaque, the harness is extern.
TIMING_PRELUDE = f"""
typedef struct kiln_timing_config kiln_timing_config;
__attribute__((visibility("hidden"))) int32_t {HARNESS_SYMBOL}(
    int32_t (*fn)(void **), void **args, const kiln_timing_config *cfg, double *samples_s,
    int32_t *number_used);
"""

HARNESS_SOURCE = r"""/* Kiln's timing harness (compiler/codegen/timing.py), linked into each CPU artifact. */
#define _POSIX_C_SOURCE 199309L
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct kiln_timing_config {
  int32_t warmup;
  int32_t number;
  int32_t repeat;
  double min_repeat_ms;
  double cooldown_ms;
  void *flush_buf;
  int64_t flush_bytes;
} kiln_timing_config;

/* A one-shot run can be far off for a kernel near the clock's resolution, so growth is capped. */
#define KILN_TIMING_MAX_GROWTH 100.0
#define KILN_TIMING_MAX_NUMBER (INT64_C(1) << 30)

/* Where the flush sweep's sum goes, so the reads cannot be optimized away. */
static volatile uint64_t kiln_timing_sink;

static double kiln_timing_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void kiln_timing_flush(void *buf, int64_t bytes) {
  unsigned char *p = (unsigned char *)buf;
  uint64_t acc = 0;
  for (int64_t i = 0; i < bytes; ++i) {
    p[i] = (unsigned char)(p[i] + 1);
    acc += p[i];
  }
  kiln_timing_sink = acc;
}

static void kiln_timing_sleep_ms(double ms) {
  struct timespec ts;
  ts.tv_sec = (time_t)(ms / 1000.0);
  ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000.0) * 1e6);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int32_t kiln_timing_run(int32_t (*fn)(void **), void **args, int64_t number,
                               double *elapsed_s) {
  double start = kiln_timing_now_s();
  for (int64_t i = 0; i < number; ++i) {
    int32_t rc = fn(args);
    if (rc != 0) return rc;
  }
  *elapsed_s = kiln_timing_now_s() - start;
  return 0;
}

__attribute__((visibility("hidden"))) int32_t HARNESS_SYMBOL(
    int32_t (*fn)(void **), void **args, const kiln_timing_config *cfg, double *samples_s,
    int32_t *number_used) {
  if (cfg == NULL || (cfg->repeat > 0 && samples_s == NULL)) return BAD_ARGUMENTS;
  int64_t number = cfg->number > 0 ? cfg->number : 1;
  double elapsed_s = 0.0;
  int32_t rc;
  for (int32_t i = 0; i < cfg->warmup; ++i) {
    rc = fn(args);
    if (rc != 0) return rc;
  }
  if (cfg->min_repeat_ms > 0.0) {
    double min_s = cfg->min_repeat_ms * 1e-3;
    for (;;) {
      rc = kiln_timing_run(fn, args, number, &elapsed_s);
      if (rc != 0) return rc;
      if (elapsed_s >= min_s || number >= KILN_TIMING_MAX_NUMBER) break;
      /* Aim a little past the target so that one more run usually suffices. */
      double growth = elapsed_s > 0.0 ? 1.2 * min_s / elapsed_s : KILN_TIMING_MAX_GROWTH;
      if (growth > KILN_TIMING_MAX_GROWTH) growth = KILN_TIMING_MAX_GROWTH;
      int64_t next = (int64_t)((double)number * growth);
      if (next <= number) next = number + 1;
      number = next < KILN_TIMING_MAX_NUMBER ? next : KILN_TIMING_MAX_NUMBER;
    }
  }
  if (number_used != NULL) *number_used = (int32_t)number;
  int32_t first = 0;
  if (cfg->min_repeat_ms > 0.0 && cfg->repeat > 0 && cfg->cooldown_ms <= 0.0 &&
      (cfg->flush_buf == NULL || cfg->flush_bytes <= 0)) {
    /* The growth's last run timed `number` calls as a repeat would: it is the first sample. */
    samples_s[0] = elapsed_s / (double)number;
    first = 1;
  }
  for (int32_t r = first; r < cfg->repeat; ++r) {
    if (cfg->flush_buf != NULL && cfg->flush_bytes > 0) {
      kiln_timing_flush(cfg->flush_buf, cfg->flush_bytes);
    }
    if (cfg->cooldown_ms > 0.0) kiln_timing_sleep_ms(cfg->cooldown_ms);
    rc = kiln_timing_run(fn, args, number, &elapsed_s);
    if (rc != 0) return rc;
    samples_s[r] = elapsed_s / (double)number;
  }
  return 0;
}
""".replace("HARNESS_SYMBOL", HARNESS_SYMBOL).replace("BAD_ARGUMENTS", str(BAD_ARGUMENTS))

_ENTRY = r"""
int32_t SYMBOL__time(void **args, const kiln_timing_config *cfg, double *samples_s,
                     int32_t *number_used) {
  return HARNESS_SYMBOL(SYMBOL, args, cfg, samples_s, number_used);
}
""".replace("HARNESS_SYMBOL", HARNESS_SYMBOL)


def timing_symbol(symbol: str) -> str:
    """The name of `symbol`'s timing entry."""
    return symbol + TIMING_SUFFIX


def render_timing(symbols: list[str]) -> str:
    """The timing prelude (once) and one timing entry per kernel symbol, to append after the
    kernels; the shared object must link the harness (`compiler.toolchain` does)."""
    entries = [_ENTRY.replace("SYMBOL", check_symbol(s)) for s in symbols]
    return "".join([TIMING_PRELUDE, *entries])
