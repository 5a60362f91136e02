/*
 * cpu_engine.c -- the CPU engine: vgct_cpu_reduce, vgct_cpu_select,
 * vgct_cpu_histogram, vgct_cpu_presel_new/_free, vgct_cpu_fingerprint
 * (contracts: vgct_engine.h).
 *
 * One translation unit in parts, by concern (so that the static helpers of
 * each part inline into the others): this file holds the overview below, the
 * constants, the test hooks, allocation and vgct_cpu_fingerprint (the hash
 * vgct_fp_element / vgct_fp_finish of vgct_stats.h), and includes, in order,
 * cpu_tiles.inc (loaders, iteration plan, tiles), cpu_windows.inc (quantile
 * key windows), cpu_fastfold.inc (the folds), cpu_threads.inc (work partition
 * and threads), cpu_reduce.inc (the reduction; per-slice statistics in
 * cpu_slices.inc) and cpu_select.inc (exact selection, key histograms).
 *
 * The statistics themselves are defined once, in vgct_stats.h; elements become
 * doubles only through vgct_dtypes.h.  The engine decides the ORDER in which
 * pairs are folded, which fixes every rounding, and makes that order fast:
 *
 *  iteration  The two views are walked in one "iteration order": the logical
 *             dims, size-1 dims dropped, permuted towards memory order when
 *             both inputs agree (a transposed pair is read sequentially), and
 *             merged where contiguous for BOTH inputs and for the logical flat
 *             index.  Position p (0..n-1) in that order has a flat logical
 *             index idx(p) (== p when no permutation happened: "monotonic").
 *  segments   [0, n) is cut into segments of SEG positions; SEG depends only
 *             on n (seg_size()).  Each segment is folded alone into one
 *             vgct_acc; segment results are merged pairwise in index order.
 *             Threads only decide WHO folds a segment, never how, so results
 *             are bitwise identical for any thread count and across calls.
 *  tiles      Inside a segment, pairs are loaded TILE at a time into double
 *             buffers (one loader loop per dtype, per run of the innermost
 *             dim: no per-element dispatch).  A tile is folded into a FRESH
 *             accumulator: NLANE lane accumulators, element j of the tile
 *             going to lane j % NLANE with vgct_acc_update, the lanes merged
 *             in order with vgct_acc_merge; tile accumulators are merged
 *             pairwise (a binary-counter stack), so rounding error grows like
 *             log(n), not n.  For the scaled (float64) update every lane
 *             starts at the tile scales S_a, S_e, S_d = pow2_ceil(max finite
 *             |a|, |e|, |a - e| of the tile) (a valid accumulator state: each
 *             sum family is relative to a power of two >= every value of its
 *             quantity), so no rescaling happens inside a tile.
 *  fast path  A tile whose pairs are all finite is folded by fold_fast(),
 *             which evaluates the same expressions lane by lane in
 *             vectorisable loops and reproduces the lane fold above BIT FOR
 *             BIT (tested: tests/.../vgct/test_engine_internals.py forces the
 *             definition path on every tile and compares); maxima and their
 *             lowest indices are exact either way.  Tiles with a NaN/Inf go
 *             through vgct_acc_update itself.
 *  float32    float32 x float32 (unscaled) reductions keep tiles in float32
 *             (tile_fill32: read in place for one contiguous run, else
 *             gathered): the fold (cpu_fold32.inc) widens each vector in
 *             registers and folds the same lanes with the same operations,
 *             so results are those of the double tiles bit for bit; the
 *             double buffers are filled (tile_dbl) only for the rare paths
 *             (maxima/max_rel scans, non-finite tiles, per-pair slices).  At
 *             AVX-512 the fold also keeps each pair's max_rel candidate bit,
 *             so the max_rel scan visits only flagged pairs.
 *  slices     With dim >= 0 the segments are grouped into at most 8 blocks
 *             (count fixed by n and the slice count); each block owns an array
 *             of vgct_slice_acc, the blocks are merged in order at the end.
 *             A tile lying in one slice (slice axis outer) contributes one
 *             partial (NLANE lanes of vgct_slice_update at S_e, S_d, merged in
 *             lane order -- equal to the tile's own sums); otherwise each pair
 *             goes to its slice with vgct_slice_update in iteration order.
 *  windows    The exact quantiles of compare(), n >= 2^12 (vgct_cpu_presel):
 *             a sample of n/256 pairs (at least 2^14 -- n/16, at least 1024,
 *             in 32-36 chunks, below 2^18 pairs) predicts a key window around the
 *             quantiles' ranks and the tie values in it; the REDUCTION's pass
 *             counts the keys below the window and equal to its edges and tie
 *             values, and stores the other keys inside (bounded); the select
 *             then reads every rank that fell inside off the window in memory:
 *             no pass of its own.  Ranks outside (the sample misled, or a
 *             window overflowed) take the radix passes below: exact either way.
 *  select     Radix selection on the vgct_absdiff_key keys: histogram passes
 *             over 16-bit digits (threads: per-thread histograms, exact sums),
 *             narrowing each requested rank to one bucket, until the buckets
 *             that hold the ranks fit a bounded candidate buffer; one more
 *             pass gathers them and an in-memory multi-select finishes (its
 *             rounds' pivots from a sample of the keys when the ranks lie
 *             close together: cpu_select.inc u64_mselect).  For
 *             n >= 2^18 a sample of ~32 tiles first predicts a key range per
 *             rank; the first pass also gathers those ranges (bounded) and
 *             counts the keys below them exactly, so a rank that lands inside
 *             a complete range is finished after ONE pass; any other rank
 *             continues with the radix passes (exact either way).
 *  histogram  vgct_cpu_histogram: the digit histograms of the same keys, for
 *             compare_sharded's distributed selection ([E]).
 *
 * No allocation depends on n except through bounded quantities: segment
 * results (<= 2^14), slice blocks (<= 8 x slices), the candidate buffer
 * (<= 2^20 keys, <= n), the windows' stored keys (<= 2^22 in all) and the
 * sample (<= 2^18 keys).  A known n_finite that fits the candidate buffer
 * (n < 2^12, or no window) is finished by one pass gathering every key.
 * Failures return VGCT_ENOMEM / VGCT_EVALUE with a message (every
 * allocation failure is exercised by the engine tests).
 */
