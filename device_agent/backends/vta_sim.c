/* Cycle-level simulator of the VTA-like accelerator of protos/vta.py: executes a program bit for
 * bit on a DRAM image and times it, checking for hazards on the way.
 *
 * Built as a shared library by device_agent/vta/sim.py (gcc -O3 -shared -fPIC, into the backend's
 * state directory) and called through ctypes:
 *
 *   int32_t vta_run(const vta_spec *spec, const uint8_t *insns, uint64_t n_insns,
 *                   uint8_t *dram, uint64_t dram_bytes, int32_t kernel, vta_report *report);
 *
 * It returns 0, or the vta_error kind it also writes to report->error_kind with a message naming
 * the instruction and the cause. `kernel` picks the host code of the GEMM micro-op (0: the
 * fastest this CPU runs for this spec); all kernels give the same bits.
 *
 * Order of checks: every instruction is decoded first (unknown opcode, bad fields, flags a module
 * cannot have, FINISH last and only last); then token counts per queue (a pop with no matching
 * push anywhere is an underflow; a push nobody pops is a token left over); then the run, which
 * stops at the first buffer overflow, DMA outside DRAM, unsynchronised access, read of a never
 * written entry, or deadlock.
 *
 * Timing. The three modules (load, compute, store) each run their instructions in program order.
 * An instruction starts when its module is free and every token it pops has been pushed; pushes
 * happen when it ends. It costs `insn_overhead` cycles, then: a DMA waits for the one DRAM channel
 * (shared, first come first served by start time), holds it for ceil(bytes / bandwidth) cycles,
 * and completes `dram_latency` cycles later; pad entries cost what their bytes would, off the
 * channel; GEMM and ALU cost their micro-op iterations times the per-uop cycles. The simulation
 * advances a whole instruction at a time (always the ready instruction that starts first, so the
 * channel is granted in time order), never cycle by cycle. Per module it counts busy cycles,
 * cycles stalled on tokens and cycles waiting for the channel.
 *
 * Hazards. Each module numbers its instructions 1, 2, ... (its sequence). Every buffer entry
 * remembers the sequence of the instruction that last wrote it and, per other module that reads
 * that buffer, of the one that last read it. Each module keeps a vector clock: for every module,
 * the highest sequence of it that is known to have completed before this module's current
 * instruction, which only tokens carry across (a push sends the pusher's clock; a pop merges it).
 * That is the happens-before relation of the hardware, whatever the timing: an access is safe
 * exactly when the conflicting access of the other module happens before it. So
 *   - UNSYNCED_READ: compute reads INP/WGT (store reads ACC) that load (compute) wrote in an
 *     instruction not yet known to compute (store): the data may not have arrived;
 *   - UNSYNCED_WRITE: load (compute) overwrites INP/WGT (ACC) that compute (store) read in an
 *     instruction not yet known to load (compute): the reader may not have finished;
 *   - UNINITIALISED_READ: an entry (or micro-op) read before anything wrote it.
 * Only INP and WGT (load writes, compute reads) and ACC (compute writes, store reads) cross
 * modules; UOP and ACC within compute are ordered by compute's program order. DRAM itself is not
 * tracked: a LOAD of bytes a STORE of the same program wrote is not checked.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct {
  uint32_t batch, block_in, block_out;
  uint32_t inp_buffer_bytes, wgt_buffer_bytes, acc_buffer_bytes, uop_buffer_bytes;
  uint32_t dram_bytes_per_cycle, dram_latency_cycles;
  uint32_t gemm_cycles_per_uop, alu_cycles_per_uop, insn_overhead_cycles, clock_mhz;
} vta_spec;

typedef struct {
  uint64_t total_cycles;
  uint64_t busy[3], token_stall[3], dram_wait[3], insns[3];
  uint64_t gemm_cycles; /* non-reset GEMM iterations x cycles per uop */
  uint64_t alu_cycles;
  uint64_t dram_read_bytes, dram_write_bytes;
  int32_t error_kind, error_insn, kernel_used, reserved;
  char error[512];
} vta_report;

enum vta_error {
  VTA_OK = 0,
  VTA_UNKNOWN_OPCODE,
  VTA_BAD_INSTRUCTION,
  VTA_BUFFER_OVERFLOW,
  VTA_DRAM_OUT_OF_BOUNDS,
  VTA_UNSYNCED_READ,
  VTA_UNSYNCED_WRITE,
  VTA_UNINITIALISED_READ,
  VTA_TOKEN_UNDERFLOW,
  VTA_TOKEN_DEADLOCK,
  VTA_TOKEN_LEFT,
  VTA_HOST_ERROR,
};

enum { OP_LOAD, OP_STORE, OP_GEMM, OP_ALU, OP_FINISH };
enum { BUF_UOP, BUF_WGT, BUF_INP, BUF_ACC };
enum { M_LOAD, M_COMPUTE, M_STORE, NMOD };
/* Token queues: producer -> consumer. */
enum { Q_L2C, Q_C2L, Q_C2S, Q_S2C, NQ };
enum { K_AUTO, K_GENERIC, K_AVX2, K_AVX512 };

static const char *const MOD_NAME[NMOD] = {"load", "compute", "store"};
static const char *const BUF_NAME[4] = {"UOP", "WGT", "INP", "ACC"};
static const char *const OP_NAME[5] = {"LOAD", "STORE", "GEMM", "ALU", "FINISH"};
static const char *const Q_NAME[NQ] = {"load->compute", "compute->load", "compute->store",
                                       "store->compute"};

typedef struct {
  uint32_t op, buffer, reset, alu_op, use_imm;
  int32_t imm;
  uint32_t flags; /* bit 0 pop_prev, 1 pop_next, 2 push_prev, 3 push_next */
  uint32_t sram_base, dram_base, y_size, x_size, x_stride, y_pad0, y_pad1, x_pad0, x_pad1;
  uint32_t uop_bgn, uop_end, iter_out, iter_in;
  uint32_t dst_fo, dst_fi, src_fo, src_fi, wgt_fo, wgt_fi;
  uint32_t index, module;
} insn_t;

typedef struct {
  uint64_t *time;
  uint32_t (*vc)[NMOD];
  uint32_t pushed, popped, capacity;
} token_queue;

