/* kiln qemu runner: loads one SHARED_OBJECT artifact and calls or times one entry.
 *
 * Cross-compiled for the emulated ISA and run under qemu-user by device_agent/backends/qemu.py:
 *     qemu-aarch64 -L SYSROOT kiln-qemu-runner ARTIFACT.so
 * One request on stdin, one answer on stdout, then exit. All integers little endian.
 *
 * request:  u32 magic 'KQN1' | u32 mode (0 call, 1 time) | u32 symbol_len | symbol bytes
 *           | u32 nargs | nargs x (u64 nbytes | nbytes of data)
 *           | time only: i32 warmup, number, repeat | f64 min_repeat_ms, cooldown_ms | i64 flush_bytes
 * answer:   u32 magic | i32 status (0 ok, 1 load error, 2 no symbol, 3 bad request, 4 no memory)
 *           | i32 rc | u32 msg_len | msg bytes
 *           | status 0, call: every arg buffer again (its bytes after the call)
 *           | status 0, time: i32 number_used | repeat x f64 samples_s
 *
 * The answer goes to a duplicate of fd 1 taken before the kernel runs; fd 1 itself is pointed at
 * stderr, so a kernel that prints cannot corrupt the answer. A kernel that crashes kills this
 * process (and qemu reports the signal as its own exit status).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAGIC 0x314e514bu /* "KQN1" */
#define MAX_ARGS 4096
#define MAX_SYMBOL 4096

typedef struct {
  int32_t warmup, number, repeat;
  double min_repeat_ms, cooldown_ms;
  void *flush_buf;
  int64_t flush_bytes;
} kiln_timing_config;

typedef int32_t (*entry_fn)(void **);
typedef int32_t (*timing_fn)(void **, const kiln_timing_config *, double *, int32_t *);

static int out_fd = -1;

static int read_all(void *p, size_t n) {
  char *c = (char *)p;
  while (n > 0) {
    ssize_t got = read(0, c, n);
    if (got <= 0) return -1;
    c += got;
    n -= (size_t)got;
  }
  return 0;
}

static void write_all(const void *p, size_t n) {
  const char *c = (const char *)p;
  while (n > 0) {
    ssize_t put = write(out_fd, c, n);
    if (put <= 0) exit(9);
    c += put;
    n -= (size_t)put;
  }
}

static void answer_head(int32_t status, int32_t rc, const char *msg) {
  uint32_t magic = MAGIC, len = (uint32_t)strlen(msg);
  write_all(&magic, 4);
  write_all(&status, 4);
  write_all(&rc, 4);
  write_all(&len, 4);
  write_all(msg, len);
}

static int fail(int32_t status, const char *msg) {
  answer_head(status, 0, msg);
  return 0;
}

int main(int argc, char **argv) {
  out_fd = dup(1);
  if (out_fd < 0 || dup2(2, 1) < 0) return 8;
  if (argc != 2) return fail(3, "usage: kiln-qemu-runner ARTIFACT");

  uint32_t magic, mode, symbol_len, nargs;
  if (read_all(&magic, 4) || magic != MAGIC) return fail(3, "bad request magic");
  if (read_all(&mode, 4) || mode > 1) return fail(3, "bad mode");
  if (read_all(&symbol_len, 4) || symbol_len == 0 || symbol_len > MAX_SYMBOL)
    return fail(3, "bad symbol length");
  char symbol[MAX_SYMBOL + 1];
  if (read_all(symbol, symbol_len)) return fail(3, "truncated symbol");
  symbol[symbol_len] = 0;
  if (read_all(&nargs, 4) || nargs > MAX_ARGS) return fail(3, "bad arg count");

  void **args = calloc(nargs ? nargs : 1, sizeof(void *));
  uint64_t *sizes = calloc(nargs ? nargs : 1, sizeof(uint64_t));
  if (!args || !sizes) return fail(4, "out of memory for the arg table");
  for (uint32_t i = 0; i < nargs; ++i) {
    if (read_all(&sizes[i], 8)) return fail(3, "truncated arg size");
    if (posix_memalign(&args[i], 64, sizes[i] ? sizes[i] : 1) != 0)
      return fail(4, "out of memory for an arg buffer");
    if (read_all(args[i], sizes[i])) return fail(3, "truncated arg data");
  }
  kiln_timing_config cfg;
  memset(&cfg, 0, sizeof cfg);
  if (mode == 1) {
    if (read_all(&cfg.warmup, 4) || read_all(&cfg.number, 4) || read_all(&cfg.repeat, 4) ||
        read_all(&cfg.min_repeat_ms, 8) || read_all(&cfg.cooldown_ms, 8) ||
        read_all(&cfg.flush_bytes, 8))
      return fail(3, "truncated timing config");
    if (cfg.repeat < 1 || cfg.repeat > 1000000 || cfg.flush_bytes < 0)
      return fail(3, "bad timing config");
    if (cfg.flush_bytes > 0 && !(cfg.flush_buf = calloc(1, (size_t)cfg.flush_bytes)))
      return fail(4, "out of memory for the flush buffer");
  }

  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    return fail(1, e ? e : "dlopen failed");
  }
  void *sym = dlsym(lib, symbol);
  if (!sym) return fail(2, symbol);

  if (mode == 0) {
    int32_t rc = ((entry_fn)sym)(args);
    answer_head(0, rc, "");
    for (uint32_t i = 0; i < nargs; ++i) write_all(args[i], sizes[i]);
    return 0;
  }
  double *samples = calloc((size_t)cfg.repeat, sizeof(double));
  if (!samples) return fail(4, "out of memory for samples");
  int32_t number_used = 0;
  int32_t rc = ((timing_fn)sym)(args, &cfg, samples, &number_used);
  answer_head(0, rc, "");
  write_all(&number_used, 4);
  write_all(samples, sizeof(double) * (size_t)cfg.repeat);
  return 0;
}
