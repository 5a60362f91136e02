/*
 * vgct_cuda_internal.cuh -- what the cuda/ translation units share.
 *
 *   runtime.cu      per-device workspace, device/stream guards, error text,
 *                   the host-side view preparation (IterSpec), get_info/props
 *   reduce.cu       vgct_cuda_reduce: the fused one-pass statistics kernels
 *   select.cu       vgct_cuda_select: exact order statistics (radix select)
 *   fingerprint.cu  vgct_cuda_fingerprint
 *
 * Nothing here defines a statistic: every kernel folds pairs with
 * vgct_acc_update / vgct_acc_maxima / vgct_acc_merge (csrc/vgct_stats.h) and converts elements
 * with vgct_load (csrc/vgct_dtypes.h), both __host__ __device__.
 *
 * Iteration model (shared by every kernel).  The host turns the two views
 * into an IterSpec: the slice axis (compare(dim=k)) is taken out and becomes
 * the outermost loop; the remaining axes are reordered by |stride| of
 * `actual` (then `expected`) descending, axes with negative strides are
 * flipped, size-1 axes dropped, and axes contiguous in all three stride sets
 * (actual, expected, and the LOGICAL row-major stride that yields the flat
 * index) are merged.  A kernel then walks "rows" of the innermost axis in
 * chunks of CH consecutive elements (16-byte loads: one of the narrower dtype,
 * two a float32 operand, when both inner strides are 1 and the addresses are
 * aligned; vg_chunk), and computes
 * each element's flat logical index as f0 + sum(coord_d * sf_d): visiting in
 * memory order never changes a result, because every index-bearing statistic
 * compares flat indices (lowest index among ties) and the sums are merged in
 * a fixed order (bitwise repeatable; within 1e-12 of the CPU engine).
 */
#ifndef VGCT_CUDA_INTERNAL_CUH_
#define VGCT_CUDA_INTERNAL_CUH_

#include <cuda_runtime.h>
#include <cuda_bf16.h> /* __hne2_mask (vg_ne16_mask) */
#include <cuda_fp16.h>
#include <stddef.h>
#include <string.h> /* memcpy */
#include <stdint.h>
#include <pthread.h>
#include "vgct_engine.h"

#define VG_MAXK VGCT_MAX_NDIM

/* ---- exact 64-bit division by a run-time constant ----------------------
 * libdivide's "branchfull" u64 algorithm (Granlund & Montgomery 1994;
 * ridiculousfish/libdivide, libdivide_internal_u64_gen / u64_do): exact
 * floor(n / d) for every 64-bit n with one __umul64hi, no divide. */
struct FastDiv {
  uint64_t d, magic;
  int shift, add;
};

__host__ __device__ __forceinline__ uint64_t vg_mulhi(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10;
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

__host__ __device__ __forceinline__ uint64_t vg_div(uint64_t n, const FastDiv &f) {
  if (f.magic == 0) return n >> f.shift;
  uint64_t q = vg_mulhi(f.magic, n);
  if (f.add) return (((n - q) >> 1) + q) >> f.shift;
  return q >> f.shift;
}

FastDiv vg_make_div(uint64_t d); /* d >= 1 (runtime.cu) */

/* The copies of one ring step over rows (cuda/reduce.cu vg_ring_load, RL 1):
 * the nf chunks from column col of row `row`, rows of cpr chunks, split at
 * each row end -- f(i, row, col, n) once a row they touch, for the n chunks
 * from that row's column col, which are the step's chunks i .. i + n - 1 (the
 * first row from col, every later one from column 0; n >= 1, col + n <= cpr).
 * Requires nf >= 0, cpr >= 1, 0 <= col < cpr.  The host check (16) runs it
 * on every start and row length the ring can meet. */
#pragma nv_exec_check_disable /* f: a device lambda in the kernel, a host one in the host check */
template <class F>
__host__ __device__ __forceinline__ void vg_ring_segments(int64_t row, int64_t col, int nf,
                                                          int64_t cpr, F &&f) {
  for (int i = 0; i < nf; ++row, col = 0) {
    const int n = (int)min((int64_t)(nf - i), cpr - col);
    f(i, row, col, n);
    i += n;
  }
}

/* The flat logical index of a ring lane's chunks over rows (cuda/reduce.cu
 * k_reduce_bulk, RL 1), stepped instead of divided.  Rows of cpr chunks;
 * chunk col of row r (chunk c = r cpr + col) starts at flat index
 * f0 + r sf0 + col w (w: a chunk's flat extent along its row, CH times the
 * inner axis's flat stride).  A lane folds chunks c + du (0 <= du < 32 RB) of
 * each step, c advancing by cstep chunks a step:
 *   vg_rowcur_init  the cursor at chunk c (two divisions, once a thread);
 *   vg_rowcur_at    the flat index of chunk c + du, 0 <= du <= cpr: one row
 *                   end crossed at most;
 *   vg_rowcur_step  c += cstep: cstep = qs cpr + rs, qs whole rows and rs <
 *                   cpr columns, so one row end at most past them.
 * It replaces a vg_div a chunk (a 64-bit multiply-high and its branches,
 * ~25 instructions against a bfloat16 chunk's fold of ~250).  Requires
 * cpr >= 1, c >= 0, cstep >= 0.  The host check (17) runs it against the
 * division: rows of 32 .. 1024 chunks and others, every start of the first
 * three rows and random far ones, steps of the kernel's 256 and 768 chunks
 * and others. */
struct VgRowCur {
  int64_t col, f;       /* chunk c: its column (0 <= col < cpr), its flat index */
  int64_t cpr, w, wrap; /* wrap = sf0 - cpr w: the flat step across a row end   */
  int64_t rs, fs;       /* a step: rs = cstep mod cpr columns, fs its flat step */
};

__host__ __device__ __forceinline__ VgRowCur vg_rowcur_init(int64_t c, int64_t cpr,
                                                            const FastDiv &cprd, int64_t f0,
                                                            int64_t sf0, int64_t w,
                                                            int64_t cstep) {
  VgRowCur r;
  const int64_t row = (int64_t)vg_div((uint64_t)c, cprd);
  const int64_t qs = (int64_t)vg_div((uint64_t)cstep, cprd);
  r.col = c - row * cpr;
  r.f = f0 + row * sf0 + r.col * w;
  r.cpr = cpr;
  r.w = w;
  r.wrap = sf0 - cpr * w;
  r.rs = cstep - qs * cpr;
  r.fs = qs * sf0 + r.rs * w;
  return r;
}

__host__ __device__ __forceinline__ int64_t vg_rowcur_at(const VgRowCur &r, int64_t du) {
  return r.f + du * r.w + (r.col + du >= r.cpr ? r.wrap : 0);
}

__host__ __device__ __forceinline__ void vg_rowcur_step(VgRowCur &r) {
  r.col += r.rs;
  r.f += r.fs;
  if (r.col >= r.cpr) {
    r.col -= r.cpr;
    r.f += r.wrap;
  }
}

/* ---- the prepared iteration space ------------------------------------- */
struct IterSpec {
  const char *pa, *pe;   /* element (0,...,0) of slice 0, after flips      */
  int64_t f0;            /* its flat logical index                         */
  int isa, ise;          /* item sizes                                     */
  int da, de;            /* vgct_dtype                                     */
  int k;                 /* axes of the inner space (>= 1)                 */
  int64_t sh[VG_MAXK];   /* inner-space shape, outermost first             */
  int64_t sa[VG_MAXK], se[VG_MAXK], sf[VG_MAXK]; /* element strides; sf: flat */
  FastDiv dv[VG_MAXK];   /* divisors for sh[]                              */
  int64_t m;             /* elements per slice (prod sh)                   */
  int64_t S;             /* slices (1 when no slice axis)                  */
  int64_t ssa, sse, ssf; /* slice-axis strides (elements; ssf: flat)       */
};

/* Build the spec.  slice_dim < 0: no slice axis.  Returns 0, or an error
 * code with err filled.  n == 0 must be handled by the caller. */
int vg_prepare(const vgct_view *a, const vgct_view *e, int slice_dim, IterSpec *it,
               char *err, size_t errlen);
/* The same for one tensor (fingerprint): e = a. */

/* ---- per-device workspace --------------------------------------------- */
#define VG_WS_BYTES (16u << 20)     /* the whole device workspace           */
#define VG_PIN_BYTES (4u << 20)     /* pinned host buffer for result records */
#define VG_PIN_WIN 2048u            /* where vg_reduce_run copies a fused window's
                                       counts (WinState) beside the record */
#define VG_PIN_DONE (VG_PIN_BYTES - 64u) /* the reduction's completion word (reduce.cu
                                       vg_signal_done, CallCtx::wait_signal) */
#define VG_PIN_DONE2 (VG_PIN_DONE + 4u) /* the completion word of a kernel chained
                                       behind the reduction (VgChain) */
#define VG_PIN_TINY (VG_PIN_DONE - 4096u) /* what the chained kernel answers (select.cu
                                       TinyOut), past the record and a small call's
                                       slices (vg_reduce_run checks) */
#define VG_MAX_PARTS 16384          /* reduce: whole-tensor partials         */
#define VG_SLICE_CHUNK 65536        /* reduce: slices per launch             */
#define VG_LAUNCH_PAIRS (INT64_C(1) << 32) /* reduce: most pairs per chunked launch */

/* The reduction's words of the workspace (bytes from DevWS.d_ws) that a
 * kernel chained behind it reads (VgChain; the rest of reduce.cu's layout is
 * there): its last-block counter, left zero by every launch's last block, and
 * its result record; and the grid's three gate words (cuda/reduce.cu), left
 * zero by the same block (select.cu's test hook reads them back). */
#define WS_COUNTER 0
#define WS_GATE 16
#define WS_RES 4096

struct DevWS {
  pthread_mutex_t mu;
  int ready;
  int sms;            /* multiprocessors                                    */
  int cc_major;       /* compute capability (9: the bulk-copy ring)         */
  int coop;           /* cooperative launches (cudaDevAttrCooperativeLaunch) */
  size_t smem_optin;  /* max dynamic shared memory per block                */
  char *d_ws;         /* VG_WS_BYTES of device memory                       */
  char *h_pin;        /* VG_PIN_BYTES of pinned host memory                 */
  char *d_pin;        /* h_pin's device address (mapped), or NULL: see reduce.cu */
  unsigned seq;       /* the last completion word asked of a kernel (never 0) */
};

/* Scope guard for one entry-point call: switches to the view's device,
 * locks its workspace (allocating it on first use), and on exit unlocks and
 * restores the caller's current device.  ok() false: err filled. */
struct CallCtx {
  int prev_dev, dev, switched, locked;
  DevWS *ws;
  cudaStream_t stream;
  const char *fn;
  char *err;
  size_t errlen;
  int rc;
  CallCtx(const char *fn, int device, uintptr_t stream, char *err, size_t errlen);
  ~CallCtx();
  bool ok() const { return rc == 0; }
  /* record a failed CUDA call (first failure wins) and clear the
   * non-sticky error state; returns false. */
  bool fail(cudaError_t e, const char *what);
  bool check(cudaError_t e, const char *what) { return e == cudaSuccess ? true : fail(e, what); }
  bool check_launch(const char *what) { return check(cudaGetLastError(), what); }
  /* cudaStreamSynchronize(stream): every host round trip of a call goes
     through here, counted for the tests (vgct_cuda_test_syncs, runtime.cu) */
  cudaError_t sync();
  /* The other round trip: wait until the kernel just launched on `stream`
     writes `seq` into the mapped pinned word `flag` (its last store, after
     its result and a system-scope fence: reduce.cu vg_signal_done), reading
     the word instead of asking the driver -- ~2 us sooner than
     cudaStreamSynchronize, which learns of the end only once the whole grid
     has retired (docs/performance.md, 2026-12-02 23:05 UTC).  Every few
     microseconds it asks cudaStreamQuery, so that a kernel that failed (the
     word never comes) is reported with its error, as sync() reports it; a
     stream found finished without the word is an internal error
     (cudaErrorUnknown).  After VG_SPIN_US (200 us: a queue of earlier work
     on the stream) it leaves the rest of the wait to cudaStreamSynchronize,
     which follows the context's scheduling flags (blocking sync), then reads
     the word.  Counted like sync(), once. */
  cudaError_t wait_signal(const unsigned *flag, unsigned seq);
  /* VGCT_CUDA_TRACE=1: host time of each step, printed to stderr at the end
     of the call (latency breakdowns; no effect otherwise) */
  void mark(const char *what);
  int ntr;
  const char *trn[24];
  double trt[24];
};