typedef struct {
  const vta_spec *spec;
  vta_report *report;
  uint8_t *dram;
  uint64_t dram_bytes;
  int kernel;
  insn_t *insns;
  uint32_t *queue[NMOD];
  uint32_t qlen[NMOD], head[NMOD], seq[NMOD];
  uint32_t vc[NMOD][NMOD];
  uint64_t mod_time[NMOD], channel_free;
  token_queue tokens[NQ];
  /* geometry */
  uint32_t kp; /* block_in rounded up to pairs, / 2 */
  uint32_t inp_entry, wgt_entry, acc_lanes, out_entry;
  uint32_t depth[4];
  /* buffers and their int16 shadows (pairs along block_in, for the GEMM kernels) */
  int8_t *inp, *wgt;
  int16_t *inp16, *wgt16;
  int32_t *acc;
  uint32_t *uop;
  uint32_t *xs, *gs; /* scratch: a run of micro-ops' INP and WGT indices */
  /* hazard state: sequence of last writer / last cross-module reader, 0 = never */
  uint32_t *inp_w, *inp_r, *wgt_w, *wgt_r, *acc_w, *acc_r_store, *uop_w;
} sim_t;

__attribute__((format(printf, 4, 5))) static int fail(sim_t *s, int kind, const insn_t *in, const char *fmt, ...) {
  vta_report *r = s->report;
  r->error_kind = kind;
  r->error_insn = in ? (int32_t)in->index : -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->error, sizeof r->error, fmt, ap);
  va_end(ap);
  return kind;
}

static uint64_t bits(uint64_t lo, uint64_t hi, unsigned at, unsigned width) {
  uint64_t v;
  if (at >= 64) v = hi >> (at - 64);
  else if (at + width <= 64) v = lo >> at;
  else v = (lo >> at) | (hi << (64 - at));
  return width == 64 ? v : v & ((1ull << width) - 1);
}

static int module_of(const insn_t *in) {
  if (in->op == OP_LOAD) return (in->buffer == BUF_INP || in->buffer == BUF_WGT) ? M_LOAD : M_COMPUTE;
  if (in->op == OP_STORE) return M_STORE;
  return M_COMPUTE;
}

/* The queue a module's flag uses, or -1 where the module has no such neighbour. */
static int queue_of(int module, int flag) {
  static const int table[NMOD][4] = {
      /* pop_prev  pop_next  push_prev  push_next */
      {-1, Q_C2L, -1, Q_L2C},       /* load */
      {Q_L2C, Q_S2C, Q_C2L, Q_C2S}, /* compute */
      {Q_C2S, -1, Q_S2C, -1},       /* store */
  };
  return table[module][flag];
}

static const char *insn_name(const insn_t *in, char *buf, size_t n) {
  if (in->op == OP_LOAD || in->op == OP_STORE)
    snprintf(buf, n, "%s %s", OP_NAME[in->op], in->buffer < 4 ? BUF_NAME[in->buffer] : "?");
  else
    snprintf(buf, n, "%s", in->op <= OP_FINISH ? OP_NAME[in->op] : "?");
  return buf;
}

static int decode_all(sim_t *s, const uint8_t *raw, uint64_t n) {
  static const char *const FLAG_NAME[4] = {"pop_prev", "pop_next", "push_prev", "push_next"};
  for (uint64_t i = 0; i < n; i++) {
    uint64_t lo, hi;
    memcpy(&lo, raw + 16 * i, 8);
    memcpy(&hi, raw + 16 * i + 8, 8);
    insn_t *in = &s->insns[i];
    memset(in, 0, sizeof *in);
    in->index = (uint32_t)i;
    in->op = (uint32_t)bits(lo, hi, 0, 3);
    in->flags = (uint32_t)bits(lo, hi, 3, 4);
    if (in->op > OP_FINISH)
      return fail(s, VTA_UNKNOWN_OPCODE, in, "insn %llu: unknown opcode %u", (unsigned long long)i,
                  in->op);
    if (in->op == OP_LOAD || in->op == OP_STORE) {
      in->buffer = (uint32_t)bits(lo, hi, 7, 3);
      in->sram_base = (uint32_t)bits(lo, hi, 10, 16);
      in->dram_base = (uint32_t)bits(lo, hi, 26, 32);
      in->y_size = (uint32_t)bits(lo, hi, 58, 16);
      in->x_size = (uint32_t)bits(lo, hi, 74, 16);
      in->x_stride = (uint32_t)bits(lo, hi, 90, 16);
      in->y_pad0 = (uint32_t)bits(lo, hi, 106, 4);
      in->y_pad1 = (uint32_t)bits(lo, hi, 110, 4);
      in->x_pad0 = (uint32_t)bits(lo, hi, 114, 4);
      in->x_pad1 = (uint32_t)bits(lo, hi, 118, 4);
      if (in->buffer > BUF_ACC)
        return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: %s names buffer %u (none)",
                    (unsigned long long)i, OP_NAME[in->op], in->buffer);
      if (in->op == OP_STORE && in->buffer != BUF_ACC)
        return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: STORE from %s (only ACC stores)",
                    (unsigned long long)i, BUF_NAME[in->buffer]);
      if (in->op == OP_STORE && (in->y_pad0 | in->y_pad1 | in->x_pad0 | in->x_pad1))
        return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: STORE with padding",
                    (unsigned long long)i);
    } else if (in->op == OP_GEMM) {
      in->reset = (uint32_t)bits(lo, hi, 7, 1);
      in->uop_bgn = (uint32_t)bits(lo, hi, 8, 13);
      in->uop_end = (uint32_t)bits(lo, hi, 21, 14);
      in->iter_out = (uint32_t)bits(lo, hi, 35, 14);
      in->iter_in = (uint32_t)bits(lo, hi, 49, 14);
      in->dst_fo = (uint32_t)bits(lo, hi, 63, 11);
      in->dst_fi = (uint32_t)bits(lo, hi, 74, 11);
      in->src_fo = (uint32_t)bits(lo, hi, 85, 11);
      in->src_fi = (uint32_t)bits(lo, hi, 96, 11);
      in->wgt_fo = (uint32_t)bits(lo, hi, 107, 10);
      in->wgt_fi = (uint32_t)bits(lo, hi, 117, 10);
    } else if (in->op == OP_ALU) {
      in->alu_op = (uint32_t)bits(lo, hi, 7, 3);
      in->use_imm = (uint32_t)bits(lo, hi, 10, 1);
      in->imm = (int32_t)(int16_t)(uint16_t)bits(lo, hi, 11, 16);
      in->uop_bgn = (uint32_t)bits(lo, hi, 27, 13);
      in->uop_end = (uint32_t)bits(lo, hi, 40, 14);
      in->iter_out = (uint32_t)bits(lo, hi, 54, 14);
      in->iter_in = (uint32_t)bits(lo, hi, 68, 14);
      in->dst_fo = (uint32_t)bits(lo, hi, 82, 11);
      in->dst_fi = (uint32_t)bits(lo, hi, 93, 11);
      in->src_fo = (uint32_t)bits(lo, hi, 104, 11);
      in->src_fi = (uint32_t)bits(lo, hi, 115, 11);
      if (in->alu_op > 3)
        return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: unknown ALU operation %u",
                    (unsigned long long)i, in->alu_op);
    }
    if ((in->op == OP_GEMM || in->op == OP_ALU) && in->uop_end < in->uop_bgn)
      return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: uop_end %u before uop_bgn %u",
                  (unsigned long long)i, in->uop_end, in->uop_bgn);
    if ((in->op == OP_FINISH) != (i == n - 1))
      return fail(s, VTA_BAD_INSTRUCTION, in,
                  in->op == OP_FINISH ? "insn %llu: FINISH before the end of the program"
                                      : "insn %llu: the program does not end with FINISH",
                  (unsigned long long)i);
    in->module = (uint32_t)module_of(in);
    for (int f = 0; f < 4; f++)
      if ((in->flags >> f & 1) && queue_of((int)in->module, f) < 0)
        return fail(s, VTA_BAD_INSTRUCTION, in, "insn %llu: %s on the %s module, which has no %s",
                    (unsigned long long)i, FLAG_NAME[f], MOD_NAME[in->module],
                    f == 0 || f == 2 ? "previous module" : "next module");
  }
  return VTA_OK;
}