#define _POSIX_C_SOURCE 200809L
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* a*b+c must round twice, as in vgct_stats.h */
#endif

#include <float.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgct_engine.h"
#include "vgct_fpenv.h"

#define TILE 512
#define NLANE 8
/* cpu_fold32.inc packs one byte of max_rel candidate bits per NLANE pairs */
_Static_assert(NLANE == 8, "NLANE: the candidate bytes of cpu_fold32.inc hold 8 pairs");
#define SEG_MIN ((int64_t)1 << 16)
#define SEG_MAX_COUNT ((int64_t)1 << 14)
#define PAR_MIN_N ((int64_t)1 << 18)
#define MAX_THREADS 64
#define MAX_SLICE_BLOCKS 8
#define SLICE_BLOCK_BUDGET ((int64_t)1 << 22) /* nblk * nslices <= this */
#define SELECT_CAP ((int64_t)1 << 20)         /* candidate keys held at once */

/* Test hooks: compiled in only with -DVGCT_CPU_TESTING (the ctypes harness of
 * the engine tests); the extension build sees constants. */
#ifdef VGCT_CPU_TESTING
int vgct_cpu_test_force_slow = 0;      /* fold every tile by the definition */
int64_t vgct_cpu_test_seg_min = 0;     /* override SEG_MIN when > 0         */
int64_t vgct_cpu_test_par_min = -1;    /* override PAR_MIN_N when >= 0      */
int64_t vgct_cpu_test_select_cap = 0;  /* override SELECT_CAP when > 0      */
int vgct_cpu_test_last_passes = 0;     /* data passes of the last select   */
int vgct_cpu_test_level = -1;          /* cap the x86 code level when >= 0  */
int vgct_cpu_test_fail_alloc = 0;      /* > 0: the k-th allocation fails    */
int64_t vgct_cpu_test_presel_min = 0;  /* > 0: windows from this n on, from  *
                                        * samples of >= 1024 keys           */
int vgct_cpu_test_last_npv = 0;        /* window 0's pivots, last presel_new */
atomic_llong vgct_cpu_test_fused_tiles; /* tiles through ps_fused          */
#define FORCE_SLOW vgct_cpu_test_force_slow
#define SEG_MIN_EFF (vgct_cpu_test_seg_min > 0 ? vgct_cpu_test_seg_min : SEG_MIN)
#define PAR_MIN_EFF (vgct_cpu_test_par_min >= 0 ? vgct_cpu_test_par_min : PAR_MIN_N)
#define SELECT_CAP_EFF (vgct_cpu_test_select_cap > 0 ? vgct_cpu_test_select_cap : SELECT_CAP)
#define PRESEL_MIN_EFF (vgct_cpu_test_presel_min > 0 ? vgct_cpu_test_presel_min : VGCT_PRESEL_MIN_N)
#define PS_SAMPLE_MIN_EFF (vgct_cpu_test_presel_min > 0 ? (int64_t)1024 : PS_SAMPLE_MIN)
#else
#define FORCE_SLOW 0
#define SEG_MIN_EFF SEG_MIN
#define PAR_MIN_EFF PAR_MIN_N
#define SELECT_CAP_EFF SELECT_CAP
#define PRESEL_MIN_EFF VGCT_PRESEL_MIN_N
#define PS_SAMPLE_MIN_EFF PS_SAMPLE_MIN
#endif