/* reduce.cu: vgct_cuda_reduce's body inside a caller's CallCtx (so that
 * select.cu's vgct_cuda_compare holds the device workspace from its window
 * plan through the reduction to its selection).  wf: a fused key window
 * (k_reduce_bulk counts it in the same pass; wf->used says whether its
 * variants were launched, and then w->mode, copied back with the record,
 * which one ran: VG_WIN_RECORD counted no window), or NULL; chain: a kernel
 * queued behind the reduction (VgChain, below), or NULL. */
struct VgWinFuse;
/* A kernel queued on the stream right behind the reduction, before the host
 * waits (select.cu: a small or mid-size call's selection, k_sel_tiny or
 * k_sel_coop, which reads the reduction's record on the device): the host
 * waits once, for that kernel's completion word, instead of for the record
 * and then for the selection.  vg_reduce_run calls launch(ctx, rec, done,
 * seq, stream) after its one launch (and the record's copy, when it has
 * one): rec is the record in device memory (the workspace's WS_RES: the
 * reduction's last block writes it there too when the host's copy is the
 * mapped pinned buffer -- a chained grid's every block reads it, and reads of
 * mapped host memory cost ~1.1 us a block on an H200), done/seq the word the
 * kernel writes last (done NULL: the host synchronises the stream instead);
 * the reduction's last-block counter (WS_COUNTER) is zero when the chained
 * kernel starts, which may use it and must leave it zero.  launched (out): 1
 * when it was called and returned cudaSuccess; 0 when it returned
 * cudaErrorCooperativeLaunchTooLarge (nothing queued: the reduction is
 * waited for as without a chain), and when vg_reduce_run did not call it --
 * it chains only a call of one launch whose record and slices end below
 * VG_PIN_TINY -- so the caller then selects after the reduction. */
struct VgChain {
  cudaError_t (*launch)(void *ctx, const vgct_acc *rec, unsigned *done, unsigned seq,
                        cudaStream_t s);
  void *ctx;
  int launched;
};
int vg_reduce_run(CallCtx &cx, const vgct_view *a, const vgct_view *e, const vgct_params *p,
                  vgct_acc *out, vgct_slice_acc *slices, VgWinFuse *wf, VgChain *chain,
                  char *err, size_t errlen);
/* Whether vg_reduce_run would reduce (a, e, p) with k_reduce_bulk, the one
 * kernel that counts a fused window: a whole-tensor reduction (no slices),
 * a float16/bfloat16/float32 pair, flat unit-stride 16-byte-aligned views
 * past the lean kernel's sizes, a device of compute capability 9+; grid_out:
 * its blocks (the partials the caller must find room for). */
int vg_reduce_can_fuse(const DevWS *ws, const vgct_view *a, const vgct_view *e,
                       const vgct_params *p, int64_t *grid_out);

/* ---- the register accumulator -------------------------------------------
 * HotAcc: the fields of vgct_acc that a FINITE pair changes (sums, the three
 * maxima with their indices, max |e|, counters), kept in registers by the
 * kernels; vg_hot_update is vgct_acc_update's finite branch statement by
 * statement (same expressions, same vgct_better / vgct_rel_may_win / vgct_mul
 * calls), for the unscaled update.  A non-finite pair touches only counters
 * and the class fields, never a HotAcc field, so the kernels fold it with
 * vgct_acc_update into the thread's vgct_acc (shared memory) and add the
 * HotAcc in at the end with vgct_acc_merge (vg_hot_flush; the fast path's
 * kernels, whose HotAcc holds no maximum: vg_hot_flush_sums): integer counters
 * commute, and merging into an accumulator whose sums and maxima are still
 * at their initial values is exact.  The result is bit for bit that of
 * vgct_acc_update on every pair in order (host test: the same functions
 * compiled for the CPU against vgct_acc_update; docs/performance.md) -- for
 * the pairs that go through vg_pair: the generic and float64 kernels.  The
 * float16/bfloat16/float32 kernels use only the sums, the counters and max
 * |e| (ref32) of a HotAcc (vg_fast_chunk, below): their maxima and counts are still exactly
 * the definition's, their sums are grouped per chunk (within rounding).  Why:
 * a whole vgct_acc per thread spills, and one in shared memory made the
 * hot loop L1-bound (ncu, 2026-11-29). */
struct HotAcc {
  double s_aa, s_ee, s_ae, s_dd, s_d;
  double mx, mxa, mxe, mr, wx, ref;
  /* max |e| of the pairs vg_fast_chunk folded (-1: none), kept as the float32
     it is (every float16/bfloat16/float32 |e| is one): one FMNMX a chunk
     instead of a widening, a float64 compare and two selects against ref;
     the records take the larger of ref and ref32 (vg_hot_record,
     vg_hot_flush_sums), so ref32 == -1 (the other paths) changes nothing */
  float ref32;
  int64_t mxi, mri, wxi;
  /* the counters of the pairs since the last flush: every kernel flushes at
     least every VG_FLUSH pairs plus one step (at most a few hundred pairs),
     so 32 bits hold them; one integer add a pair each instead of two */
  int32_t n, neq, nmm;
};

/* The sums and counters of h back to zero (its maxima stay): a fresh
 * accumulator's, and what every flush leaves behind. */
__host__ __device__ __forceinline__ void vg_hot_clear(HotAcc &h) {
  h.s_aa = h.s_ee = h.s_ae = h.s_dd = h.s_d = 0.0;
  h.n = h.neq = h.nmm = 0;
}

__host__ __device__ __forceinline__ void vg_hot_init(HotAcc &h) {
  vg_hot_clear(h);
  h.mx = h.mr = h.wx = h.ref = -1.0;
  h.ref32 = -1.0f;
  h.mxa = h.mxe = 0.0;
  h.mxi = h.mri = h.wxi = -1;
}

__host__ __device__ __forceinline__ bool vg_finite(double x) {
  return fabs(x) <= 0x1.fffffffffffffp+1023;
}

/* vg_finite((double)x) for a float32 x: widening keeps NaN, the infinities
 * and every finite value (finite), so the test can be made in float32. */
__host__ __device__ __forceinline__ bool vg_finite32(float x) {
  return fabsf(x) <= 0x1.fffffep+127f;
}

/* vgct_acc_update(s, a, e, idx, rtol, atol, 0) for a finite pair, on h. */
__host__ __device__ __forceinline__ void vg_hot_update(HotAcc &h, double a, double e, int64_t idx,
                                                       double rtol, double atol) {
  h.n += 1;
  h.neq += (a != e);
  const double d = a - e;
  const double ad = fabs(d), ae = fabs(e);
  if (ad >= h.mx && vgct_better(ad, idx, h.mx, h.mxi)) {
    h.mx = ad; h.mxi = idx; h.mxa = a; h.mxe = e;
  }
  if (ae > h.ref) h.ref = ae;
  if (e != 0.0 && vgct_rel_may_win(ad, ae, idx, h.mr, h.mri)) {
    const double r = ad / ae;
    if (vgct_better(r, idx, h.mr, h.mri)) { h.mr = r; h.mri = idx; }
  }
  const double tol = vgct_tol(rtol, atol, ae);
  if (ad > tol) {
    h.nmm += 1;
    const double ex = ad - tol;
    if (vgct_better(ex, idx, h.wx, h.wxi)) { h.wx = ex; h.wxi = idx; }
  }
  h.s_aa += a * a; h.s_ee += e * e; h.s_ae += a * e;
  h.s_dd += d * d; h.s_d += d;
}

/* vgct_acc_merge out of line, for the block trees and the last block's fold:
 * one copy of its ~200 instructions instead of one per call site keeps each
 * kernel's code small (short launches fetch every instruction cold).  The
 * flushes of the hot loops keep it inline (vg_hot_flush; the fast path's,
 * vg_hot_flush_sums, has no merge): a call there makes the caller save its
 * live registers to the stack (measured: 14% slower, 2026-11-29). */
__host__ __device__ __noinline__ static void vg_merge(vgct_acc *VGCT_RESTRICT s,
                                                     const vgct_acc *VGCT_RESTRICT o) {
  vgct_acc_merge(s, o);
}

/* Fold the register accumulator into *s with vgct_acc_merge, then zero its
 * sums and counters (its maxima stay: merging the same (value, index) again
 * changes nothing).  The kernels flush every VG_FLUSH pairs, so a thread's
 * sums are two-level (blocks of VG_FLUSH, then merges): rounding error grows
 * with VG_FLUSH + pairs/VG_FLUSH, not with the pairs a thread folds. */
#define VG_FLUSH 128
/* The record of the pairs folded into h (vgct_acc_init's fields elsewhere). */
__host__ __device__ __forceinline__ void vg_hot_record(const HotAcc &h, vgct_acc *t) {
  vgct_acc_init(t, 0);
  t->s_aa = h.s_aa; t->s_ee = h.s_ee; t->s_ae = h.s_ae; t->s_dd = h.s_dd; t->s_d = h.s_d;
  t->max_abs = h.mx; t->max_abs_i = h.mxi; t->max_abs_a = h.mxa; t->max_abs_e = h.mxe;
  t->max_rel = h.mr; t->max_rel_i = h.mri;
  t->worst_excess = h.wx; t->worst_i = h.wxi;
  t->max_abs_ref = h.ref;
  if ((double)h.ref32 > t->max_abs_ref) t->max_abs_ref = h.ref32;
  t->n = h.n; t->n_finite = h.n; t->n_unequal = h.neq; t->n_mismatch = h.nmm;
}

__host__ __device__ __forceinline__ void vg_hot_flush(HotAcc &h, vgct_acc *s) {
  vgct_acc t;
  vg_hot_record(h, &t);
  vgct_acc_merge(s, &t);
  vg_hot_clear(h);
}

/* vg_hot_flush for the fast path's kernels, where h never holds a maximum
 * (the narrow pairs go through vg_fast_chunk, which sets only h's sums,
 * counters and max |e|; every maximum goes to the thread's vgct_acc, by the
 * fallbacks) and *s is unscaled (every scale 1: vgct_acc_init(s, 0), and
 * only vgct_acc_update(.., 0), vgct_acc_maxima and these flushes write it).
 * Then vgct_acc_merge of h's record is, field for field and bit for bit,
 * this: its ratios are all 1 (vgct_merge_ratio of equal scales), so each sum
 * is s + h (x * 1 is x exactly, -0 and NaN included); h's maxima are the
 * initial -1 at index -1, which never win vgct_better; h's max |e| is a
 * plain maximum; its class counters are 0.  Why: ~25 SASS instructions
 * instead of the merge's ~160, once every VG_FLUSH pairs a thread: ~0.7%
 * fewer instructions executed and ~1% less device time on bfloat16 and
 * float32 pairs (ncu, docs/performance.md, 2026-12-03 14:50 UTC).  Host
 * check 14: the same record as vg_hot_flush, bit for bit, on the states the
 * fast kernels reach. */
__host__ __device__ __forceinline__ void vg_hot_flush_sums(HotAcc &h, vgct_acc *s) {
  s->s_aa = s->s_aa + h.s_aa;
  s->s_ee = s->s_ee + h.s_ee;
  s->s_ae = s->s_ae + h.s_ae;
  s->s_dd = s->s_dd + h.s_dd;
  s->s_d = s->s_d + h.s_d;
  if (h.ref > s->max_abs_ref) s->max_abs_ref = h.ref;
  if ((double)h.ref32 > s->max_abs_ref) s->max_abs_ref = h.ref32;
  s->n += h.n;
  s->n_finite += h.n;
  s->n_unequal += h.neq;
  s->n_mismatch += h.nmm;
  vg_hot_clear(h);
}