/* Token counts per queue: every pop needs a push somewhere, every push a pop. */
static int check_token_counts(sim_t *s, uint64_t n) {
  uint32_t pushes[NQ] = {0}, pops[NQ] = {0};
  for (uint64_t i = 0; i < n; i++) {
    const insn_t *in = &s->insns[i];
    for (int f = 0; f < 4; f++) {
      if (!(in->flags >> f & 1)) continue;
      int q = queue_of((int)in->module, f);
      if (f >= 2) pushes[q]++;
      else pops[q]++;
    }
  }
  for (int q = 0; q < NQ; q++) {
    if (pops[q] <= pushes[q]) continue;
    /* The first pop past the pushes is the one that can never be satisfied. */
    uint32_t seen = 0;
    for (uint64_t i = 0; i < n; i++) {
      const insn_t *in = &s->insns[i];
      for (int f = 0; f < 2; f++) {
        if (!(in->flags >> f & 1) || queue_of((int)in->module, f) != q) continue;
        if (++seen > pushes[q]) {
          char name[32];
          return fail(s, VTA_TOKEN_UNDERFLOW, in,
                      "%s insn %u (%s) pops token %u of queue %s, which only ever gets %u",
                      MOD_NAME[in->module], in->index, insn_name(in, name, sizeof name), seen,
                      Q_NAME[q], pushes[q]);
        }
      }
    }
  }
  for (int q = 0; q < NQ; q++)
    if (pushes[q] > pops[q])
      return fail(s, VTA_TOKEN_LEFT, NULL, "queue %s gets %u tokens but only %u are popped: %u left",
                  Q_NAME[q], pushes[q], pops[q], pushes[q] - pops[q]);
  for (int q = 0; q < NQ; q++) {
    token_queue *t = &s->tokens[q];
    t->capacity = pushes[q];
    t->time = calloc(pushes[q] + 1, sizeof *t->time);
    t->vc = calloc(pushes[q] + 1, sizeof *t->vc);
    if (!t->time || !t->vc) return fail(s, VTA_HOST_ERROR, NULL, "out of host memory");
  }
  return VTA_OK;
}

/* ---- GEMM kernels: acc[0:batch][0:block_out] += sum over n micro-ops of inp16[xs[u]] .
 * wgt16[gs[u]], wrapping int32 (so any order of the sums gives the same bits). A whole run of
 * micro-ops that share an accumulator entry goes in one call, which keeps the sums in registers. */

/* The 1x16x16 block in plain C: constant trip counts let the compiler vectorise it for any
 * target (NEON on an aarch64 board). */
static void gemm_portable16(const sim_t *s, int32_t *acc, const uint32_t *xs, const uint32_t *gs,
                            uint32_t n) {
  uint32_t sum[16] = {0};
  for (uint32_t u = 0; u < n; u++) {
    const int16_t *a = s->inp16 + (uint64_t)xs[u] * 16, *w = s->wgt16 + (uint64_t)gs[u] * 256;
    for (int p = 0; p < 8; p++) {
      const int32_t a0 = a[2 * p], a1 = a[2 * p + 1];
      for (int o = 0; o < 16; o++)
        sum[o] += (uint32_t)(a0 * w[32 * p + 2 * o] + a1 * w[32 * p + 2 * o + 1]);
    }
  }
  uint32_t *out = (uint32_t *)acc;
  for (int o = 0; o < 16; o++) out[o] += sum[o];
}

static void gemm_generic(const sim_t *s, int32_t *acc, const uint32_t *xs, const uint32_t *gs,
                         uint32_t n) {
  const uint32_t kp = s->kp, bo = s->spec->block_out, batch = s->spec->batch;
  if (batch == 1 && kp == 8 && bo == 16) {
    gemm_portable16(s, acc, xs, gs, n);
    return;
  }
  const uint64_t a_stride = (uint64_t)batch * kp * 2, w_stride = (uint64_t)kp * bo * 2;
  for (uint32_t u = 0; u < n; u++) {
    const int16_t *a = s->inp16 + xs[u] * a_stride, *w = s->wgt16 + gs[u] * w_stride;
    for (uint32_t b = 0; b < batch; b++) {
      uint32_t *out = (uint32_t *)(acc + (size_t)b * bo);
      const int16_t *row = a + (size_t)b * kp * 2;
      for (uint32_t p = 0; p < kp; p++) {
        const int32_t a0 = row[2 * p], a1 = row[2 * p + 1];
        const int16_t *wp = w + (size_t)p * bo * 2;
        for (uint32_t o = 0; o < bo; o++)
          out[o] += (uint32_t)(a0 * wp[2 * o] + a1 * wp[2 * o + 1]);
      }
    }
  }
}