/* Allocation (the test build can make the k-th one fail: the ENOMEM paths). */
static void *eng_malloc(size_t n) {
#ifdef VGCT_CPU_TESTING
  if (vgct_cpu_test_fail_alloc > 0 && --vgct_cpu_test_fail_alloc == 0) return NULL;
#endif
  return malloc(n);
}
static void *eng_calloc(size_t n, size_t size) {
#ifdef VGCT_CPU_TESTING
  if (vgct_cpu_test_fail_alloc > 0 && --vgct_cpu_test_fail_alloc == 0) return NULL;
#endif
  return calloc(n, size);
}

static void set_err(char *err, size_t errlen, const char *fmt, const char *what, long long v) {
  if (err && errlen) snprintf(err, errlen, fmt, what, v);
}

/* The parts of the engine, in this order (one translation unit):
 *   cpu_tiles.inc    element loaders, the iteration plan, tiles and their keys
 *   cpu_windows.inc  the quantile key windows read in the reduction's pass
 *   cpu_fastfold.inc the fast folds (cpu_fold.inc, cpu_fold32.inc) and their choice
 *   cpu_threads.inc  work partition: merge stack, cancellation, threads, segments
 *   cpu_reduce.inc   vgct_cpu_reduce (per-slice statistics: cpu_slices.inc)
 *   cpu_select.inc   vgct_cpu_select (radix selection) and vgct_cpu_histogram
 * and below, vgct_cpu_fingerprint. */
#define VGCT_CPU_ENGINE_PARTS 1
#include "cpu_tiles.inc"
#include "cpu_windows.inc"
#include "cpu_fastfold.inc"
#include "cpu_threads.inc"
#include "cpu_reduce.inc"
#include "cpu_select.inc"

/* ======================================================================
 * vgct_cpu_fingerprint
 * ====================================================================== */
typedef struct {
  const plan_t *P;
  int64_t seg;
  uint64_t *part; /* per segment */
} fp_ctx;

static void fp_unit(void *ctx, int64_t s, int tid) {
  (void)tid;
  fp_ctx *C = (fp_ctx *)ctx;
  const plan_t *P = C->P;
  const int k = P->nd - 1;
  const int64_t start = s * C->seg;
  const int64_t end = start + C->seg < P->n ? start + C->seg : P->n;
  const int is = P->isa;
  const int64_t bst = P->sa[k] * is, lst = P->sl[k];
  uint64_t sum = 0;
  iter_t it;
  iter_seek(P, &it, start);
  while (it.pos < end) {
    int64_t rem = P->shape[k] - it.idx[k];
    if (rem > end - it.pos) rem = end - it.pos;
    const char *q = P->pa + it.oa * is;
    const int64_t l0 = it.ol;
    switch (is) { /* raw storage bits, zero-extended */
      case 1: for (int64_t j = 0; j < rem; ++j) sum += vgct_fp_element(VGCT_RD(uint8_t, q + j * bst), l0 + j * lst); break;
      case 2: for (int64_t j = 0; j < rem; ++j) sum += vgct_fp_element(VGCT_RD(uint16_t, q + j * bst), l0 + j * lst); break;
      case 4: for (int64_t j = 0; j < rem; ++j) sum += vgct_fp_element((uint32_t)VGCT_RD(int32_t, q + j * bst), l0 + j * lst); break;
      default: for (int64_t j = 0; j < rem; ++j) sum += vgct_fp_element((uint64_t)VGCT_RD(int64_t, q + j * bst), l0 + j * lst); break;
    }
    iter_advance(P, &it, rem);
  }
  C->part[s] = sum;
}

int vgct_cpu_fingerprint(const vgct_view *x, int nthreads, uint64_t *out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  plan_t P;
  plan_build(x, x, -1, &P);
  uint64_t sum = 0;
  if (P.n > 0) {
    fp_ctx C;
    C.P = &P;
    C.seg = seg_size(P.n);
    int64_t nseg = (P.n + C.seg - 1) / C.seg;
    C.part = (uint64_t *)eng_malloc((size_t)nseg * sizeof(uint64_t));
    if (!C.part) {
      set_err(err, errlen, "vgct_cpu_fingerprint: out of memory (%s for %lld segments)",
              "partial sums", (long long)nseg);
      return VGCT_ENOMEM;
    }
    par_run(pick_threads(nthreads, P.n, nseg), nseg, fp_unit, &C, NULL);
    for (int64_t s = 0; s < nseg; ++s) sum += C.part[s]; /* mod 2^64: order-free */
    free(C.part);
  }
  *out = vgct_fp_finish(sum, x->dtype, x->ndim, x->shape);
  return VGCT_OK;
}