/* k_reduce_lean's LAST flush when nothing was folded into *s yet: stores
 * h's record there and returns true; else returns false (the caller
 * flushes).  Only where everything written to *s is a vgct_acc_update /
 * vgct_acc_update_at (each counts its pair in n first) or a flush of h
 * (after VG_FLUSH pairs, each counted in h.n or s->n): k_reduce_lean.  The
 * fast kernels' fallbacks write maxima alone (vgct_acc_maxima, no count),
 * so there s->n == 0 does not mean an empty record.  Here it does: *s is
 * vgct_acc_init's, and vgct_acc_merge of that empty record with h's is h's
 * record field for field, bit for bit: the sums 0 + x (x never -0: every
 * sum of h starts at +0, and +0 + -0 is +0), the counters 0 + n, every
 * maximum h's (an index < 0 never wins vgct_better, and the empty record's
 * are -1), max |e| and first_class_diff as they are.  Why: the merge is
 * ~200 instructions a thread, the whole of a small input's flush (16 pairs
 * a thread at 2^20).  h is left as it is (the thread is done).  Host check:
 * the same record as vg_hot_flush. */
__host__ __device__ __forceinline__ bool vg_lean_store_fresh(const HotAcc &h, vgct_acc *s) {
  if (s->n != 0) return false;
  vgct_acc t;
  vg_hot_record(h, &t);
  *s = t;
  return true;
}

/* The scaled (float64) path: the definition on a thread-local vgct_acc,
 * merged into *s every VG_FLUSH pairs for the same two-level sums. */
__host__ __device__ __forceinline__ void vg_part_flush(vgct_acc *part, vgct_acc *s) {
  vgct_acc_merge(s, part);
  vgct_acc_init(part, 1);
}

/* The kernels' mode, a template parameter SC of every reduce kernel:
 *   VG_MODE_FAST   0  unscaled; float16/bfloat16/float32 pairs through the
 *                     chunk fast path (vg_fast_chunk, below), others pair by pair
 *   VG_MODE_SCALED 1  the scaled update (a float64 input, vgct_needs_scaling)
 *   VG_MODE_LEAN   2  unscaled, every pair through vg_pair / vg_pair_fin (the register
 *                     update, no gate): for small inputs, where the fast
 *                     path's warm-up (every warp's first chunks fall back to
 *                     the definition until its gate holds maxima) and its code
 *                     size cost more than the ~70 instructions a pair of the
 *                     register update (ncu, 2026-12-01, 2^20 bf16: 42% of the
 *                     executed instructions in the fallbacks).
 * The results are the same definition in every mode: maxima, indices and
 * counters exact, sums two-level (within rounding). */
#define VG_MODE_FAST 0
#define VG_MODE_SCALED 1
#define VG_MODE_LEAN 2
#define VG_SCALED(SC) ((SC) == VG_MODE_SCALED)

/* One pair: the register path when finite and unscaled, else the definition
 * on the thread's vgct_acc (out of line: rare, and it must not cost the hot
 * loop registers). */
__device__ __noinline__ void vg_cold_update(vgct_acc *s, double a, double e, int64_t idx,
                                            double rtol, double atol, int scaled);

/* vg_pair with the pair's finiteness given: fin must be vg_finite(a) &&
 * vg_finite(e) (a caller with the float32 values of narrow inputs tests it
 * there, vg_finite32). */
template <int SC>
__host__ __device__ __forceinline__ void vg_pair_fin(HotAcc &h, vgct_acc *s, double a, double e,
                                                     bool fin, int64_t idx, double rtol,
                                                     double atol) {
  if (!VG_SCALED(SC) && fin) {
    vg_hot_update(h, a, e, idx, rtol, atol);
  } else {
#ifdef __CUDA_ARCH__
    vg_cold_update(s, a, e, idx, rtol, atol, VG_SCALED(SC));
#else
    vgct_acc_update(s, a, e, idx, rtol, atol, VG_SCALED(SC));
#endif
  }
}

template <int SC>
__host__ __device__ __forceinline__ void vg_pair(HotAcc &h, vgct_acc *s, double a, double e,
                                                 int64_t idx, double rtol, double atol) {
  vg_pair_fin<SC>(h, s, a, e, vg_finite(a) && vg_finite(e), idx, rtol, atol);
}

/* ---- the narrow-dtype chunk fast path ----------------------------------
 * For float16 / bfloat16 / float32 inputs (unscaled; binary32 holds every
 * value exactly) the sums of a chunk of CH finite pairs are folded in float64
 * (grouped per chunk), its counters exactly, and float32 summaries bound
 * what the definition would do to the maxima; when the bounds PROVE that no
 * maximum, index or mismatch-worst held in the warp (or, through the grid's
 * shared thresholds, anywhere) can change, the chunk is done, else the caller
 * folds each pair's maxima with vgct_acc_maxima (the definition's maxima
 * part).  A chunk with a non-finite pair goes through vgct_acc_update whole.
 * Results: maxima, indices and every counter exactly the definition's; sums
 * grouped per chunk, the same whichever way the gate decided (deterministic,
 * within rounding of the pairwise sums).
 * Why: vg_hot_update costs ~70 instructions a pair (float64 compares and
 * index tie rules for three maxima); the committed path ~25, most of them
 * float32 (docs/performance.md).  Proof sketch of each test (x = a - e exact,
 * d32 = fl32(x): a difference of binary32 values is exact when subnormal and
 * otherwise within 2^-24 relative; rounding is monotone):
 *  - all pairs finite and d32 finite: the float64 sum of the chunk's
 *    differences t_d is finite (a NaN or infinite input makes its float64
 *    difference, hence t_d, non-finite; CH finite binary32 differences cannot
 *    overflow float64) and max |d32| <= FLT_MAX (no float32 overflow);
 *  - max_abs: |d64_i| >= mx would give fl32(|d64_i|) >= fl32(mx), and
 *    fl32(fl64(x)) is at most one ulp above fl32(x) (double rounding), so
 *    bits(max |d32|) + 1 < bits(fl32(mx)) excludes a new maximum and ties;
 *  - max_rel: |d32_i| < crel * |e_i| for every e_i != 0, with crel <=
 *    mr (1 - 2^-20) (float32 rounded down), gives |d64_i|/|e_i| < mr after
 *    both float64 roundings; all d == 0 gives quotients 0, which change
 *    nothing once mr > 0, or mr == 0 at a lower index than the chunk's;
 *  - mismatches are counted exactly (vgct_tol, as in the definition); their
 *    worst excess |d| - tol is bounded above by ub = max(|d32| - rtol32 |e|) -
 *    atol plus margins (|ub| 2^-50 + max|d32| 2^-19 + 2^-140), and must stay
 *    below the current worst (ties excluded).  The bound holds for EVERY pair
 *    of the chunk, so ub < 0 proves that none mismatches and the exact count
 *    is skipped: a mismatch (|d| > tol) gives |d32| - rtol32 |e| - atol >
 *    -max|d32| (2^-24 + 2^-45) - 2^-1074 before the float32 rounding of X
 *    (at most 2^-24 max|d32| + 2^-150) and the float64 one (2^-53 relative),
 *    which the margins exceed (they need ~2^-23 max|d32|; 2^-19 leaves 4 bits;
 *    host check: a margin of 2^-24 or 2^-40 yields counterexamples).
 * The host check (tests/.../cuda_host_check.cu) runs this against
 * vgct_acc_update. */
/* The fast path's proofs assume IEEE float32 arithmetic with subnormals
 * (d32 == 0 exactly when a == e; exact subnormal differences): the kernels
 * must never be built with --use_fast_math or -ftz=true (setup.py's nvcc
 * flags; nvcc 13 defines no macro for either that could be checked here). */
template <int DA, int DE> struct vg_fast {
  static constexpr bool narrow(int d) {
    return d == VGCT_FLOAT16 || d == VGCT_BFLOAT16 || d == VGCT_FLOAT32;
  }
  static constexpr bool ok = narrow(DA) && narrow(DE);
};

/* The largest float32 <= x (x >= 0 or NaN). */
__host__ __device__ __forceinline__ float vg_f32_down(double x) {
  float f = (float)x;
  if ((double)f > x) f = vgct_f32_from_bits(vgct_bits_from_f32(f) - 1u);
  return f;
}

/* A float32 <= c * x (c, x >= 0; NaN when the product is). */
__host__ __device__ __forceinline__ float vg_mul_down(float c, float x) {
  const float p = c * x;
  return p > 0.0f ? vgct_f32_from_bits(vgct_bits_from_f32(p) - 1u) : p;
}

/* The gate of the fast path.  GateHeld: maxima HELD by accumulators that
 * the block merges into the result -- on the device the best over the 32
 * threads of a warp (vg_held_warp) of what their vgct_acc in shared memory
 * holds (in the fast kernels only the fallbacks -- vg_slow_maxima,
 * vg_slow_chunk, vg_fold_tail -- ever set a maximum, in that vgct_acc).  A
 * pair that loses to a held
 * maximum under vgct_better (smaller, or equal at a higher index) can never
 * become the result's maximum, since every accumulator is merged; so the fast
 * path may skip it even when it would have raised this thread's own maximum.
 * GateHeld lives in shared memory (one per warp: read only on the rare exact
 * checks); HotGate holds the float32 thresholds derived from it, in
 * registers.  Both are refreshed after a whole chunk of the warp took a
 * fallback (a partial chunk's does not refresh them: a stale gate only
 * holds less, which costs speed, never a result). */
struct GateHeld {
  double mx, wx, mr;      /* max |d|, worst excess, max |d|/|e|            */
  int64_t mxi, wxi, mri;  /* their flat indices; < 0: none                 */
};

struct HotGate {
  uint32_t mxb; /* bits of fl32(mx); 0 when none                           */
  float crel;   /* float32 <= mr (1 - 2^-20); 0 when none                   */
  float wx32;   /* float32 <= wx; 0 when none                               */
  float r32;    /* float32 <= rtol                                         */
};

__host__ __device__ __forceinline__ void vg_held_from_acc(GateHeld &g, const vgct_acc *s) {
  g.mx = s->max_abs; g.mxi = s->max_abs_i;
  g.wx = s->worst_excess; g.wxi = s->worst_i;
  g.mr = s->max_rel; g.mri = s->max_rel_i;
}

/* The better held maximum of two, each by vgct_better's rule. */
__host__ __device__ __forceinline__ void vg_held_max(GateHeld &g, const GateHeld &o) {
  if (vgct_better(o.mx, o.mxi, g.mx, g.mxi)) { g.mx = o.mx; g.mxi = o.mxi; }
  if (vgct_better(o.wx, o.wxi, g.wx, g.wxi)) { g.wx = o.wx; g.wxi = o.wxi; }
  if (vgct_better(o.mr, o.mri, g.mr, g.mri)) { g.mr = o.mr; g.mri = o.mri; }
}

__host__ __device__ __forceinline__ void vg_gate_derive(HotGate &g, const GateHeld &h) {
  g.mxb = h.mxi >= 0 ? vgct_bits_from_f32((float)h.mx) : 0u;
  g.crel = h.mri >= 0 ? vg_f32_down(h.mr * (1.0 - 0x1p-20)) : 0.0f;
  g.wx32 = h.wxi >= 0 ? vg_f32_down(h.wx) : 0.0f;
}

/* No maximum held yet; thresholds for tolerance rtol. */
__host__ __device__ __forceinline__ void vg_gate_init(HotGate &g, GateHeld &h, double rtol) {
  h.mx = h.wx = h.mr = -1.0;
  h.mxi = h.wxi = h.mri = -1;
  g.r32 = vg_f32_down(rtol);
  vg_gate_derive(g, h);
}

#ifdef __CUDACC__
/* The best held maxima over the (full) warp: every lane gets them. */
__device__ __forceinline__ void vg_held_warp(GateHeld &g) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    GateHeld x;
    x.mx = __shfl_xor_sync(0xffffffffu, g.mx, o);
    x.mxi = (int64_t)__shfl_xor_sync(0xffffffffu, (long long)g.mxi, o);
    x.wx = __shfl_xor_sync(0xffffffffu, g.wx, o);
    x.wxi = (int64_t)__shfl_xor_sync(0xffffffffu, (long long)g.wxi, o);
    x.mr = __shfl_xor_sync(0xffffffffu, g.mr, o);
    x.mri = (int64_t)__shfl_xor_sync(0xffffffffu, (long long)g.mri, o);
    vg_held_max(g, x);
  }
}
#endif