#if defined(__x86_64__)
/* The 1x16x16 block: an INP entry is 8 int16 pairs, a WGT entry 8 x 16 lanes of pairs (512 B). */
__attribute__((target("avx2"))) static inline void gemm_avx2(const sim_t *s, int32_t *acc,
                                                            const uint32_t *xs, const uint32_t *gs,
                                                            uint32_t n) {
  __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i hi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (uint32_t u = 0; u < n; u++) {
    const int32_t *pairs = (const int32_t *)(s->inp16 + (uint64_t)xs[u] * 16);
    const int16_t *w = s->wgt16 + (uint64_t)gs[u] * 256;
    for (int p = 0; p < 8; p++) {
      const __m256i x = _mm256_set1_epi32(pairs[p]);
      lo[p & 1] = _mm256_add_epi32(lo[p & 1], _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(w + 32 * p))));
      hi[p & 1] = _mm256_add_epi32(hi[p & 1], _mm256_madd_epi16(x, _mm256_loadu_si256((const __m256i *)(w + 32 * p + 16))));
    }
  }
  __m256i *out = (__m256i *)acc;
  _mm256_storeu_si256(out, _mm256_add_epi32(_mm256_loadu_si256(out), _mm256_add_epi32(lo[0], lo[1])));
  _mm256_storeu_si256(out + 1, _mm256_add_epi32(_mm256_loadu_si256(out + 1), _mm256_add_epi32(hi[0], hi[1])));
}

__attribute__((target("avx512f,avx512bw"))) static inline void gemm_avx512(
    const sim_t *s, int32_t *acc, const uint32_t *xs, const uint32_t *gs, uint32_t n) {
  __m512i r[4];
  for (int p = 0; p < 4; p++) r[p] = _mm512_setzero_si512();
  for (uint32_t u = 0; u < n; u++) {
    const int32_t *pairs = (const int32_t *)(s->inp16 + (uint64_t)xs[u] * 16);
    const int16_t *w = s->wgt16 + (uint64_t)gs[u] * 256;
    for (int p = 0; p < 8; p++)
      r[p & 3] = _mm512_add_epi32(r[p & 3], _mm512_madd_epi16(_mm512_set1_epi32(pairs[p]),
                                                              _mm512_loadu_si512(w + 32 * p)));
  }
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(r[0], r[1]), _mm512_add_epi32(r[2], r[3]));
  _mm512_storeu_si512(acc, _mm512_add_epi32(_mm512_loadu_si512(acc), sum));
}

#endif

/* ---- hazard reports ---- */

static int unsynced(sim_t *s, const insn_t *in, int kind, int buffer, uint64_t entry, int other,
                    uint32_t other_seq) {
  char a[32], b[32];
  const insn_t *o = &s->insns[s->queue[other][other_seq - 1]];
  if (kind == VTA_UNSYNCED_READ)
    return fail(s, kind, in,
                "%s insn %u (%s) reads %s[%llu], written by %s insn %u (%s) with no token from %s "
                "since: the data may not have arrived",
                MOD_NAME[in->module], in->index, insn_name(in, a, sizeof a), BUF_NAME[buffer],
                (unsigned long long)entry, MOD_NAME[other], o->index, insn_name(o, b, sizeof b),
                MOD_NAME[other]);
  return fail(s, kind, in,
              "%s insn %u (%s) overwrites %s[%llu], read by %s insn %u (%s) with no token from %s "
              "since: the reader may not have finished",
              MOD_NAME[in->module], in->index, insn_name(in, a, sizeof a), BUF_NAME[buffer],
              (unsigned long long)entry, MOD_NAME[other], o->index, insn_name(o, b, sizeof b),
              MOD_NAME[other]);
}

static int uninitialised(sim_t *s, const insn_t *in, int buffer, uint64_t entry) {
  char a[32];
  return fail(s, VTA_UNINITIALISED_READ, in, "%s insn %u (%s) reads %s[%llu], which nothing wrote",
              MOD_NAME[in->module], in->index, insn_name(in, a, sizeof a), BUF_NAME[buffer],
              (unsigned long long)entry);
}

static int overflow(sim_t *s, const insn_t *in, int buffer, uint64_t first, uint64_t end) {
  char a[32];
  return fail(s, VTA_BUFFER_OVERFLOW, in,
              "%s insn %u (%s) accesses %s entries [%llu, %llu), past the buffer's %u entries",
              MOD_NAME[in->module], in->index, insn_name(in, a, sizeof a), BUF_NAME[buffer],
              (unsigned long long)first, (unsigned long long)end, s->depth[buffer]);
}

/* ---- instruction semantics ---- */

static void shadow_inp(sim_t *s, uint64_t e) {
  const int8_t *src = s->inp + e * s->inp_entry;
  int16_t *dst = s->inp16 + e * s->spec->batch * s->kp * 2;
  const uint32_t bi = s->spec->block_in;
  for (uint32_t b = 0; b < s->spec->batch; b++)
    for (uint32_t k = 0; k < s->kp * 2; k++) dst[b * s->kp * 2 + k] = k < bi ? src[b * bi + k] : 0;
}