/* What vg_fast_chunk did with a chunk (the caller finishes it):
 *   VG_CHUNK_DONE     everything folded: sums and counters into the HotAcc, and
 *                     the bounds proved that no maximum can change;
 *   VG_CHUNK_MAXIMA   sums and counters folded, the maxima not proved: the
 *                     caller folds each pair's maxima with vgct_acc_maxima;
 *   VG_CHUNK_DEFINE   nothing folded (a non-finite pair, or a float32 |d|
 *                     overflow): the caller folds the chunk with vgct_acc_update.
 * The sums of a finite chunk are thus folded the same way whichever of the
 * first two outcomes the gate gives: a result never depends on the gate's
 * thresholds, only its speed does (so the thresholds may come from other
 * warps and blocks, in any timing: vg_gate_exchange). */
enum { VG_CHUNK_DONE = 0, VG_CHUNK_MAXIMA = 1, VG_CHUNK_DEFINE = 2 };

__host__ __device__ __forceinline__ int vg_popc(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

/* The fused key window's classification of each pair (cuda/reduce.cu,
 * k_reduce_bulk<..., WIN = 2>), in vg_fast_chunk's own loop over the pairs:
 * window 0's bounds as the doubles whose bits they are.  A finite pair's key
 * is bits(|fl64(a - e)|) (vg_key_narrow), and the bits of non-negative
 * doubles order like their values, so comparing |d| -- the float64
 * difference the sums already need -- with these doubles compares the keys
 * exactly.  The bounds' special keys come out right as doubles too: INF_KEY
 * is +Inf (above every finite pair's |d|), WIN_SENT a NaN (no comparison
 * holds: no window).  (Comparing the key bits as 64-bit integers instead --
 * off the float64 pipe the sums load -- measured slower: more instructions a
 * pair; docs/performance.md, 2026-12-01 22:25-23:38 UTC, call 4.)
 * The counts are a thread's, over its whole finite chunks (a chunk with a
 * non-finite pair is keyed one pair at a time by the caller: `in` says so). */
struct VgWinCnt {
  double lo, hi;       /* bounds                                               */
  unsigned ge, el, eh; /* keys >= lo, == lo, == hi (eh: also the ties at lo
                          when hi == lo, which the kernel's end drops)        */
  unsigned in;         /* out, the last chunk: bit q when lo < key_q < hi;
                          VG_WIN_DEFINE when the chunk has a non-finite pair
                          (nothing counted: the caller keys it pair by pair)  */
};
#define VG_WIN_DEFINE 0x80000000u

/* The fused window's classification of one finite pair's key, through its
 * |d| as a double (VgWinCnt above: why that compares the keys exactly):
 * counts keys >= lo, == lo and == hi; true when lo < key < hi (to be stored).
 * The sparse way's keys use it (vg_win_cand_keys, WIN 1); vg_fast_chunk's loop
 * (WIN 2) uses vg_win_mark, the same relations as predicated PTX. */
__host__ __device__ __forceinline__ bool vg_win_class(double ad, double lo, double hi,
                                                      unsigned &ge, unsigned &el, unsigned &eh) {
  ge += ad >= lo ? 1u : 0u;
  el += ad == lo ? 1u : 0u;
  eh += ad == hi ? 1u : 0u;
  return ad > lo && ad < hi;
}

/* n += 1 when x > y (IEEE 754: never with a NaN), as one predicated add on the
 * device: the C form `n += x > y` compiles to a select and an add, and the
 * bit-mask form `m |= (x > y) << q` counted later by a popcount to a select
 * and a share of a LOP3 (ptxas sm_90).  vg_fast_chunk counts its mismatches
 * this way. */
__host__ __device__ __forceinline__ void vg_count_gt(unsigned &n, double x, double y) {
#ifdef __CUDA_ARCH__
  asm("{\n\t.reg .pred p;\n\tsetp.gt.f64 p, %1, %2;\n\t@p add.u32 %0, %0, 1;\n\t}"
      : "+r"(n) : "d"(x), "d"(y));
#else
  n += x > y ? 1u : 0u;
#endif
}

/* m |= bit when x != 0 (IEEE 754 unordered: a NaN is != 0), and m |= bit
 * when !(x < y) (a NaN on either side sets it): one predicated or each on
 * the device (vg_count_gt: why).  The C forms they replace in vg_fast_chunk,
 * stated with the same NaN rule; there a NaN x comes only from a non-finite
 * pair, whose chunk is defined pair by pair (VG_CHUNK_DEFINE) and these bits
 * unread: the NaN rule states the C forms exactly; no result depends on it. */
__host__ __device__ __forceinline__ void vg_mark_ne0(unsigned &m, float x, unsigned bit) {
#ifdef __CUDA_ARCH__
  asm("{\n\t.reg .pred p;\n\tsetp.neu.f32 p, %1, 0f00000000;\n\t@p or.b32 %0, %0, %2;\n\t}"
      : "+r"(m) : "f"(x), "r"(bit));
#else
  if (x != 0.0f) m |= bit;
#endif
}
__host__ __device__ __forceinline__ void vg_mark_not_lt(unsigned &m, float x, float y, unsigned bit) {
#ifdef __CUDA_ARCH__
  asm("{\n\t.reg .pred p;\n\tsetp.geu.f32 p, %1, %2;\n\t@p or.b32 %0, %0, %3;\n\t}"
      : "+r"(m) : "f"(x), "f"(y), "r"(bit));
#else
  if (!(x < y)) m |= bit;
#endif
}

/* vg_win_class in vg_fast_chunk's loop (WIN 2, every pair), in the form that
 * compiles to four float64 comparisons and four predicated instructions a
 * pair: counts keys > lo (gt; ge = gt + el, added once a chunk), == lo (el)
 * and == hi (eh), and sets `bit` in `in` when lo < key < hi.  The plain C
 * form (vg_win_class) compiled to five comparisons a pair, each count to
 * an add and a select (ptxas sm_90: VIADD + IMAD.MOV after the DSETP) and
 * the inside bit to a select and a share of a LOP3: ~12.5 instructions a
 * pair against 8 here (ptxas writes the four predicated instructions as
 * `@P VIADD`, the inside bit's `or` included: the bits do not overlap).  The
 * same order relations, so the same counts.  Tests: the host check runs the
 * C form below through vg_fast_chunk against the keys themselves
 * (check_win_classify); on the GPU, test_gpu.py's fused-window tests compare
 * the counts with the window pass's -- a `ge` for the `gt` (ties at lo
 * counted twice) failed 67 of them, an `le` for the `lt` (keys == hi stored
 * as inside) 5 (docs/performance.md, 2026-12-05 14:10 UTC). */
__host__ __device__ __forceinline__ void vg_win_mark(double ad, double lo, double hi, unsigned &gt,
                                                     unsigned &el, unsigned &eh, unsigned &in,
                                                     unsigned bit) {
#ifdef __CUDA_ARCH__
  asm("{\n\t.reg .pred p, q;\n\t"
      "setp.gt.f64 p, %4, %5;\n\t"
      "@p add.u32 %0, %0, 1;\n\t"
      "setp.lt.and.f64 q, %4, %6, p;\n\t"
      "@q or.b32 %3, %3, %7;\n\t"
      "setp.eq.f64 p, %4, %5;\n\t"
      "@p add.u32 %1, %1, 1;\n\t"
      "setp.eq.f64 p, %4, %6;\n\t"
      "@p add.u32 %2, %2, 1;\n\t}"
      : "+r"(gt), "+r"(el), "+r"(eh), "+r"(in)
      : "d"(ad), "d"(lo), "d"(hi), "r"(bit));
#else
  gt += ad > lo ? 1u : 0u;
  el += ad == lo ? 1u : 0u;
  eh += ad == hi ? 1u : 0u;
  if (ad > lo && ad < hi) in |= bit;
#endif
}

/* The fused window's sparse way (cuda/reduce.cu, k_reduce_bulk<..., WIN = 1>),
 * in vg_fast_chunk's own loop: t32 = vg_win_t32_of(lo) (in); out, for the
 * last chunk: cand, bit q when |d32_q| is not below t32 and d32_q != 0 -- the
 * pairs whose key MAY be >= lo (vg_win_t32_of's bound holds pair by pair:
 * every other pair's key is below lo), keys of 0 aside -- and zeros, the
 * pairs with d == 0 (key 0: at or above lo only when lo is 0, and then
 * counted without a key each, vg_win_sparse); a chunk the definition folds
 * (a non-finite pair, a float32 overflow) has every bit set and zeros 0 (the
 * caller keys each pair with its float64 |d|, which names the non-finite
 * ones).  ~Two instructions a pair; the candidates' keys are made by their
 * own lane (rare: ~1% of the pairs for a p99 window). */
struct VgLook {
  float t32;
  unsigned cand, zeros;
};

/* The unequal pairs of two words of two float16 (DT VGCT_FLOAT16) or bfloat16
 * (VGCT_BFLOAT16) elements each: 0xffff in half h when a's element h != e's
 * (IEEE 754 equality: +0 == -0; a NaN is unequal to everything, but a chunk
 * with one is folded by the definition, whatever this says).  On the device
 * one HSET2 (cuda_fp16.h / cuda_bf16.h __hne2_mask: set.ne without .ftz,
 * so subnormals are compared as they are, whatever -ftz says), on the host
 * the elements' values. */
template <int DT>
__host__ __device__ __forceinline__ uint32_t vg_ne16_mask(uint32_t wa, uint32_t we) {
  static_assert(DT == VGCT_BFLOAT16 || DT == VGCT_FLOAT16, "16-bit floating-point elements");
#ifdef __CUDA_ARCH__
  if constexpr (DT == VGCT_BFLOAT16) {
    __nv_bfloat162 x, y;
    memcpy(&x, &wa, 4);
    memcpy(&y, &we, 4);
    return __hne2_mask(x, y);
  } else {
    __half2 x, y;
    memcpy(&x, &wa, 4);
    memcpy(&y, &we, 4);
    return __hne2_mask(x, y);
  }
#else
  uint32_t m = 0;
  for (int k = 0; k < 2; ++k) {
    const uint16_t ha = (uint16_t)(wa >> (16 * k)), he = (uint16_t)(we >> (16 * k));
    const double x = DT == VGCT_BFLOAT16 ? vgct_bf16_to_f64(ha) : vgct_f16_to_f64(ha);
    const double y = DT == VGCT_BFLOAT16 ? vgct_bf16_to_f64(he) : vgct_f16_to_f64(he);
    if (x != y) m |= 0xffffu << (16 * k);
  }
  return m;
#endif
}

/* vg_fast_chunk's min |e| key of NW words of bfloat16 elements: min over the
 * elements e != +-0 of 2 bits(|e| as float32) - 1, 0xffffffff when every e is
 * +-0 -- the float32 loop's key, made from the words two elements at a time.
 * A bfloat16 h is the float32 of bits h << 16, so that key is (|h| << 17) - 1
 * = ((k + 1) << 16) - 1 with k = 2|h| - 1, a 16-bit key: (h << 1) drops the
 * sign (the low element's sign, shifted into the high half, is masked off),
 * and the 16-bit add of 0xffff (__viaddmin_u16x2: add.u16x2, then min.u16x2;
 * one VIADDMNMX.U16x2 on sm_90) takes 0 to 0xffff, above every other key.
 * ((0xffff + 1) << 16) - 1 wraps to 0xffffffff.  Host check: against the
 * float32 loop's key on every bfloat16 pattern. */
template <int NW>
__host__ __device__ __forceinline__ uint32_t vg_min16_key(const uint32_t *we) {
  uint32_t mn = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < NW; ++i) mn = __viaddmin_u16x2((we[i] << 1) & 0xfffefffeu, 0xffffffffu, mn);
  const uint32_t lo = mn & 0xffffu, hi = mn >> 16, k = lo < hi ? lo : hi;
  return ((k + 1u) << 16) - 1u;
}

/* Fold the CH pairs (a[q], e[q]) at flat indices f + q*sf: sums and counters
 * into h, and the gate's proof that the maxima cannot change (see the enum
 * above for the outcomes).  g: the thresholds; held: the warp's own held
 * maxima, read only where the float32 bounds are too coarse (a chunk whose
 * largest |d| or mismatch excess is within rounding of the held one: ties,
 * common with bfloat16 differences of one ulp; or all d == 0): there the
 * pairs are checked exactly, in float64, with vgct_better. */
template <int CH, int P16 = 0>
__host__ __device__ __forceinline__ int vg_fast_chunk(HotAcc &h, const HotGate &g,
                                                      const GateHeld &held,
                                                      const float (&a)[CH], const float (&e)[CH],
                                                      int64_t f, int64_t sf, double rtol,
                                                      double atol, VgLook *lk = nullptr,
                                                      VgWinCnt *wc = nullptr,
                                                      const uint32_t *wa = nullptr,
                                                      const uint32_t *we = nullptr) {
  static_assert(CH >= 1 && CH <= 31, "vg_fast_chunk: the counters are 32-bit masks");
  static_assert(P16 == 0 || ((P16 == VGCT_BFLOAT16 || P16 == VGCT_FLOAT16) && CH % 2 == 0),
                "P16: the chunk's 16-bit words (vg_ne16_mask)");
  /* P16 (float16 or bfloat16 pairs; wa, we: their CH / 2 words, element q in
     half q & 1 of word q >> 1, as the vector path reads them): the unequal
     pairs counted from the words two at a time (vg_ne16_mask), and for
     bfloat16 min |e| too (vg_min16_key) -- the same counts and bounds as the
     float32 loop's, in fewer instructions (docs/performance.md, 2026-12-04
     19:25-20:20 UTC) */
  constexpr bool NZW = P16 != 0;            /* nz from the words (unless lk) */
  constexpr bool MNW = P16 == VGCT_BFLOAT16; /* min |e| from the words */
  float mxd = 0.0f;                    /* max |d32| (fmaxf: a NaN is ignored here,
                                          caught by the sum t_d below)          */
  uint32_t mnb = 0xffffffffu;          /* min of 2 bits(|e|) - 1 over e != 0     */
  float maxe = h.ref32;                /* max |e|, and the ones folded before  */
  float X = -(float)INFINITY;          /* max fl32(|d32| - r32 |e|)            */
  uint32_t nz = 0;                     /* bit q: d32 != 0 (P16 without lk: the
                                          words' layout, after the loop)        */
  double t_aa = 0.0, t_ee = 0.0, t_ae = 0.0, t_dd = 0.0, t_d;
  unsigned wge = 0, wel = 0, weh = 0, win = 0; /* the fused window's (wc) */
  uint32_t cand = 0;                   /* the sparse way's candidates (lk)      */
#pragma unroll
  for (int q = 0; q < CH; ++q) {
    const float d32 = a[q] - e[q], ae32 = fabsf(e[q]), ad32 = fabsf(d32);
    mxd = fmaxf(mxd, ad32);
    maxe = fmaxf(maxe, ae32);
    if constexpr (!MNW) {
      /* e == +-0 gives 0xffffffff, the unsigned maximum, which the min ignores;
         otherwise 2 bits(|e|) - 1 orders like |e| */
      const uint32_t eb = (vgct_bits_from_f32(e[q]) << 1) - 1u;
      mnb = eb < mnb ? eb : mnb;
    }
    X = fmaxf(X, fmaf(-g.r32, ae32, ad32));
    if (!NZW || lk) vg_mark_ne0(nz, d32, 1u << q);
    if (lk) vg_mark_not_lt(cand, ad32, lk->t32, 1u << q); /* (a NaN |d32|: a candidate) */
    const double a64 = a[q], e64 = e[q];
    const double d = a64 - e64;
    t_aa += a64 * a64; t_ee += e64 * e64; t_ae += a64 * e64;
    t_dd += d * d;
    /* (the first difference as it is: 0 + d would be one more add; only a -0
       can differ, and the sum it reaches, h.s_d from +0, reads +0 either way) */
    t_d = q == 0 ? d : t_d + d;
    if (wc) /* the fused window (VgWinCnt): the key compared through |d| */
      vg_win_mark(fabs(d), wc->lo, wc->hi, wge, wel, weh, win, 1u << q);
  }
  if constexpr (NZW) {
    if (!lk) { /* bit q (half h = q & 1 of word q >> 1 at bit 16 h + (q >> 1)): a != e */
      uint32_t ne = 0;
#pragma unroll
      for (int i = 0; i < CH / 2; ++i) ne |= vg_ne16_mask<P16>(wa[i], we[i]) & (0x00010001u << i);
      nz = ne;
    }
  }
  if constexpr (MNW) mnb = vg_min16_key<CH / 2>(we);
  /* A non-finite pair makes its float64 difference, and so t_d, non-finite
     (a sum of CH <= 32 finite differences of binary32 values cannot overflow);
     a finite pair whose float32 difference overflows makes mxd infinite. */
  const bool define = !(fabs(t_d) <= 0x1.fffffffffffffp+1023) || !(mxd <= 0x1.fffffep+127f);
  if (lk) {
    lk->cand = define ? (1u << CH) - 1u : cand & nz;
    lk->zeros = define ? 0u : (unsigned)(CH - vg_popc(nz));
  }
  if (wc) { /* a non-finite pair's key is none: such a chunk is keyed pair by
               pair (a finite pair whose float32 difference overflows, too) */
    if (define) {
      wc->in = VG_WIN_DEFINE;
    } else {
      wc->ge += wge + wel; wc->el += wel; wc->eh += weh; /* (wge: keys > lo) */
      wc->in = win;
    }
  }
  if (define) return VG_CHUNK_DEFINE;
  const uint32_t mb = vgct_bits_from_f32(mxd); /* bits of max |d32| */
  /* the float32 below min |e| over e != 0 (+inf when every e == 0) */
  const float mine = mnb == 0xffffffffu ? (float)INFINITY
                                        : vgct_f32_from_bits(((mnb + 1u) >> 1) - 1u);
  /* ub >= (|d| - tol) of every pair (the worst excess bound below): when it is
     negative no pair mismatches, and the exact count is skipped */
  double ub = (double)X - atol;
  ub += fabs(ub) * 0x1p-50 + (double)mxd * 0x1p-19 + 0x1p-140;
  unsigned nmm = 0; /* the mismatches (the definition's test, exact) */
  if (!(ub < 0.0)) {
#pragma unroll
    for (int q = 0; q < CH; ++q) {
      const double e64 = e[q], d = (double)a[q] - e64;
      vg_count_gt(nmm, fabs(d), vgct_tol(rtol, atol, fabs(e64)));
    }
  }
  const int neq = vg_popc(nz);
  h.s_aa += t_aa; h.s_ee += t_ee; h.s_ae += t_ae; h.s_dd += t_dd; h.s_d += t_d;
  h.n += CH; h.neq += neq; h.nmm += nmm;
  h.ref32 = maxe;
  bool chk_mx = !(mb + 1u < g.mxb);
  if (mb == 0) { /* every d == 0: |d| and the quotients are 0, which lose to a
                    held positive maximum, or to a held 0 at a lower index */
    const int64_t cmin = sf >= 0 ? f : f + (int64_t)(CH - 1) * sf;
    if (!(g.crel > 0.0f || (held.mri >= 0 && !(held.mr == 0.0 && cmin <= held.mri))))
      return VG_CHUNK_MAXIMA;
    if (chk_mx && (held.mxi < 0 || (held.mx == 0.0 && cmin <= held.mxi))) return VG_CHUNK_MAXIMA;
    chk_mx = false;
  } else {
    if (!(vgct_f32_from_bits(mb) < vg_mul_down(g.crel, mine))) return VG_CHUNK_MAXIMA;
  }
  const bool chk_wx = nmm && !(g.wx32 > 0.0f && ub < (double)g.wx32);
  if (chk_mx || chk_wx) { /* exact: no pair may beat a held maximum */
    if ((chk_mx && held.mxi < 0) || (chk_wx && held.wxi < 0)) return VG_CHUNK_MAXIMA;
#pragma unroll
    for (int q = 0; q < CH; ++q) {
      const double e64 = e[q], d = (double)a[q] - e64, ad = fabs(d);
      const int64_t idx = f + q * sf;
      if (chk_mx && vgct_better(ad, idx, held.mx, held.mxi)) return VG_CHUNK_MAXIMA;
      if (chk_wx) {
        const double tol = vgct_tol(rtol, atol, fabs(e64));
        if (ad > tol && vgct_better(ad - tol, idx, held.wx, held.wxi)) return VG_CHUNK_MAXIMA;
      }
    }
  }
  return VG_CHUNK_DONE;
}

/* The stronger of two gates' thresholds (each derived by vg_gate_derive
 * from maxima held by some accumulator that is merged into the result; the
 * derivation is monotone, so the maximum of two thresholds is the threshold
 * of the larger held maximum and the proofs above hold for it). */
__host__ __device__ __forceinline__ void vg_gate_max(HotGate &g, uint32_t mxb, uint32_t crelb,
                                                     uint32_t wxb) {
  if (mxb > g.mxb) g.mxb = mxb;
  if (crelb > vgct_bits_from_f32(g.crel)) g.crel = vgct_f32_from_bits(crelb);
  if (wxb > vgct_bits_from_f32(g.wx32)) g.wx32 = vgct_f32_from_bits(wxb);
}

/* A thread's accumulator in shared memory.  Its size must be an odd number
 * of 8-byte words so that a warp touching one field hits distinct banks
 * (vgct_acc has 29 since the per-family scales, VGCT_ACC_VERSION 2: no pad). */
struct VAcc {
  vgct_acc a;
};
static_assert(sizeof(VAcc) % 16 == 8, "VAcc: an odd number of 8-byte words");

/* ---- device helpers shared by the kernels ----------------------------- */
#ifdef __CUDACC__

/* A dtype's element: its size v in bytes, and T, the C type vgct_load reads
 * it as (csrc/vgct_dtypes.h; vg_ld_raw below).  Unknown dtypes (D < 0): v 0. */
template <int D> struct vg_isz { static constexpr int v = 0; };
template <> struct vg_isz<VGCT_BOOL> { static constexpr int v = 1; typedef uint8_t T; };
template <> struct vg_isz<VGCT_INT8> { static constexpr int v = 1; typedef int8_t T; };
template <> struct vg_isz<VGCT_INT16> { static constexpr int v = 2; typedef int16_t T; };
template <> struct vg_isz<VGCT_INT32> { static constexpr int v = 4; typedef int32_t T; };
template <> struct vg_isz<VGCT_INT64> { static constexpr int v = 8; typedef int64_t T; };
template <> struct vg_isz<VGCT_UINT8> { static constexpr int v = 1; typedef uint8_t T; };
template <> struct vg_isz<VGCT_FLOAT16> { static constexpr int v = 2; typedef uint16_t T; };
template <> struct vg_isz<VGCT_BFLOAT16> { static constexpr int v = 2; typedef uint16_t T; };
template <> struct vg_isz<VGCT_FLOAT32> { static constexpr int v = 4; typedef float T; };
template <> struct vg_isz<VGCT_FLOAT64> { static constexpr int v = 8; typedef double T; };
template <> struct vg_isz<VGCT_FLOAT8_E4M3FN> { static constexpr int v = 1; typedef uint8_t T; };
template <> struct vg_isz<VGCT_FLOAT8_E5M2> { static constexpr int v = 1; typedef uint8_t T; };
template <> struct vg_isz<VGCT_UINT16> { static constexpr int v = 2; typedef uint16_t T; };
template <> struct vg_isz<VGCT_UINT32> { static constexpr int v = 4; typedef uint32_t T; };
template <> struct vg_isz<VGCT_UINT64> { static constexpr int v = 8; typedef uint64_t T; };