static void shadow_wgt(sim_t *s, uint64_t e) {
  const int8_t *src = s->wgt + e * s->wgt_entry;
  const uint32_t bi = s->spec->block_in, bo = s->spec->block_out;
  int16_t *dst = s->wgt16 + e * (uint64_t)s->kp * bo * 2;
  for (uint32_t p = 0; p < s->kp; p++)
    for (uint32_t o = 0; o < bo; o++)
      for (uint32_t h = 0; h < 2; h++) {
        uint32_t k = 2 * p + h;
        dst[(p * bo + o) * 2 + h] = k < bi ? src[o * bi + k] : 0;
      }
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Occupy the DRAM channel for `bytes` from `t`; return when the transfer completes. */
static uint64_t dram(sim_t *s, int module, uint64_t t, uint64_t bytes) {
  if (bytes == 0) return t;
  uint64_t begin = t > s->channel_free ? t : s->channel_free;
  s->report->dram_wait[module] += begin - t;
  s->channel_free = begin + ceil_div(bytes, s->spec->dram_bytes_per_cycle);
  return s->channel_free + s->spec->dram_latency_cycles;
}

static int exec_load(sim_t *s, const insn_t *in, uint64_t *t) {
  const int m = (int)in->module, b = (int)in->buffer;
  const uint64_t cols = (uint64_t)in->x_pad0 + in->x_size + in->x_pad1;
  const uint64_t rows = (uint64_t)in->y_pad0 + in->y_size + in->y_pad1;
  const uint64_t count = rows * cols, base = in->sram_base;
  const uint64_t entry_bytes = b == BUF_UOP ? 4 : b == BUF_WGT ? s->wgt_entry
                               : b == BUF_INP ? s->inp_entry : (uint64_t)s->acc_lanes * 4;
  if (base + count > s->depth[b]) return overflow(s, in, b, base, base + count);
  const uint64_t data = (uint64_t)in->y_size * in->x_size;
  if (data) {
    uint64_t end = ((uint64_t)in->dram_base + (uint64_t)(in->y_size - 1) * in->x_stride + in->x_size) *
                   entry_bytes;
    if (end > s->dram_bytes) {
      char a[32];
      return fail(s, VTA_DRAM_OUT_OF_BOUNDS, in,
                  "%s insn %u (%s) reads DRAM bytes up to %llu, past the image's %llu",
                  MOD_NAME[m], in->index, insn_name(in, a, sizeof a), (unsigned long long)end,
                  (unsigned long long)s->dram_bytes);
    }
  }
  uint32_t *wseq = b == BUF_INP ? s->inp_w : b == BUF_WGT ? s->wgt_w : b == BUF_ACC ? s->acc_w : s->uop_w;
  /* Cross-module readers of what this overwrites: compute (INP/WGT) or store (ACC). */
  uint32_t *rseq = b == BUF_INP ? s->inp_r : b == BUF_WGT ? s->wgt_r : b == BUF_ACC ? s->acc_r_store : NULL;
  const int reader = b == BUF_ACC ? M_STORE : M_COMPUTE;
  uint8_t *dst = b == BUF_UOP ? (uint8_t *)s->uop : b == BUF_WGT ? (uint8_t *)s->wgt
                 : b == BUF_INP ? (uint8_t *)s->inp : (uint8_t *)s->acc;
  const uint32_t seq = s->seq[m], known = s->vc[m][reader];
  for (uint64_t y = 0; y < rows; y++) {
    for (uint64_t x = 0; x < cols; x++) {
      const uint64_t e = base + y * cols + x;
      if (rseq && rseq[e] > known) return unsynced(s, in, VTA_UNSYNCED_WRITE, b, e, reader, rseq[e]);
      wseq[e] = seq;
      uint8_t *out = dst + e * entry_bytes;
      if (y < in->y_pad0 || y >= in->y_pad0 + in->y_size || x < in->x_pad0 ||
          x >= in->x_pad0 + in->x_size) {
        memset(out, 0, entry_bytes);
      } else {
        uint64_t d = (uint64_t)in->dram_base + (y - in->y_pad0) * in->x_stride + (x - in->x_pad0);
        memcpy(out, s->dram + d * entry_bytes, entry_bytes);
      }
      if (b == BUF_INP) shadow_inp(s, e);
      else if (b == BUF_WGT) shadow_wgt(s, e);
    }
  }
  s->report->dram_read_bytes += data * entry_bytes;
  *t = dram(s, m, *t, data * entry_bytes);
  *t += ceil_div((count - data) * entry_bytes, s->spec->dram_bytes_per_cycle);
  return VTA_OK;
}

static int exec_store(sim_t *s, const insn_t *in, uint64_t *t) {
  const uint64_t count = (uint64_t)in->y_size * in->x_size, base = in->sram_base;
  if (base + count > s->depth[BUF_ACC]) return overflow(s, in, BUF_ACC, base, base + count);
  if (count) {
    uint64_t end = ((uint64_t)in->dram_base + (uint64_t)(in->y_size - 1) * in->x_stride + in->x_size) *
                   s->out_entry;
    if (end > s->dram_bytes)
      return fail(s, VTA_DRAM_OUT_OF_BOUNDS, in,
                  "store insn %u (STORE ACC) writes DRAM bytes up to %llu, past the image's %llu",
                  in->index, (unsigned long long)end, (unsigned long long)s->dram_bytes);
  }
  const uint32_t seq = s->seq[M_STORE], known = s->vc[M_STORE][M_COMPUTE];
  for (uint64_t y = 0; y < in->y_size; y++) {
    for (uint64_t x = 0; x < in->x_size; x++) {
      const uint64_t e = base + y * in->x_size + x;
      const uint32_t w = s->acc_w[e];
      if (w == 0) return uninitialised(s, in, BUF_ACC, e);
      if (w > known) return unsynced(s, in, VTA_UNSYNCED_READ, BUF_ACC, e, M_COMPUTE, w);
      s->acc_r_store[e] = seq;
      const int32_t *src = s->acc + e * s->acc_lanes;
      int8_t *out = (int8_t *)s->dram + ((uint64_t)in->dram_base + y * in->x_stride + x) * s->out_entry;
      for (uint32_t l = 0; l < s->acc_lanes; l++) out[l] = (int8_t)(uint8_t)(uint32_t)src[l];
    }
  }
  s->report->dram_write_bytes += count * s->out_entry;
  *t = dram(s, M_STORE, *t, count * s->out_entry);
  return VTA_OK;
}

/* Bounds of a loop nest's indices: all factors are unsigned, so the largest index is the largest
 * micro-op field plus the last iteration's offsets. Checked once per instruction. */
static int check_uops(sim_t *s, const insn_t *in, uint32_t *max_dst, uint32_t *max_src,
                      uint32_t *max_wgt) {
  if (in->uop_end > s->depth[BUF_UOP]) return overflow(s, in, BUF_UOP, in->uop_bgn, in->uop_end);
  *max_dst = *max_src = *max_wgt = 0;
  for (uint32_t u = in->uop_bgn; u < in->uop_end; u++) {
    if (s->uop_w[u] == 0) return uninitialised(s, in, BUF_UOP, u);
    const uint32_t w = s->uop[u];
    const uint32_t d = w & 0x7ff, src = w >> 11 & 0x7ff, g = w >> 22;
    if (d > *max_dst) *max_dst = d;
    if (src > *max_src) *max_src = src;
    if (g > *max_wgt) *max_wgt = g;
  }
  return VTA_OK;
}

static int check_range(sim_t *s, const insn_t *in, int buffer, uint32_t max_uop, uint32_t fo,
                       uint32_t fi) {
  const uint64_t last = (uint64_t)max_uop + (uint64_t)(in->iter_out - 1) * fo +
                        (uint64_t)(in->iter_in - 1) * fi;
  return last >= s->depth[buffer] ? overflow(s, in, buffer, last, last + 1) : VTA_OK;
}

/* The GEMM loop nest with its hazard checks; KERNEL(acc, xs, gs, n) does the arithmetic. When
 * every micro-op of the instruction names the same accumulator (a reduction, the usual case), the
 * micro-ops of one (i, j) go to the kernel together. A GEMM only adds into accumulators, and
 * wrapping addition commutes, so any order of its iterations gives the same bits: with `swap`
 * the nest runs j outside i, so that weights indexed by j alone stay in the host's L1 cache
 * while i walks the inputs. */
#define GEMM_LOOP(KERNEL)                                                                        \
  uint32_t *xs = s->xs, *gs = s->gs;                                                             \
  const uint32_t lanes = s->acc_lanes;                                                           \
  const uint32_t outer = swap ? in->iter_in : in->iter_out;                                      \
  const uint32_t inner = swap ? in->iter_out : in->iter_in;                                      \
  for (uint32_t a = 0; a < outer; a++)                                                           \
    for (uint32_t b = 0; b < inner; b++) {                                                       \
      const uint32_t i = swap ? b : a, j = swap ? a : b;                                         \
      uint32_t n = 0, d = 0;                                                                     \
      for (uint32_t u = in->uop_bgn; u < in->uop_end; u++) {                                     \
        const uint32_t w = s->uop[u];                                                            \
        d = (w & 0x7ff) + i * in->dst_fo + j * in->dst_fi;                                       \
        const uint32_t x = (w >> 11 & 0x7ff) + i * in->src_fo + j * in->src_fi;                  \
        const uint32_t g = (w >> 22) + i * in->wgt_fo + j * in->wgt_fi;                          \
        /* 0 (never written) wraps to the top, so one compare finds both hazards. */            \
        if (s->inp_w[x] - 1u >= known_load) return gemm_read_hazard(s, in, BUF_INP, x);          \
        if (s->wgt_w[g] - 1u >= known_load) return gemm_read_hazard(s, in, BUF_WGT, g);          \
        s->inp_r[x] = seq;                                                                       \
        s->wgt_r[g] = seq;                                                                       \
        if (n == 0 || !same_dst) {                                                               \
          if (s->acc_w[d] == 0) return uninitialised(s, in, BUF_ACC, d);                         \
          if (s->acc_r_store[d] > known_store)                                                   \
            return unsynced(s, in, VTA_UNSYNCED_WRITE, BUF_ACC, d, M_STORE, s->acc_r_store[d]);  \
          s->acc_w[d] = seq;                                                                     \
        }                                                                                        \
        xs[n] = x;                                                                               \
        gs[n] = g;                                                                               \
        if (!same_dst) KERNEL(s, s->acc + (uint64_t)d * lanes, xs, gs, 1);                       \
        else n++;                                                                                \
      }                                                                                          \
      if (same_dst && n) KERNEL(s, s->acc + (uint64_t)d * lanes, xs, gs, n);                     \
    }

static int gemm_read_hazard(sim_t *s, const insn_t *in, int buffer, uint32_t e) {
  const uint32_t w = buffer == BUF_INP ? s->inp_w[e] : s->wgt_w[e];
  if (w == 0) return uninitialised(s, in, buffer, e);
  return unsynced(s, in, VTA_UNSYNCED_READ, buffer, e, M_LOAD, w);
}

#define GEMM_RUN_ARGS \
  sim_t *s, const insn_t *in, uint32_t seq, uint32_t known_load, uint32_t known_store, int same_dst, \
      int swap

static int gemm_run_generic(GEMM_RUN_ARGS) {
  GEMM_LOOP(gemm_generic)
  return VTA_OK;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static int gemm_run_avx2(GEMM_RUN_ARGS) {
  GEMM_LOOP(gemm_avx2)
  return VTA_OK;
}

__attribute__((target("avx512f,avx512bw"))) static int gemm_run_avx512(GEMM_RUN_ARGS) {
  GEMM_LOOP(gemm_avx512)
  return VTA_OK;
}

#endif

static int exec_gemm(sim_t *s, const insn_t *in, uint64_t *t) {
  uint32_t md, mx, mg;
  int rc = check_uops(s, in, &md, &mx, &mg);
  const uint64_t iters = (uint64_t)in->iter_out * in->iter_in * (in->uop_end - in->uop_bgn);
  if (rc) return rc;
  if (iters == 0) return VTA_OK;
  if ((rc = check_range(s, in, BUF_ACC, md, in->dst_fo, in->dst_fi))) return rc;
  const uint32_t seq = s->seq[M_COMPUTE], known_store = s->vc[M_COMPUTE][M_STORE];
  if (in->reset) {
    for (uint32_t i = 0; i < in->iter_out; i++)
      for (uint32_t j = 0; j < in->iter_in; j++)
        for (uint32_t u = in->uop_bgn; u < in->uop_end; u++) {
          const uint32_t d = (s->uop[u] & 0x7ff) + i * in->dst_fo + j * in->dst_fi;
          if (s->acc_r_store[d] > known_store)
            return unsynced(s, in, VTA_UNSYNCED_WRITE, BUF_ACC, d, M_STORE, s->acc_r_store[d]);
          s->acc_w[d] = seq;
          memset(s->acc + (uint64_t)d * s->acc_lanes, 0, (size_t)s->acc_lanes * 4);
        }
  } else {
    if ((rc = check_range(s, in, BUF_INP, mx, in->src_fo, in->src_fi))) return rc;
    if ((rc = check_range(s, in, BUF_WGT, mg, in->wgt_fo, in->wgt_fi))) return rc;
    const uint32_t known_load = s->vc[M_COMPUTE][M_LOAD];
    int same = 1;
    for (uint32_t u = in->uop_bgn + 1; u < in->uop_end; u++)
      same &= (s->uop[u] & 0x7ff) == (s->uop[in->uop_bgn] & 0x7ff);
    const int swap = in->wgt_fo == 0 && in->wgt_fi != 0 && in->iter_out > 1;
    switch (s->kernel) {
#if defined(__x86_64__)
      case K_AVX2: rc = gemm_run_avx2(s, in, seq, known_load, known_store, same, swap); break;
      case K_AVX512: rc = gemm_run_avx512(s, in, seq, known_load, known_store, same, swap); break;
#endif
      default: rc = gemm_run_generic(s, in, seq, known_load, known_store, same, swap); break;
    }
    if (rc) return rc;
    s->report->gemm_cycles += iters * s->spec->gemm_cycles_per_uop;
  }
  *t += iters * s->spec->gemm_cycles_per_uop;
  return VTA_OK;
}

static inline int32_t alu_apply(uint32_t op, int32_t a, int32_t b) {
  switch (op) {
    case 0: return a < b ? a : b;
    case 1: return a > b ? a : b;
    case 2: return (int32_t)((uint32_t)a + (uint32_t)b);
    default:
      if (b >= 0) return a >> (b > 31 ? 31 : b);
      return (int32_t)((uint32_t)a << (b < -31 ? 31 : -b));
  }
}

/* One operation over `lanes` lanes, with the operation a constant, so each loop vectorises. */
#define ALU_LANES(OP)                                                                            \
  if (use_imm)                                                                                   \
    for (uint32_t l = 0; l < lanes; l++) dst[l] = alu_apply(OP, dst[l], imm);                    \
  else                                                                                           \
    for (uint32_t l = 0; l < lanes; l++) dst[l] = alu_apply(OP, dst[l], src[l]);

static int exec_alu(sim_t *s, const insn_t *in, uint64_t *t) {
  uint32_t md, mx, mg;
  int rc = check_uops(s, in, &md, &mx, &mg);
  const uint64_t iters = (uint64_t)in->iter_out * in->iter_in * (in->uop_end - in->uop_bgn);
  if (rc) return rc;
  if (iters == 0) return VTA_OK;
  if ((rc = check_range(s, in, BUF_ACC, md, in->dst_fo, in->dst_fi))) return rc;
  if (!in->use_imm && (rc = check_range(s, in, BUF_ACC, mx, in->src_fo, in->src_fi))) return rc;
  const uint32_t seq = s->seq[M_COMPUTE], known_store = s->vc[M_COMPUTE][M_STORE];
  const uint32_t lanes = s->acc_lanes, op = in->alu_op, use_imm = in->use_imm;
  const int32_t imm = in->imm;
  for (uint32_t i = 0; i < in->iter_out; i++)
    for (uint32_t j = 0; j < in->iter_in; j++)
      for (uint32_t u = in->uop_bgn; u < in->uop_end; u++) {
        const uint32_t w = s->uop[u];
        const uint32_t d = (w & 0x7ff) + i * in->dst_fo + j * in->dst_fi;
        const uint32_t x = (w >> 11 & 0x7ff) + i * in->src_fo + j * in->src_fi;
        if (s->acc_w[d] == 0) return uninitialised(s, in, BUF_ACC, d);
        if (!use_imm && s->acc_w[x] == 0) return uninitialised(s, in, BUF_ACC, x);
        if (s->acc_r_store[d] > known_store)
          return unsynced(s, in, VTA_UNSYNCED_WRITE, BUF_ACC, d, M_STORE, s->acc_r_store[d]);
        s->acc_w[d] = seq;
        /* lane l reads only lane l of each operand, so an operand that is its destination
         * (x == d) is read before it changes */
        int32_t *dst = s->acc + (uint64_t)d * lanes;
        const int32_t *src = s->acc + (uint64_t)x * lanes;
        switch (op) {
          case 0: ALU_LANES(0) break;
          case 1: ALU_LANES(1) break;
          case 2: ALU_LANES(2) break;
          default: ALU_LANES(3)
        }
      }
  s->report->alu_cycles += iters * s->spec->alu_cycles_per_uop;
  *t += iters * s->spec->alu_cycles_per_uop;
  return VTA_OK;
}

/* ---- the three modules ---- */

static int deadlock(sim_t *s) {
  char text[400] = "", a[32];
  size_t used = 0;
  const insn_t *first = NULL;
  for (int m = 0; m < NMOD; m++) {
    if (s->head[m] >= s->qlen[m]) continue;
    const insn_t *in = &s->insns[s->queue[m][s->head[m]]];
    for (int f = 0; f < 2; f++) {
      int q = queue_of(m, f);
      if (!(in->flags >> f & 1) || s->tokens[q].popped < s->tokens[q].pushed) continue;
      if (!first) first = in;
      used += (size_t)snprintf(text + used, used < sizeof text ? sizeof text - used : 0,
                               "%s%s insn %u (%s) waits on %s", used ? "; " : "", MOD_NAME[m],
                               in->index, insn_name(in, a, sizeof a), Q_NAME[q]);
      if (used >= sizeof text) used = sizeof text - 1;
      break;
    }
  }
  return fail(s, VTA_TOKEN_DEADLOCK, first, "deadlock: %s", text);
}

static int step(sim_t *s, int m, uint64_t start) {
  const insn_t *in = &s->insns[s->queue[m][s->head[m]++]];
  vta_report *r = s->report;
  s->seq[m]++;
  s->vc[m][m] = s->seq[m];
  for (int f = 0; f < 2; f++) {
    if (!(in->flags >> f & 1)) continue;
    token_queue *q = &s->tokens[queue_of(m, f)];
    for (int k = 0; k < NMOD; k++)
      if (q->vc[q->popped][k] > s->vc[m][k]) s->vc[m][k] = q->vc[q->popped][k];
    q->popped++;
  }
  r->token_stall[m] += start - s->mod_time[m];
  const uint64_t waited = r->dram_wait[m];
  uint64_t t = start + s->spec->insn_overhead_cycles;
  int rc = VTA_OK;
  switch (in->op) {
    case OP_LOAD: rc = exec_load(s, in, &t); break;
    case OP_STORE: rc = exec_store(s, in, &t); break;
    case OP_GEMM: rc = exec_gemm(s, in, &t); break;
    case OP_ALU: rc = exec_alu(s, in, &t); break;
    default: break;
  }
  if (rc) return rc;
  r->busy[m] += t - start - (r->dram_wait[m] - waited);
  r->insns[m]++;
  s->mod_time[m] = t;
  for (int f = 2; f < 4; f++) {
    if (!(in->flags >> f & 1)) continue;
    token_queue *q = &s->tokens[queue_of(m, f)];
    q->time[q->pushed] = t;
    memcpy(q->vc[q->pushed], s->vc[m], sizeof s->vc[m]);
    q->pushed++;
  }
  return VTA_OK;
}

static int simulate(sim_t *s) {
  for (;;) {
    int best = -1;
    uint64_t best_start = UINT64_MAX;
    int remaining = 0;
    for (int m = 0; m < NMOD; m++) {
      if (s->head[m] >= s->qlen[m]) continue;
      remaining = 1;
      const insn_t *in = &s->insns[s->queue[m][s->head[m]]];
      uint64_t start = s->mod_time[m];
      int ready = 1;
      for (int f = 0; f < 2 && ready; f++) {
        if (!(in->flags >> f & 1)) continue;
        const token_queue *q = &s->tokens[queue_of(m, f)];
        if (q->popped >= q->pushed) ready = 0;
        else if (q->time[q->popped] > start) start = q->time[q->popped];
      }
      if (ready && start < best_start) best = m, best_start = start;
    }
    if (!remaining) return VTA_OK;
    if (best < 0) return deadlock(s);
    int rc = step(s, best, best_start);
    if (rc) return rc;
  }
}

static int kernel_for(const vta_spec *spec, int kernel) {
  const int block16 = spec->batch == 1 && spec->block_in == 16 && spec->block_out == 16;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const int has[4] = {1, 1, __builtin_cpu_supports("avx2"),
                      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")};
#else
  const int has[4] = {1, 1, 0, 0};
#endif
  if (kernel == K_AUTO) {
    if (!block16) return K_GENERIC;
    for (int k = K_AVX512; k > K_GENERIC; k--)
      if (has[k]) return k;
    return K_GENERIC;
  }
  if (kernel < K_GENERIC || kernel > K_AVX512 || !has[kernel]) return -1;
  if (kernel != K_GENERIC && !block16) return -1;
  return kernel;
}

/* Whether `kernel` runs here for `spec` (1) or not (0). */
int32_t vta_kernel_supported(const vta_spec *spec, int32_t kernel) {
  return kernel_for(spec, kernel) >= 0;
}

int32_t vta_run(const vta_spec *spec, const uint8_t *raw, uint64_t n_insns, uint8_t *dram_image,
                uint64_t dram_bytes, int32_t kernel, vta_report *report) {
  sim_t sim;
  sim_t *s = &sim;
  memset(s, 0, sizeof *s);
  memset(report, 0, sizeof *report);
  s->spec = spec;
  s->report = report;
  s->dram = dram_image;
  s->dram_bytes = dram_bytes;
  s->kernel = kernel_for(spec, kernel);
  report->kernel_used = s->kernel;
  if (s->kernel < 0) return fail(s, VTA_HOST_ERROR, NULL, "GEMM kernel %d does not run here", kernel);
  if (n_insns == 0 || n_insns > (1u << 30))
    return fail(s, VTA_BAD_INSTRUCTION, NULL, "a program of %llu instructions",
                (unsigned long long)n_insns);
  if (spec->dram_bytes_per_cycle == 0)
    return fail(s, VTA_HOST_ERROR, NULL, "a spec with no DRAM bandwidth");
  s->kp = (spec->block_in + 1) / 2;
  s->inp_entry = spec->batch * spec->block_in;
  s->wgt_entry = spec->block_out * spec->block_in;
  s->acc_lanes = spec->batch * spec->block_out;
  s->out_entry = spec->batch * spec->block_out;
  s->depth[BUF_UOP] = spec->uop_buffer_bytes / 4;
  s->depth[BUF_WGT] = spec->wgt_buffer_bytes / s->wgt_entry;
  s->depth[BUF_INP] = spec->inp_buffer_bytes / s->inp_entry;
  s->depth[BUF_ACC] = spec->acc_buffer_bytes / (s->acc_lanes * 4);
  int rc = VTA_HOST_ERROR;
  s->insns = calloc(n_insns, sizeof *s->insns);
  for (int m = 0; m < NMOD; m++) s->queue[m] = calloc(n_insns, sizeof(uint32_t));
  const uint64_t di = s->depth[BUF_INP], dw = s->depth[BUF_WGT], da = s->depth[BUF_ACC];
  s->inp = calloc(di, s->inp_entry);
  s->wgt = calloc(dw, s->wgt_entry);
  /* 64 bytes of slack: the vector kernels read whole registers */
  s->inp16 = calloc(di * spec->batch * s->kp * 2 + 32, 2);
  s->wgt16 = calloc(dw * s->kp * spec->block_out * 2 + 32, 2);
  s->acc = calloc(da * s->acc_lanes + 16, 4);
  s->uop = calloc(s->depth[BUF_UOP], 4);
  s->xs = calloc(s->depth[BUF_UOP], 4), s->gs = calloc(s->depth[BUF_UOP], 4);
  s->inp_w = calloc(di, 4), s->inp_r = calloc(di, 4);
  s->wgt_w = calloc(dw, 4), s->wgt_r = calloc(dw, 4);
  s->acc_w = calloc(da, 4), s->acc_r_store = calloc(da, 4);
  s->uop_w = calloc(s->depth[BUF_UOP], 4);
  if (!s->insns || !s->queue[0] || !s->queue[1] || !s->queue[2] || !s->inp || !s->wgt ||
      !s->inp16 || !s->wgt16 || !s->acc || !s->uop || !s->xs || !s->gs || !s->inp_w || !s->inp_r || !s->wgt_w ||
      !s->wgt_r || !s->acc_w || !s->acc_r_store || !s->uop_w) {
    fail(s, VTA_HOST_ERROR, NULL, "out of host memory");
    goto done;
  }
  if ((rc = decode_all(s, raw, n_insns))) goto done;
  for (uint64_t i = 0; i < n_insns; i++) {
    const int m = (int)s->insns[i].module;
    s->queue[m][s->qlen[m]++] = (uint32_t)i;
  }
  if ((rc = check_token_counts(s, n_insns))) goto done;
  rc = simulate(s);
  for (int m = 0; m < NMOD; m++)
    if (s->mod_time[m] > report->total_cycles) report->total_cycles = s->mod_time[m];
done:
  for (int q = 0; q < NQ; q++) free(s->tokens[q].time), free(s->tokens[q].vc);
  for (int m = 0; m < NMOD; m++) free(s->queue[m]);
  free(s->insns), free(s->inp), free(s->wgt), free(s->inp16), free(s->wgt16), free(s->acc);
  free(s->uop), free(s->xs), free(s->gs), free(s->inp_w), free(s->inp_r), free(s->wgt_w), free(s->wgt_r), free(s->acc_w);
  free(s->acc_r_store), free(s->uop_w);
  return rc;
}