/* One element to float64 through THE loader (vgct_load).  D >= 0: the dtype is
 * a compile-time constant and vgct_load's switch folds away; D < 0: the
 * run-time dtype `rt` (the generic instantiation for rare dtype pairs). */
template <int D>
__device__ __forceinline__ double vg_ld(const char *p, int rt) {
  return vgct_load(p, D >= 0 ? D : rt);
}

/* A typed element's storage (D >= 0), loaded now and converted by THE
 * loader later (vgct_load_f32 for the float16/bfloat16/float32 pairs of
 * k_reduce_lean: it reads the T it was given) -- a load issued one pair
 * ahead of its use. */
template <int D>
__device__ __forceinline__ typename vg_isz<D>::T vg_ld_raw(const char *p) {
  return *reinterpret_cast<const typename vg_isz<D>::T *>(p);
}

/* Chunk geometry of a dtype pair: CH elements per chunk = one 16-byte vector
 * of the narrower type, or two for float32 pairs (below); NVA/NVE 16-byte
 * vectors per chunk of each input. */
template <int DA, int DE> struct vg_chunk {
  static constexpr int ISA = vg_isz<DA>::v, ISE = vg_isz<DE>::v;
  static constexpr bool TYPED = (DA >= 0 && DE >= 0);
  static constexpr int MINIS = TYPED ? (ISA < ISE ? ISA : ISE) : 4;
  /* elements a chunk: 16 bytes of the narrower operand, but 8 float32 pairs
     (two 16-byte vectors an operand) rather than 4, so that the chunk fast
     path's fixed cost (~50 instructions a chunk: bounds, gate tests, sums
     folded into the accumulator) is spread over 8 pairs, as for 16-bit dtypes */
  static constexpr int CH = (TYPED && MINIS == 4) ? 8 : 16 / MINIS;
  static constexpr int NVA = TYPED ? CH * ISA / 16 : 1;
  static constexpr int NVE = TYPED ? CH * ISE / 16 : 1;
};

/* The fused window's sparse way (WIN 1, cuda/reduce.cu): the keys of the
 * candidates `cand` (VgLook's bits) of one chunk, whose pairs are read again
 * from memory -- the kernel's ring stage in shared memory, where the chunk
 * still is: pair q at ba + q ISA, be + q ISE (dtypes DA, DE; float16,
 * bfloat16 or float32) through THE loader -- by the lane that folded it.  A
 * non-finite pair (a chunk the definition folds has every bit set) has no
 * key; the others are classified by vg_win_class into wc's counts, and
 * put(key) receives each key strictly inside the window.  One round per
 * candidate (a warp: the most any of its lanes has). */
template <int DA, int DE, typename Put>
__host__ __device__ __forceinline__ void vg_win_cand_keys(const char *ba, const char *be,
                                                          unsigned cand, VgWinCnt &wc, Put &&put) {
  constexpr int ISA = vg_isz<DA>::v, ISE = vg_isz<DE>::v;
#pragma unroll 1
  while (cand != 0u) {
    const int q = vg_popc((cand & (0u - cand)) - 1u); /* the lowest candidate */
    cand &= cand - 1u;
    const double ad =
        fabs((double)vgct_load_f32(ba + q * ISA, DA) - (double)vgct_load_f32(be + q * ISE, DE));
    if (!(ad <= 0x1.fffffffffffffp+1023)) continue; /* a non-finite pair: no key */
    if (vg_win_class(ad, wc.lo, wc.hi, wc.ge, wc.el, wc.eh)) put(vgct_bits_from_f64(ad));
  }
}

/* The sparse way's whole work on one folded chunk (lk: vg_fast_chunk's
 * VgLook; the chunk's pairs at ba, be): its candidates' keys, and its keys of
 * 0 counted as keys == lo when lo is 0. */
template <int DA, int DE, typename Put>
__host__ __device__ __forceinline__ void vg_win_sparse(const char *ba, const char *be,
                                                       const VgLook &lk, VgWinCnt &wc,
                                                       Put &&put) {
  if (lk.cand) vg_win_cand_keys<DA, DE>(ba, be, lk.cand, wc, put);
  if (wc.lo == 0.0) {
    wc.ge += lk.zeros;
    wc.el += lk.zeros;
  }
}

/* The typed dtype pairs, shared by every kernel family (reduce, select,
 * histogram): the floating same-dtype pairs of the speed goals and bf16/fp16
 * against an fp32 reference are instantiated with compile-time dtypes
 * (vector loads, conversions inlined); every other pair (fp8, ints, bool,
 * mixed) runs the generic instantiation DA = DE = -1 with run-time dtypes:
 * correct for all, slower, and it keeps the build small.  VG_QUICK (a
 * development build) keeps one typed pair. */
#ifdef VG_QUICK
#define VG_TYPED_PAIRS(X) X(VGCT_BFLOAT16, VGCT_BFLOAT16)
#else
#define VG_TYPED_PAIRS(X)                                                              \
  X(VGCT_BFLOAT16, VGCT_BFLOAT16) X(VGCT_FLOAT16, VGCT_FLOAT16)                        \
  X(VGCT_FLOAT32, VGCT_FLOAT32) X(VGCT_FLOAT64, VGCT_FLOAT64)                          \
  X(VGCT_BFLOAT16, VGCT_FLOAT32) X(VGCT_FLOAT16, VGCT_FLOAT32)
#endif

/* Whether (da, de) has a typed instantiation, and the chunk size (elements)
 * of the instantiation that runs it (host side: grid and chunk counts). */
static inline int vg_is_typed_pair(int da, int de) {
#define VG_CASE(X, Y) if (da == X && de == Y) return 1;
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return 0;
}

static inline int vg_chunk_elems(int da, int de) {
#define VG_CASE(X, Y) if (da == X && de == Y) return vg_chunk<X, Y>::CH;
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return vg_chunk<-1, -1>::CH;
}

/* More than 48 KiB of dynamic shared memory needs an opt-in per kernel and
 * device: done[dev] remembers it (one array per kernel instantiation). */
template <typename K>
static cudaError_t vg_smem_optin(K kernel, int *done, int bytes) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= 64 || done[dev]) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done[dev] = 1;
  return e;
}

/* Selection keys of one chunk: for each of the G::CH pairs starting at qa/qe
 * (strides sai/sei elements of isa/ise bytes), vgct_absdiff_key of the pair,
 * or VG_KEY_NONE (all ones: a non-finite pair, or q >= cnt).  16-byte
 * streaming loads when the chunk is full, unit-stride and both pointers are
 * 16-byte aligned (`unit`: typed pair with unit inner strides); element loads
 * otherwise (misaligned views such as bf16 x[1:], any strides).  Shared by the
 * data passes of the selection (select.cu) and of the histogram
 * (histogram.cu). */
#define VG_KEY_NONE 0xffffffffffffffffull

/* vgct_absdiff_key for a pair of binary32 values (every float16, bfloat16
 * and float32 value is one): the same key, bits(|fl64(a - e)|), with the
 * finiteness test done once, on the difference, instead of on both inputs:
 * the float64 difference of two finite binary32 values is finite (|a - e| <
 * 2^129), and a NaN or an infinity in either input makes it NaN or infinite
 * (inf - inf is NaN), so "both finite" is "bits of |d| below those of +Inf".
 * (Not for float64 inputs: their finite difference can overflow.)  The host
 * check compares it with vgct_absdiff_key on every pair of special values. */
__host__ __device__ __forceinline__ unsigned long long vg_key_narrow(float a, float e) {
  const uint64_t k = vgct_bits_from_f64(fabs((double)a - (double)e));
  return k < 0x7ff0000000000000ull ? (unsigned long long)k : VG_KEY_NONE;
}

/* ---- key windows (select.cu's window plan) -------------------------------
 * A window [lo, hi] of keys (vgct_absdiff_key order) around wanted ranks,
 * predicted from a sample; one pass over the inputs counts the keys at and
 * below it and stores the keys strictly inside.  That pass is select.cu's
 * k_sel_window, or -- for one window over a flat ring-eligible input --
 * reduce.cu's k_reduce_bulk itself (the fused window: the exact quantiles
 * without a pass of their own).  The result lives in one WinState in the
 * device workspace (select.cu: state slot SLOT_WIN). */
#define WIN_MAXW 4                       /* windows in one pass              */
#define INF_KEY 0x7ff0000000000000ull    /* +Inf: the largest finite-pair key */
#define WIN_SENT 0x7ff0000000000001ull   /* above every finite key, below VG_KEY_NONE */

/* Window g's bounds lo <= hi (keys) and counts: lt keys < lo, eql keys == lo,
 * eqh keys == hi (0 when hi == lo), pos keys with lo < key < hi (stored; pos >
 * the window's cap: overflowed); total: the finite keys the pass saw.  The
 * fused pass counts ge = keys >= lo of window 0 instead of lt (lt = n_finite
 * - ge: keys below lo are most keys, and the fused pass never looks at them
 * one by one) and leaves total to the reduction's n_finite. */
struct WinState {
  unsigned long long lo[WIN_MAXW], hi[WIN_MAXW];
  unsigned long long lt[WIN_MAXW], eql[WIN_MAXW], eqh[WIN_MAXW], pos[WIN_MAXW];
  unsigned long long total;
  unsigned long long ge;   /* fused: keys >= lo[0]                              */
  unsigned long long sge;  /* fused: the sample's finite keys >= lo[0], 0 aside
                              (k_win_count: the sparse way or every pair)    */
  unsigned long long ecount[3]; /* fused: the sample's keys 0, nonzero finite and
                              none (k_sel_sample: the early verdict, select.cu
                              win_early)                                      */
  int mode;                /* fused: the reduction's way, chosen on the device
                              (VG_WIN_RECORD by k_sel_sample's last block, else
                              VG_WIN_LOOK or VG_WIN_EVERY by k_win_count's)
                              and read by the three k_reduce_bulk
                              variants launched behind it (RArgs::wsel): no
                              host round trip between the sample and the
                              reduction                                       */
};

/* The key windows' float32 test (cuda/reduce.cu, k_reduce_bulk<..., WIN = 1>,
 * pair by pair; select.cu k_sel_window, chunk by chunk): a finite binary32
 * pair (every float16/bfloat16/float32 value is one) whose |fl32(a - e)| is
 * below vg_win_t32_of(lo) has its key vg_key_narrow(a, e) = bits(|fl64(a -
 * e)|) below lo -- so does a chunk whose largest one is.  Why: with x = |a - e|
 * (real), fl32(x) < t32 <= lo (1 - 2^-21) < lo, and fl64(x) <= fl32(x) (1 +
 * 2^-24)(1 + 2^-53) < lo when fl32(x) is normal; a subnormal fl32(x) is x
 * itself (gradual underflow; the build passes -ftz=false).  The margin is
 * more than the proof needs -- with none, t32 = fl32_down(lo) > fl32(x) puts x
 * below the float32 t32 (round to nearest is monotone), so fl64(x) < lo too;
 * it costs a few more pairs keyed, nothing else.  lo = 0 gives 0, which no
 * pair passes (nor does a positive lo below the float32 subnormals); lo >=
 * INF_KEY (no window, WIN_SENT) gives +Inf.  The host
 * check (tests/.../vgct/cuda_host_check.cu) tries it on pairs whose key is
 * lo itself and the doubles just below, and shows that it catches a bound
 * 2^-20 too high. */
__host__ __device__ __forceinline__ float vg_win_t32_of(unsigned long long lo) {
  if (lo >= INF_KEY) return (float)INFINITY;
  const double x = vgct_f64_from_bits(lo) * (1.0 - 0x1p-21);
#ifdef __CUDA_ARCH__
  return __double2float_rd(x);
#else
  return vg_f32_down(x); /* the same rounding (x >= 0) */
#endif
}

/* The distinct values of v[0..n), ascending, into out (room for n); returns
 * how many.  Insertion into the sorted prefix: n is at most a few hundred
 * ranks (select.cu: a call's wanted ranks). */
static inline int vg_distinct_ascending(const int64_t *v, int n, int64_t *out) {
  int nu = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t x = v[r];
    bool dup = false;
    for (int j = 0; j < nu; ++j) dup |= out[j] == x;
    if (dup) continue;
    int i = nu;
    while (i > 0 && out[i - 1] > x) {
      out[i] = out[i - 1];
      --i;
    }
    out[i] = x;
    ++nu;
  }
  return nu;
}

/* The fused window handed to the reduction (vg_reduce_run): window 0 of w,
 * whose bounds a kernel of the window plan wrote on the device before the
 * reduce (k_win_count); its region cand[0 .. cap); part: where the reduce's
 * block partials go (the window region and the reduce's usual partials
 * overlap in the workspace).  used: set by vg_reduce_run when it launched
 * the ring kernel's variants; whether the window was counted is w->mode
 * (not VG_WIN_RECORD), read by the caller with the record -- else the window
 * plan runs its own pass. */
struct VgWinFuse {
  WinState *w;
  unsigned long long *cand;
  long long cap;
  vgct_acc *part;
  int used;   /* out: k_reduce_bulk's three variants were launched (the ring
                 kernel ran); the one that ran is the device's choice, w->mode */
  int mode;   /* out (set by the caller from w->mode, read with the record):
                 VG_WIN_RECORD, VG_WIN_LOOK or VG_WIN_EVERY */
  int copied; /* out: the counts copied to h_pin + VG_PIN_WIN with the record,
                 in the same host round trip (used == 1 only) */
};
#define VG_WIN_RECORD 0 /* k_reduce_bulk<..., 0>: no window (the record will answer) */
#define VG_WIN_LOOK 1   /* k_reduce_bulk<..., 1>: the pairs not proved below lo keyed */
#define VG_WIN_EVERY 2  /* k_reduce_bulk<..., 2>: every pair classified in the fold */

/* A chunk as read from memory: its 16-byte vectors when it is full, unit-
 * stride and both pointers are 16-byte aligned (`v`), else the pointers to
 * read it element by element.  Reading (vg_chunk_fetch) and keying
 * (vg_chunk_keys_of) are separate steps so that a thread can have several
 * chunks' loads in flight before it keys the first. */
template <int DA, int DE> struct vg_raw_chunk {
  uint4 va[vg_chunk<DA, DE>::NVA], ve[vg_chunk<DA, DE>::NVE];
  const char *qa, *qe;
  int cnt;
  bool v;
};

template <int DA, int DE>
__device__ __forceinline__ void vg_chunk_fetch(vg_raw_chunk<DA, DE> &r, const char *qa,
                                               const char *qe, bool unit, int cnt) {
  typedef vg_chunk<DA, DE> G;
  r.qa = qa;
  r.qe = qe;
  r.cnt = cnt;
  r.v = unit && cnt == G::CH && ((reinterpret_cast<uintptr_t>(qa) & 15) == 0) &&
        ((reinterpret_cast<uintptr_t>(qe) & 15) == 0);
  if (r.v) {
#pragma unroll
    for (int i = 0; i < G::NVA; ++i) r.va[i] = __ldcs(reinterpret_cast<const uint4 *>(qa) + i);
#pragma unroll
    for (int i = 0; i < G::NVE; ++i) r.ve[i] = __ldcs(reinterpret_cast<const uint4 *>(qe) + i);
  }
}

template <int DA, int DE>
__device__ __forceinline__ void vg_chunk_keys_of(const IterSpec &it, const vg_raw_chunk<DA, DE> &r,
                                                 int64_t sai, int64_t sei, int64_t isa, int64_t ise,
                                                 unsigned long long (&keys)[vg_chunk<DA, DE>::CH]) {
  typedef vg_chunk<DA, DE> G;
  if (r.v) {
    const char *ba = reinterpret_cast<const char *>(r.va), *be = reinterpret_cast<const char *>(r.ve);
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      if constexpr (vg_fast<DA, DE>::ok) {
        keys[q] = vg_key_narrow(vgct_load_f32(ba + q * G::ISA, DA), vgct_load_f32(be + q * G::ISE, DE));
      } else {
        uint64_t k;
        keys[q] = vgct_absdiff_key(vgct_load(ba + q * G::ISA, DA), vgct_load(be + q * G::ISE, DE), &k)
                      ? k : VG_KEY_NONE;
      }
    }
  } else {
    if (!G::TYPED && vgct_pair_is_int64(it.da, it.de)) { /* exact integer keys (vgct_stats.h) */
#pragma unroll
      for (int q = 0; q < G::CH; ++q) {
        uint64_t k = VG_KEY_NONE;
        if (q < r.cnt)
          vgct_absdiff_key_at(r.qa + q * sai * isa, it.da, r.qe + q * sei * ise, it.de, &k);
        keys[q] = k;
      }
      return;
    }
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      uint64_t k = VG_KEY_NONE;
      if (q < r.cnt && !vgct_absdiff_key(vg_ld<DA>(r.qa + q * sai * isa, it.da),
                                         vg_ld<DE>(r.qe + q * sei * ise, it.de), &k))
        k = VG_KEY_NONE;
      keys[q] = k;
    }
  }
}

template <int DA, int DE>
__device__ __forceinline__ void vg_chunk_keys(const IterSpec &it, const char *qa, const char *qe,
                                              int64_t sai, int64_t sei, int64_t isa, int64_t ise,
                                              bool unit, int cnt,
                                              unsigned long long (&keys)[vg_chunk<DA, DE>::CH]) {
  vg_raw_chunk<DA, DE> r;
  vg_chunk_fetch<DA, DE>(r, qa, qe, unit, cnt);
  vg_chunk_keys_of<DA, DE>(it, r, sai, sei, isa, ise, keys);
}

/* A chunk of float16/bfloat16/float32 pairs as binary32 values (exact: each
 * value is one), for the window pass's chunk test and its warp-split keys
 * (select.cu k_sel_window): fa[q], fe[q] for q < r.cnt, NaN past it (a NaN
 * pair fails every test and keys to VG_KEY_NONE, vg_key_narrow). */
template <int DA, int DE>
__device__ __forceinline__ void vg_chunk_f32(const vg_raw_chunk<DA, DE> &r, int64_t sai,
                                             int64_t sei, int64_t isa, int64_t ise,
                                             float (&fa)[vg_chunk<DA, DE>::CH],
                                             float (&fe)[vg_chunk<DA, DE>::CH]) {
  typedef vg_chunk<DA, DE> G;
  static_assert(vg_fast<DA, DE>::ok, "binary32 values: float16/bfloat16/float32 pairs only");
  if (r.v) { /* the 16-byte vectors, offsets known at compile time */
    const char *ba = reinterpret_cast<const char *>(r.va), *be = reinterpret_cast<const char *>(r.ve);
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      fa[q] = vgct_load_f32(ba + q * G::ISA, DA);
      fe[q] = vgct_load_f32(be + q * G::ISE, DE);
    }
  } else {
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      fa[q] = q < r.cnt ? vgct_load_f32(r.qa + q * sai * isa, DA) : __int_as_float(0x7fc00000);
      fe[q] = q < r.cnt ? vgct_load_f32(r.qe + q * sei * ise, DE) : 0.0f;
    }
  }
}

/* Shuffle a POD struct word by word (unused: a whole-record warp tree was
 * measured slower than the field-parallel merge below; kept for experiments). */
template <typename T>
__device__ __forceinline__ T vg_shfl_down(const T &v, int off) {
  static_assert(sizeof(T) % 4 == 0, "POD of 32-bit words");
  T r;
  const unsigned *s = reinterpret_cast<const unsigned *>(&v);
  unsigned *d = reinterpret_cast<unsigned *>(&r);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i) d[i] = __shfl_down_sync(0xffffffffu, s[i], off);
  return r;
}

/* Load a POD record written by other blocks of this grid (L2, not L1). */
template <typename T>
__device__ __forceinline__ T vg_ldcg(const T *p) {
  static_assert(sizeof(T) % 8 == 0, "POD of 64-bit words");
  T r;
  const unsigned long long *s = reinterpret_cast<const unsigned long long *>(p);
  unsigned long long *d = reinterpret_cast<unsigned long long *>(&r);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 8); ++i) d[i] = __ldcg(s + i);
  return r;
}

/* Fixed-shape block reductions of the threads' accumulators (one VAcc per
 * thread in shared memory, thread t's at sm[t]; the result in sm[0]).  Both
 * have a fixed shape, so results are deterministic (bitwise repeatable).
 *
 * vg_block_merge_tree: a binary tree over thread ids, each level one
 * vgct_acc_merge by half the threads of the level before.  Any accumulator
 * (the scaled ones too).  Trade-off: log2(NT) merges in a row while the
 * block waits at a barrier (ncu, 2026-12-01, 2^20 bf16: 32% of the kernel's
 * stall samples at those barriers; a one-block launch ~30 us).
 *
 * vg_block_merge_fields: for UNSCALED accumulators (every scale 1, as the
 * unscaled update leaves them): vgct_acc_merge then adds the sums and the
 * counters, keeps the better (value, index) of each maximum by vgct_better,
 * the larger max |e| and the lower first_class_diff, field by field, so the
 * merge of the first nrec <= NT records (all NT by default) is done field-parallel:
 * each warp takes some of the 21 field groups, each lane folds the records
 * lane, lane + 32, ... below nrec, starting from the fields of an empty
 * record (vgct_acc_init: 0 + x is x, the sums are never -0), and a 5-level
 * shuffle tree folds the lanes.  The maxima, indices and counters are
 * exactly those of any order of vgct_acc_merge (a maximum with the lowest-
 * index tie rule, and integer sums, do not depend on the order); the sums are
 * grouped another way than the tree's (within rounding, fixed).  Trade-off:
 * unscaled only, about 10x shorter.  The last block's fold of the grid's
 * partials uses it too (cuda/reduce.cu, vg_reduce_finish). */
template <int NT>
__device__ __forceinline__ void vg_block_merge_tree(VAcc *sm) {
  __syncthreads();
#pragma unroll 1
  for (int st = NT / 2; st > 0; st >>= 1) {
    if ((int)threadIdx.x < st) vg_merge(&sm[threadIdx.x].a, &sm[threadIdx.x + st].a);
    __syncthreads();
  }
}

#define VG_FIELD(f) ((int)(offsetof(vgct_acc, f) / 8))
__device__ __forceinline__ double vg_fd(const VAcc *sm, int r, int f) {
  return reinterpret_cast<const double *>(&sm[r].a)[f];
}
__device__ __forceinline__ long long vg_fi(const VAcc *sm, int r, int f) {
  return reinterpret_cast<const long long *>(&sm[r].a)[f];
}

/* the better (value, index) under vgct_better, with max |d|'s a and e */
struct VgArg {
  double v, x, y;
  long long i;
};
__device__ __forceinline__ void vg_arg_fold(VgArg &s, const VgArg &o) {
  if (vgct_better(o.v, o.i, s.v, s.i)) s = o;
}

/* The record layout vg_block_merge_fields relies on (csrc/vgct_stats.h): the
 * five sums and the eleven counters consecutive, 29 words in all -- a field
 * added to vgct_acc must be added to the merge's groups too. */
static_assert(offsetof(vgct_acc, s_d) == offsetof(vgct_acc, s_aa) + 4 * 8, "s_aa..s_d consecutive");
static_assert(offsetof(vgct_acc, n_class_diff) == offsetof(vgct_acc, n) + 10 * 8,
              "n..n_class_diff consecutive");
static_assert(sizeof(vgct_acc) == 29 * 8, "vgct_acc: 29 words, each in one of the merge's groups");

template <int NT>
__device__ __noinline__ void vg_block_merge_fields(VAcc *sm, int nrec = NT) {
  static_assert(NT % 32 == 0 && NT >= 32 && NT <= 1024, "whole warps");
  static_assert(NT >= (int)(sizeof(vgct_acc) / 8), "one thread a word for the copy-back");
  constexpr int NW = NT / 32, PER = NT / 32, NTASK = 21;
  __shared__ vgct_acc out;
  vgct_acc z; /* an empty record: where every lane's fold starts (its fields
                 read by name: constants, no local memory) */
  vgct_acc_init(&z, 0);
  const int lane = (int)(threadIdx.x & 31u), w = (int)(threadIdx.x >> 5);
  __syncthreads(); /* every thread's record is written */
#pragma unroll 1
  for (int k = w; k < NTASK; k += NW) {
    double *od = reinterpret_cast<double *>(&out);
    long long *oi = reinterpret_cast<long long *>(&out);
    if (k < 5) { /* the five float64 sums */
      const int f = VG_FIELD(s_aa) + k; /* s_aa, s_ee, s_ae, s_dd, s_d: consecutive */
      double t = z.s_aa; /* every sum starts at 0 */
#pragma unroll
      for (int j = 0, r = lane; j < PER; ++j, r += 32)
        if (r < nrec) t += vg_fd(sm, r, f);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
      if (lane == 0) od[f] = t;
    } else if (k < 16) { /* the eleven counters n .. n_class_diff: consecutive */
      const int f = VG_FIELD(n) + (k - 5);
      long long t = z.n; /* every counter starts at 0 */
#pragma unroll
      for (int j = 0, r = lane; j < PER; ++j, r += 32)
        if (r < nrec) t += vg_fi(sm, r, f);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
      if (lane == 0) oi[f] = t;
    } else if (k == 16) { /* max |e| (-1: none) */
      const int f = VG_FIELD(max_abs_ref);
      double t = z.max_abs_ref;
#pragma unroll
      for (int j = 0, r = lane; j < PER; ++j, r += 32)
        if (r < nrec) t = fmax(t, vg_fd(sm, r, f));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t = fmax(t, __shfl_down_sync(0xffffffffu, t, o));
      if (lane == 0) od[f] = t;
    } else if (k == 17) { /* the lowest first_class_diff (-1: none) */
      const int f = VG_FIELD(first_class_diff);
      unsigned long long t = (unsigned long long)z.first_class_diff; /* -1 -> the largest */
#pragma unroll
      for (int j = 0, r = lane; j < PER; ++j, r += 32)
        if (r < nrec) t = min(t, (unsigned long long)vg_fi(sm, r, f));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t = min(t, __shfl_down_sync(0xffffffffu, t, o));
      if (lane == 0) oi[f] = (long long)t;
    } else { /* the three maxima with their indices (and max |d|'s a, e) */
      int fv, fi, fx = -1, fy = -1;
      if (k == 18) { fv = VG_FIELD(max_abs); fi = VG_FIELD(max_abs_i); fx = VG_FIELD(max_abs_a); fy = VG_FIELD(max_abs_e); }
      else if (k == 19) { fv = VG_FIELD(max_rel); fi = VG_FIELD(max_rel_i); }
      else { fv = VG_FIELD(worst_excess); fi = VG_FIELD(worst_i); }
      VgArg t; /* none yet (index -1: vgct_better takes any held maximum over it) */
      if (k == 18) { t.v = z.max_abs; t.i = z.max_abs_i; t.x = z.max_abs_a; t.y = z.max_abs_e; }
      else if (k == 19) { t.v = z.max_rel; t.i = z.max_rel_i; t.x = t.y = 0.0; }
      else { t.v = z.worst_excess; t.i = z.worst_i; t.x = t.y = 0.0; }
#pragma unroll
      for (int j = 0, r = lane; j < PER; ++j, r += 32) {
        if (r >= nrec) break;
        VgArg o;
        o.v = vg_fd(sm, r, fv);
        o.i = vg_fi(sm, r, fi);
        o.x = fx >= 0 ? vg_fd(sm, r, fx) : 0.0;
        o.y = fy >= 0 ? vg_fd(sm, r, fy) : 0.0;
        vg_arg_fold(t, o);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        VgArg u;
        u.v = __shfl_down_sync(0xffffffffu, t.v, o);
        u.i = __shfl_down_sync(0xffffffffu, t.i, o);
        u.x = __shfl_down_sync(0xffffffffu, t.x, o);
        u.y = __shfl_down_sync(0xffffffffu, t.y, o);
        if (lane + o < 32) vg_arg_fold(t, u);
      }
      if (lane == 0) {
        od[fv] = t.v;
        oi[fi] = t.i;
        if (fx >= 0) { od[fx] = t.x; od[fy] = t.y; }
      }
    }
  }
  if (threadIdx.x == 0) { /* the scales: 1 in every unscaled record */
    out.scale_a = z.scale_a;
    out.scale_e = z.scale_e;
    out.scale_d = z.scale_d;
  }
  __syncthreads(); /* every record is read, `out` complete */
  if ((int)threadIdx.x < (int)(sizeof(vgct_acc) / 8))
    reinterpret_cast<long long *>(&sm[0].a)[threadIdx.x] = reinterpret_cast<const long long *>(&out)[threadIdx.x];
  __syncthreads();
}
#undef VG_FIELD

/* The block reduction for a kernel of mode SC (VG_MODE_*, above). */
template <int NT, int SC>
__device__ __forceinline__ void vg_block_merge(VAcc *sm) {
  if constexpr (SC == VG_MODE_SCALED) vg_block_merge_tree<NT>(sm);
  else vg_block_merge_fields<NT>(sm);
}

/* "Last block done" detection: every block publishes its partial (any
 * thread, any number of global writes or atomics), then arrives on an integer
 * counter; the block that sees gridDim-1 merges all partials in a fixed order
 * and resets the counter for the next launch.  The arrival is the pattern of
 * cooperative_groups' grid barrier (cooperative_groups/details/sync.h, sm_70
 * and later): a block barrier, then one thread's atom.add.acq_rel.gpu -- its
 * release half orders every write the block made before the barrier (PTX ISA,
 * "Memory Consistency Model": causality order is transitive through bar.sync,
 * and a release at gpu scope is cumulative), its acquire half makes the
 * other blocks' writes visible to the last block, which reads them with
 * ld.global.cg (L2) after the second barrier.  Trade-off against the CUDA
 * samples' threadFenceReduction form (__threadfence(), a fence.sc.gpu, in
 * every thread, then the atomic): the same guarantee with one acq_rel atomic
 * a block; measured on an H200 (2026-12-01, bench/gpu_kernels.py): a one-block
 * k_sel_buf 7.5 -> 7.2 us, k_sel_data 18.3 -> 17.6 us -- the fences were not
 * what holds those kernels (their serial scan is; docs/performance.md). */
__device__ __forceinline__ bool vg_last_block(unsigned *counter) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(1u) : "memory");
    last = old == gridDim.x - 1;
  }
  __syncthreads();
  return last;
}

/* ---- bulk copies into shared memory (sm_90: cp.async.bulk + mbarrier) ----
 * PTX ISA 8.0, "Data Movement and Conversion Instructions: cp.async.bulk"
 * and "Parallel Synchronization and Communication Instructions: mbarrier":
 * one thread starts a copy of `bytes` (a multiple of 16; both addresses
 * 16-byte aligned) from global to shared memory whose completion counts as
 * `bytes` transactions on an mbarrier; a thread arms the barrier's phase
 * with the bytes to expect (arrive.expect_tx), and every reader waits for
 * the phase (try_wait.parity).  The copy engine holds the bytes in flight,
 * not registers: the reduce's loads of the next steps cost no registers.
 * sm_90 and later only: for older targets (VGCT_CUDA_ARCHS="80;90") the
 * helpers compile to nothing / a trap, and the host picks the ring only on
 * a device of compute capability 9 or more (vgct_cuda_reduce). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define VG_HAS_BULK 1 /* cp.async.bulk and mbarrier transaction counts: sm_90 */
#else
#define VG_HAS_BULK 0
#endif

__device__ __forceinline__ unsigned vg_smem_addr(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void vg_mbar_init(uint64_t *bar, unsigned count) {
#if VG_HAS_BULK
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(vg_smem_addr(bar)), "r"(count)
               : "memory");
#endif
}

/* Make the initialised barriers visible to the copy engine (async proxy). */
__device__ __forceinline__ void vg_mbar_init_fence(void) {
#if VG_HAS_BULK
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Arrive (count 1) and expect `bytes` more transactions in this phase. */
__device__ __forceinline__ void vg_mbar_arrive_tx(uint64_t *bar, unsigned bytes) {
#if VG_HAS_BULK
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(vg_smem_addr(bar)),
               "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void vg_bulk_load(void *dst, const void *src, unsigned bytes,
                                             uint64_t *bar) {
#if VG_HAS_BULK
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          vg_smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(vg_smem_addr(bar))
      : "memory");
#else
  __trap(); /* not reached: the host picks the ring only on sm_90+ */
#endif
}

/* A reader's release of a stage before the copy engine refills it: every
 * lane that read the stage (generic proxy) runs this after its last read and
 * before the __syncwarp after which lane 0 starts the refill's cp.async.bulk
 * (async proxy).  PTX ISA, "Memory Consistency Model", proxies: accesses to
 * the same memory through different proxies are ordered only by a proxy
 * fence (fence.proxy.async), in either direction -- here a read before an
 * async write (write after read); a __syncwarp orders the generic proxy only,
 * and a lane's shared loads may still be outstanding when lane 0 issues the
 * copy.  Without it the ring kernel misread pairs, now and then, with
 * several processes sharing the GPU: the value read at flat index i was the
 * one at i + 6144, three steps on -- the stage's refill had landed before
 * the read (11 of 321 processes of scripts/gpu_repeat_check.py under load
 * failed without the fence, each of the 6 inspected a wrong first result;
 * 0 of 163 with it; its cost within the A/B's noise: docs/performance.md,
 * 2026-12-03 16:37 UTC). */
__device__ __forceinline__ void vg_stage_release(void) {
#if VG_HAS_BULK
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Wait until the phase of parity `parity` of *bar has completed. */
__device__ __forceinline__ void vg_mbar_wait(uint64_t *bar, unsigned parity) {
#if VG_HAS_BULK
  unsigned ok;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(vg_smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!ok);
#endif
}

/* Inner-space decomposition: row index (over axes 0..k-2) -> offsets.  Every
 * caller's row is below sh[0] * ... * sh[k-2] (a chunk's or an element's
 * position over the inner length L, a column-mode row), so the outermost axis
 * takes what the inner ones leave, undivided: k - 2 divisions, not k - 1. */
__device__ __forceinline__ void vg_row_offsets(const IterSpec &it, uint64_t row, int64_t &oa,
                                               int64_t &oe, int64_t &of) {
  oa = oe = of = 0;
  for (int d = it.k - 2; d >= 1; --d) {
    uint64_t q = vg_div(row, it.dv[d]);
    int64_t r = (int64_t)(row - q * (uint64_t)it.sh[d]);
    oa += r * it.sa[d];
    oe += r * it.se[d];
    of += r * it.sf[d];
    row = q;
  }
  if (it.k >= 2) {
    oa += (int64_t)row * it.sa[0];
    oe += (int64_t)row * it.se[0];
    of += (int64_t)row * it.sf[0];
  }
}

/* Chunk c of the data passes' iteration (rows of L elements along the inner
 * axis, cpr chunks of CH pairs a row, cprd dividing by cpr): the element
 * offsets of its first pair in `actual` and `expected` (from it.pa / it.pe),
 * its position row * L + col0 in the row-major order of the inner space, and
 * its pair count (CH, fewer at a row's end).  Shared by the selection's and
 * the histogram's data passes. */
struct VgChunkPos {
  int64_t oa, oe, pos;
  int cnt;
};

template <int CH>
__device__ __forceinline__ VgChunkPos vg_chunk_pos(const IterSpec &it, int64_t c, int64_t cpr,
                                                   const FastDiv &cprd, int64_t L, int64_t sai,
                                                   int64_t sei) {
  const uint64_t row = vg_div((uint64_t)c, cprd);
  const int64_t col0 = (c - (int64_t)row * cpr) * CH;
  int64_t oa, oe, of;
  vg_row_offsets(it, row, oa, oe, of);
  VgChunkPos r;
  r.oa = oa + col0 * sai;
  r.oe = oe + col0 * sei;
  r.pos = (int64_t)row * L + col0;
  r.cnt = (int)min((int64_t)CH, L - col0);
  return r;
}

#endif /* __CUDACC__ */
#endif /* VGCT_CUDA_INTERNAL_CUH_ */
