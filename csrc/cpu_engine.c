/*
 * cpu_engine.c -- the CPU engine: vgct_cpu_reduce, vgct_cpu_select,
 * vgct_cpu_fingerprint (contracts: vgct_engine.h).
 *
 * The statistics themselves are defined once, in vgct_stats.h; elements become
 * doubles only through vgct_dtypes.h.  This file decides the ORDER in which
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
 *  windows    The exact quantiles of compare(), n >= 2^18 (vgct_cpu_presel):
 *             a sample of n/256 pairs predicts a key window around the
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
 *             pass gathers them and an in-memory multi-select finishes.  For
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
 * (n < 2^18, no window) is finished by one pass gathering every key.  Failures return VGCT_ENOMEM / VGCT_EVALUE with a message
 * (every allocation failure is exercised by the engine tests).
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

/* ======================================================================
 * Element loaders: one loop per dtype over a strided run, built on the
 * vgct_dtypes.h readers and converters (the contiguous case is a separate
 * loop so that compilers vectorise it).
 * ====================================================================== */
typedef void (*loader_fn)(const char *p, int64_t stride, int64_t cnt, double *out);

static inline double cv_bool(uint8_t v) { return v ? 1.0 : 0.0; }
static inline double cv_i8(int8_t v) { return (double)v; }
static inline double cv_i16(int16_t v) { return (double)v; }
static inline double cv_i32(int32_t v) { return (double)v; }
static inline double cv_i64(int64_t v) { return (double)v; }
static inline double cv_u8(uint8_t v) { return (double)v; }
static inline double cv_u16(uint16_t v) { return (double)v; }
static inline double cv_u32(uint32_t v) { return (double)v; }
static inline double cv_u64(uint64_t v) { return (double)v; }
static inline double cv_f32(float v) { return (double)v; }
static inline double cv_f64(double v) { return v; }

/* float16 and the float8 types: tables of every bit pattern, filled once
 * from the vgct_dtypes.h converters (their branches do not vectorise; a
 * table load does, as a gather, and is exact by construction). */
static double tab_f16[65536], tab_e4m3[256], tab_e5m2[256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;
static void tab_init(void) {
  for (uint32_t u = 0; u < 65536; ++u) tab_f16[u] = vgct_f16_to_f64((uint16_t)u);
  for (uint32_t u = 0; u < 256; ++u) {
    tab_e4m3[u] = vgct_e4m3fn_to_f64((uint8_t)u);
    tab_e5m2[u] = vgct_e5m2_to_f64((uint8_t)u);
  }
}
static inline double lut_f16(uint16_t v) { return tab_f16[v]; }
static inline double lut_e4m3(uint8_t v) { return tab_e4m3[v]; }
static inline double lut_e5m2(uint8_t v) { return tab_e5m2[v]; }

#define DEF_LOADER1(NAME, T, CONV, ATTR)                                        \
  ATTR static void NAME(const char *p, int64_t st, int64_t cnt, double *out) {  \
    if (st == 1) {                                                              \
      for (int64_t i = 0; i < cnt; ++i) out[i] = CONV(VGCT_RD(T, p + i * (int64_t)sizeof(T))); \
    } else {                                                                    \
      const int64_t bst = st * (int64_t)sizeof(T);                              \
      for (int64_t i = 0; i < cnt; ++i) out[i] = CONV(VGCT_RD(T, p + i * bst)); \
    }                                                                           \
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VGCT_NO_CPU_DISPATCH)
#define DEF_LOADER(NAME, T, CONV)  \
  DEF_LOADER1(NAME, T, CONV, )     \
  DEF_LOADER1(NAME##_avx2, T, CONV, __attribute__((target("avx2")))) \
  DEF_LOADER1(NAME##_avx512, T, CONV, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
#define LOADER_TABLE(SUFFIX)                                                              \
  {ld_bool##SUFFIX, ld_i8##SUFFIX, ld_i16##SUFFIX, ld_i32##SUFFIX, ld_i64##SUFFIX,         \
   ld_u8##SUFFIX, ld_f16##SUFFIX, ld_bf16##SUFFIX, ld_f32##SUFFIX, ld_f64##SUFFIX,         \
   ld_e4m3##SUFFIX, ld_e5m2##SUFFIX, ld_u16##SUFFIX, ld_u32##SUFFIX, ld_u64##SUFFIX}
#else
#define DEF_LOADER(NAME, T, CONV) DEF_LOADER1(NAME, T, CONV, )
#endif
DEF_LOADER(ld_bool, uint8_t, cv_bool)
DEF_LOADER(ld_i8, int8_t, cv_i8)
DEF_LOADER(ld_i16, int16_t, cv_i16)
DEF_LOADER(ld_i32, int32_t, cv_i32)
DEF_LOADER(ld_i64, int64_t, cv_i64)
DEF_LOADER(ld_u8, uint8_t, cv_u8)
DEF_LOADER(ld_f16, uint16_t, lut_f16)
DEF_LOADER(ld_bf16, uint16_t, vgct_bf16_to_f64)
DEF_LOADER(ld_f32, float, cv_f32)
DEF_LOADER(ld_f64, double, cv_f64)
DEF_LOADER(ld_e4m3, uint8_t, lut_e4m3)
DEF_LOADER(ld_e5m2, uint8_t, lut_e5m2)
DEF_LOADER(ld_u16, uint16_t, cv_u16)
DEF_LOADER(ld_u32, uint32_t, cv_u32)
DEF_LOADER(ld_u64, uint64_t, cv_u64)
#undef DEF_LOADER
#undef DEF_LOADER1

static const loader_fn loaders[VGCT_NUM_DTYPES] = {
    ld_bool, ld_i8, ld_i16, ld_i32, ld_i64, ld_u8,
    ld_f16, ld_bf16, ld_f32, ld_f64, ld_e4m3, ld_e5m2, ld_u16, ld_u32, ld_u64};
#ifdef LOADER_TABLE
static const loader_fn loaders_avx2[VGCT_NUM_DTYPES] = LOADER_TABLE(_avx2);
static const loader_fn loaders_avx512[VGCT_NUM_DTYPES] = LOADER_TABLE(_avx512);
#endif

/* 0 baseline, 1 AVX2, 2 AVX-512F (x86-64 with GCC or clang; else 0) */
static int cpu_level(void) {
  int lv = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VGCT_NO_CPU_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    lv = 2;
  else if (__builtin_cpu_supports("avx2"))
    lv = 1;
#endif
#ifdef VGCT_CPU_TESTING
  if (vgct_cpu_test_level >= 0 && vgct_cpu_test_level < lv) lv = vgct_cpu_test_level;
#endif
  return lv;
}

static const loader_fn *pick_loaders(void) {
  pthread_once(&tab_once, tab_init);
#ifdef LOADER_TABLE
  const int lv = cpu_level();
  if (lv >= 2) return loaders_avx512;
  if (lv >= 1) return loaders_avx2;
#else
  (void)cpu_level; /* no run-time dispatch (non-x86, VGCT_NO_CPU_DISPATCH) */
#endif
  return loaders;
}

/* ======================================================================
 * Iteration plan
 * ====================================================================== */
typedef struct {
  int nd;                       /* iteration dims (>= 1), outer -> inner */
  int64_t n;
  int64_t shape[VGCT_MAX_NDIM];
  int64_t sa[VGCT_MAX_NDIM];    /* element strides of a, e               */
  int64_t se[VGCT_MAX_NDIM];
  int64_t sl[VGCT_MAX_NDIM];    /* logical flat-index strides            */
  int dpos;                     /* iteration dim that is the slice axis  */
  int monotonic;                /* idx(p) == p                           */
  const char *pa, *pe;
  int dta, dte, isa, ise;
  loader_fn lda, lde;
  int intpair;                  /* vgct_pair_is_int64: the exact integer path */
} plan_t;

static inline int64_t iabs64(int64_t x) { return x < 0 ? -x : x; }

/* 1 when iteration dim j (currently inner to i) should move outside i: every
 * operand with an opinion (both strides non-zero) prefers it, one strictly. */
static int prefer_outer(const plan_t *P, int j, int i) {
  int yes = 0, no = 0;
  const int64_t *ss[2] = {P->sa, P->se};
  for (int o = 0; o < 2; ++o) {
    int64_t sj = iabs64(ss[o][j]), si = iabs64(ss[o][i]);
    if (sj == 0 || si == 0) continue;
    if (sj > si) yes = 1;
    else if (sj < si) no = 1;
  }
  return yes && !no;
}

static void plan_build(const vgct_view *a, const vgct_view *e, int dim, plan_t *P) {
  memset(P, 0, sizeof *P);
  P->n = vgct_numel(a);
  P->pa = a->data; P->pe = e->data;
  P->dta = a->dtype; P->dte = e->dtype;
  P->isa = vgct_dtype_itemsize[a->dtype]; P->ise = vgct_dtype_itemsize[e->dtype];
  const loader_fn *ld = pick_loaders();
  P->lda = ld[a->dtype]; P->lde = ld[e->dtype];
  P->intpair = vgct_pair_is_int64(a->dtype, e->dtype);
  P->dpos = -1;
  int64_t lstride[VGCT_MAX_NDIM];
  int64_t acc = 1;
  for (int k = a->ndim - 1; k >= 0; --k) { lstride[k] = acc; acc *= a->shape[k]; }
  int nd = 0;
  for (int k = 0; k < a->ndim; ++k) {
    if (a->shape[k] == 1) continue; /* also a size-1 slice axis: slice 0 */
    P->shape[nd] = a->shape[k];
    P->sa[nd] = a->strides[k];
    P->se[nd] = e->strides[k];
    P->sl[nd] = lstride[k];
    if (k == dim) P->dpos = nd;
    ++nd;
  }
  if (nd == 0) { /* a single element (or none) */
    P->nd = 1; P->shape[0] = P->n; P->sa[0] = P->se[0] = P->sl[0] = 1;
    P->monotonic = 1;
    return;
  }
  P->nd = nd;
  /* insertion sort towards memory order (stable; no move without agreement) */
  int permuted = 0;
  for (int j = 1; j < nd; ++j) {
    for (int k = j; k > 0 && prefer_outer(P, k, k - 1); --k) {
      int64_t t;
      t = P->shape[k]; P->shape[k] = P->shape[k - 1]; P->shape[k - 1] = t;
      t = P->sa[k]; P->sa[k] = P->sa[k - 1]; P->sa[k - 1] = t;
      t = P->se[k]; P->se[k] = P->se[k - 1]; P->se[k - 1] = t;
      t = P->sl[k]; P->sl[k] = P->sl[k - 1]; P->sl[k - 1] = t;
      if (P->dpos == k) P->dpos = k - 1;
      else if (P->dpos == k - 1) P->dpos = k;
      permuted = 1;
    }
  }
  P->monotonic = !permuted;
  /* merge (outer k, inner k+1) when contiguous for a, e and the flat index */
  int w = 0;
  for (int k = 1; k < nd; ++k) {
    int mergeable = P->dpos != w && P->dpos != k &&
                    P->sa[w] == P->sa[k] * P->shape[k] && P->se[w] == P->se[k] * P->shape[k] &&
                    P->sl[w] == P->sl[k] * P->shape[k];
    if (mergeable) {
      P->shape[w] *= P->shape[k];
      P->sa[w] = P->sa[k]; P->se[w] = P->se[k]; P->sl[w] = P->sl[k];
    } else {
      ++w;
      P->shape[w] = P->shape[k]; P->sa[w] = P->sa[k]; P->se[w] = P->se[k]; P->sl[w] = P->sl[k];
      if (P->dpos == k) P->dpos = w;
    }
  }
  P->nd = w + 1;
}

typedef struct {
  int64_t idx[VGCT_MAX_NDIM];
  int64_t oa, oe, ol; /* element offsets of a, e and the flat index */
  int64_t pos;
} iter_t;

static void iter_seek(const plan_t *P, iter_t *it, int64_t pos) {
  it->pos = pos;
  it->oa = it->oe = it->ol = 0;
  int64_t r = pos;
  for (int k = P->nd - 1; k >= 0; --k) {
    int64_t q = r / P->shape[k];
    int64_t i = r - q * P->shape[k];
    r = q;
    it->idx[k] = i;
    it->oa += i * P->sa[k]; it->oe += i * P->se[k]; it->ol += i * P->sl[k];
  }
}

/* advance by cnt positions, cnt <= what is left of the current inner run */
static inline void iter_advance(const plan_t *P, iter_t *it, int64_t cnt) {
  int k = P->nd - 1;
  it->pos += cnt;
  it->idx[k] += cnt;
  it->oa += cnt * P->sa[k]; it->oe += cnt * P->se[k]; it->ol += cnt * P->sl[k];
  while (it->idx[k] >= P->shape[k] && k > 0) {
    it->oa -= P->shape[k] * P->sa[k]; it->oe -= P->shape[k] * P->se[k];
    it->ol -= P->shape[k] * P->sl[k];
    it->idx[k] = 0;
    --k;
    it->idx[k] += 1;
    it->oa += P->sa[k]; it->oe += P->se[k]; it->ol += P->sl[k];
  }
}

/* ======================================================================
 * Tiles
 * ====================================================================== */
typedef struct {
  int off, len;
  int64_t l0;  /* flat index of the first pair; then + j * lstep   */
  int64_t s0;  /* slice index of the first pair (dim inner: + j)   */
} run_t;

typedef struct {
  double A[TILE], E[TILE];
  uint64_t IA[TILE], IE[TILE]; /* integer pairs: vgct_load_int bits (tile_fill_int) */
  int ua64, ue64;              /* ... and which side is uint64                    */
  int isint;                   /* filled by tile_fill_int                         */
  run_t runs[TILE];
  unsigned char bad[TILE]; /* patched (non-finite) pairs, valid when npatch > 0 */
  int nr, len, npatch;
  int64_t lstep; /* flat-index stride along the inner dim */
  /* float32 tiles (tile_fill32): the elements stay float32, at fa/fe (the
   * inputs themselves for one contiguous run, else FA/FE); A/E hold them as
   * doubles only once tile_dbl() ran (dbl) */
  const char *fa, *fe;
  int dbl;
  float FA[TILE], FE[TILE];
  unsigned char cm[TILE / 8]; /* max_rel candidate bits (fold32 returned 2) */
} tile_t;

/* The next run of a tile from it->pos (shared by tile_fill and tile_fill32):
 * the rest of the current inner row, cut at the segment's end; a first run
 * longer than TILE is cut at TILE, a later run that does not fit ends the
 * tile.  Records the run in t->runs and returns its length with the element
 * pointers of both inputs, or 0 when the tile is complete. */
static int64_t tile_next_run(const plan_t *P, const iter_t *it, int64_t end, tile_t *t,
                             const char **qa, const char **qe) {
  const int k = P->nd - 1;
  if (it->pos >= end) return 0;
  int64_t rem = P->shape[k] - it->idx[k];
  if (rem > end - it->pos) rem = end - it->pos;
  if (t->len == 0) { if (rem > TILE) rem = TILE; }
  else if (rem > TILE - t->len) return 0;
  run_t *r = &t->runs[t->nr++];
  r->off = t->len; r->len = (int)rem; r->l0 = it->ol;
  r->s0 = P->dpos >= 0 ? it->idx[P->dpos] : 0;
  *qa = P->pa + it->oa * P->isa;
  *qe = P->pe + it->oe * P->ise;
  return rem;
}

/* Fill a tile from it->pos (< end), converting to float64 (A, E).  A run of
 * the inner dim longer than TILE is cut in TILE chunks from its start;
 * shorter runs are packed whole. */
static void tile_fill(const plan_t *P, iter_t *it, int64_t end, tile_t *t) {
  const int k = P->nd - 1;
  t->len = 0; t->nr = 0; t->npatch = 0; t->lstep = P->sl[k]; t->dbl = 1; t->isint = 0;
  const char *qa, *qe;
  int64_t rem;
  while ((rem = tile_next_run(P, it, end, t, &qa, &qe)) > 0) {
    P->lda(qa, P->sa[k], rem, t->A + t->len);
    P->lde(qe, P->se[k], rem, t->E + t->len);
    t->len += (int)rem;
    iter_advance(P, it, rem);
  }
}

/* Integer pairs (P->intpair): the same runs, the raw integers (vgct_load_int)
 * into IA/IE; A/E are not filled. */
static void ld_int(const char *p, int64_t st, int64_t cnt, int dt, int isz, uint64_t *out) {
  const int64_t bst = st * isz;
  for (int64_t i = 0; i < cnt; ++i) out[i] = vgct_load_int(p + i * bst, dt);
}

static void tile_fill_int(const plan_t *P, iter_t *it, int64_t end, tile_t *t) {
  const int k = P->nd - 1;
  t->len = 0; t->nr = 0; t->npatch = 0; t->lstep = P->sl[k]; t->dbl = 0;
  t->ua64 = P->dta == VGCT_UINT64; t->ue64 = P->dte == VGCT_UINT64; t->isint = 1;
  const char *qa, *qe;
  int64_t rem;
  while ((rem = tile_next_run(P, it, end, t, &qa, &qe)) > 0) {
    ld_int(qa, P->sa[k], rem, P->dta, P->isa, t->IA + t->len);
    ld_int(qe, P->se[k], rem, P->dte, P->ise, t->IE + t->len);
    t->len += (int)rem;
    iter_advance(P, it, rem);
  }
}

/* float32 x float32 reductions (unscaled, the fold reads float32: "float32
 * tiles" in reduce_segment): the same runs as tile_fill, the elements left as
 * float32 -- read in place when the tile is one run contiguous in both
 * inputs, else gathered into FA/FE. */
static void gather_f32(const char *p, int64_t st, int64_t cnt, float *out) {
  if (st == 1) {
    memcpy(out, p, (size_t)cnt * sizeof(float));
  } else {
    const int64_t bst = st * (int64_t)sizeof(float);
    for (int64_t i = 0; i < cnt; ++i) out[i] = VGCT_RD(float, p + i * bst);
  }
}

static void tile_fill32(const plan_t *P, iter_t *it, int64_t end, tile_t *t) {
  const int k = P->nd - 1;
  const int direct = P->sa[k] == 1 && P->se[k] == 1;
  t->len = 0; t->nr = 0; t->npatch = 0; t->lstep = P->sl[k]; t->dbl = 0; t->isint = 0;
  t->fa = (const char *)t->FA; t->fe = (const char *)t->FE;
  const char *qa0 = NULL, *qe0 = NULL, *qa, *qe;
  int64_t rem;
  while ((rem = tile_next_run(P, it, end, t, &qa, &qe)) > 0) {
    if (t->nr == 1 && direct) {
      qa0 = qa; qe0 = qe; /* read in place unless a second run follows */
    } else {
      if (t->nr == 2 && qa0) {
        gather_f32(qa0, 1, t->runs[0].len, t->FA);
        gather_f32(qe0, 1, t->runs[0].len, t->FE);
        qa0 = qe0 = NULL;
      }
      gather_f32(qa, P->sa[k], rem, t->FA + t->len);
      gather_f32(qe, P->se[k], rem, t->FE + t->len);
    }
    t->len += (int)rem;
    iter_advance(P, it, rem);
  }
  if (qa0) { t->fa = qa0; t->fe = qe0; }
}

/* A/E of a float32 tile (for the scans and every path but the fold) */
static void tile_dbl(tile_t *t, const plan_t *P) {
  if (t->dbl) return;
  P->lda(t->fa, 1, t->len, t->A);
  P->lde(t->fe, 1, t->len, t->E);
  t->dbl = 1;
}

/* Scale of a tile for the scaled update, per sum family: pow2_ceil of the
 * largest finite magnitude of the family's quantity (VGCT_MIN_SCALE when
 * there is none, or all are zero; 2^1023 for an overflowing difference). */
static inline double tile_scale(double m) { return m > 0.0 ? vgct_pow2_ceil(m) : VGCT_MIN_SCALE; }

/* The selection keys of a tile's finite pairs (vgct_absdiff_key), in tile
 * order; returns their number.  A tile without NaN/Inf (exponent field not
 * all ones, tested with integer operations that vectorise) takes a loop
 * without class tests, which computes the same keys. */
static int tile_keys32(const tile_t *t, uint64_t *restrict keys);
static int tile_keys(const tile_t *t, uint64_t *restrict keys) {
  if (!t->dbl && !t->isint) return tile_keys32(t, keys);
  if (t->isint) { /* an integer tile (tile_fill_int): every pair is finite */
    const int ua = t->ua64, ue = t->ue64;
    for (int j = 0; j < t->len; ++j) {
      vgct_int_cmp c;
      vgct_int_pair(t->IA[j], ua, t->IE[j], ue, 0.0, 0.0, &c);
      keys[j] = vgct_bits_from_f64(c.ad);
    }
    return t->len;
  }
  const uint64_t EXP = 0x7ff0000000000000ULL, ONE = 0x0010000000000000ULL;
  const int len = t->len;
  uint64_t bad = 0;
  for (int j = 0; j < len; ++j) { /* exponent all ones <=> bit 63 of (exp field + 1) */
    const uint64_t ba = vgct_bits_from_f64(t->A[j]), be = vgct_bits_from_f64(t->E[j]);
    bad |= ((ba & EXP) + ONE) | ((be & EXP) + ONE);
  }
  if (!(bad >> 63)) {
    for (int j = 0; j < len; ++j) keys[j] = vgct_bits_from_f64(fabs(t->A[j] - t->E[j]));
    return len;
  }
  int m = 0;
  for (int j = 0; j < len; ++j)
    if (vgct_absdiff_key(t->A[j], t->E[j], &keys[m])) ++m;
  return m;
}

/* The same keys from a float32 tile (tile_fill32: A/E not filled): float32
 * -> float64 is exact, so fabs((double)a - (double)e) is the key of
 * vgct_absdiff_key on the loaded doubles; a float32 is finite iff its double
 * is (exponent field not all ones: bit 31 of (exp field + 1)). */
static int tile_keys32(const tile_t *t, uint64_t *restrict keys) {
  const uint32_t EXP = 0x7f800000u, ONE = 0x00800000u;
  const int len = t->len;
  const char *pa = t->fa, *pe = t->fe;
  uint32_t bad = 0;
  for (int j = 0; j < len; ++j) {
    uint32_t ba, be;
    memcpy(&ba, pa + 4 * (size_t)j, 4);
    memcpy(&be, pe + 4 * (size_t)j, 4);
    bad |= ((ba & EXP) + ONE) | ((be & EXP) + ONE);
  }
  if (!(bad >> 31)) {
    for (int j = 0; j < len; ++j) {
      float fa, fe;
      memcpy(&fa, pa + 4 * (size_t)j, 4);
      memcpy(&fe, pe + 4 * (size_t)j, 4);
      keys[j] = vgct_bits_from_f64(fabs((double)fa - (double)fe));
    }
    return len;
  }
  int m = 0;
  for (int j = 0; j < len; ++j) {
    float fa, fe;
    memcpy(&fa, pa + 4 * (size_t)j, 4);
    memcpy(&fe, pe + 4 * (size_t)j, 4);
    if (vgct_absdiff_key((double)fa, (double)fe, &keys[m])) ++m;
  }
  return m;
}

/* fill a tile for the selection keys: raw integers for an integer pair,
 * float32 left as float32 (tile_keys32) for a float32 x float32 pair */
static inline void tile_fill_keys(const plan_t *P, iter_t *it, int64_t end, tile_t *t) {
  if (P->intpair) tile_fill_int(P, it, end, t);
  else if (P->dta == VGCT_FLOAT32 && P->dte == VGCT_FLOAT32) tile_fill32(P, it, end, t);
  else tile_fill(P, it, end, t);
}

/* ---- key windows read in the reduction's pass (vgct_cpu_presel_new) ----
 * Window g: keys in [lo, hi].  Its pivots pv[0] = lo < ... < pv[npv-1] = hi
 * (npv = 1 when lo == hi) are counted, not stored: lo, hi and the values that
 * recur often in the sample (ties).  Every other key with lo < k < hi is
 * stored, through a per-thread staging area, into the window's buffer (at
 * most cap keys: pos > cap marks an overflow, the window is then unusable).
 * Keys below lo are counted.  So the window describes exactly the sorted
 * keys of ranks [lt, lt + eq[0] + ... + eq[npv-1] + stored). */
#define PS_MAXW 4   /* windows       */
#define PS_MAXPV 8  /* pivots of one */
#define PS_LBUF 256 /* staging keys per window and thread */
struct vgct_cpu_presel {
  int nw;
  uint64_t lo[PS_MAXW], hi[PS_MAXW];
  int npv[PS_MAXW];
  uint64_t pv[PS_MAXW][PS_MAXPV];
  int64_t pvs[PS_MAXW][PS_MAXPV]; /* the same, as int64 (keys < 2^63) */
  void (*kern)(const int64_t *, int, int64_t, int64_t, int, const int64_t *, int64_t *, int64_t *,
               unsigned char *);
  void (*keys)(const tile_t *, uint64_t *);
  void (*fused)(const tile_t *, int64_t, int64_t, int64_t *, unsigned char *);
  uint64_t *buf[PS_MAXW];
  int64_t cap[PS_MAXW];
  atomic_llong pos[PS_MAXW];
  uint64_t *mem;
  /* filled by vgct_cpu_reduce (filled = 1 when its pass completed) */
  int filled;
  int64_t nkeys;                 /* finite pairs seen                 */
  int64_t lt[PS_MAXW];           /* keys < lo                         */
  int64_t eq[PS_MAXW][PS_MAXPV]; /* keys == pv[i]                     */
};

typedef struct {
  int64_t nkeys;
  int64_t lt[PS_MAXW];
  int64_t eq[PS_MAXW][PS_MAXPV];
  int nst[PS_MAXW];
  uint64_t st[PS_MAXW][PS_LBUF];
} ps_thread;

static void ps_flush(struct vgct_cpu_presel *S, int g, const uint64_t *keys, int cnt) {
  const long long at = atomic_fetch_add(&S->pos[g], cnt);
  if (at + cnt <= S->cap[g]) memcpy(S->buf[g] + at, keys, (size_t)cnt * sizeof(uint64_t));
}

/* One window over a tile's keys: lt += keys < lo, eq[i] += keys == pv[i],
 * fl[j] = 1 for a key to store (lo < key < hi, no pivot).  Keys are < 2^63:
 * compared as int64 (packed signed compares: AVX2 / AVX-512 clones below). */
typedef void (*ps_kern_fn)(const int64_t *, int, int64_t, int64_t, int, const int64_t *, int64_t *,
                           int64_t *, unsigned char *);
#define PS_KERN(NAME, ATTR)                                                                      \
  ATTR static void NAME(const int64_t *restrict k, int m, int64_t lo, int64_t hi, int npv,       \
                        const int64_t *pv, int64_t *lt, int64_t *eq, unsigned char *restrict fl) { \
    int64_t c = 0;                                                                               \
    for (int j = 0; j < m; ++j) c += k[j] < lo;                                                  \
    *lt += c;                                                                                    \
    for (int i = 0; i < npv; ++i) {                                                              \
      const int64_t v = pv[i];                                                                   \
      int64_t ce = 0;                                                                            \
      for (int j = 0; j < m; ++j) ce += k[j] == v;                                               \
      eq[i] += ce;                                                                               \
    }                                                                                            \
    if (npv < 2) return;                                                                         \
    for (int j = 0; j < m; ++j) fl[j] = (unsigned char)((k[j] > lo) & (k[j] < hi));             \
    for (int i = 1; i < npv - 1; ++i) {                                                          \
      const int64_t v = pv[i];                                                                   \
      for (int j = 0; j < m; ++j) fl[j] &= (unsigned char)(k[j] != v);                           \
    }                                                                                            \
  }
PS_KERN(ps_kern_base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VGCT_NO_CPU_DISPATCH)
PS_KERN(ps_kern_avx2, __attribute__((target("avx2"))))
PS_KERN(ps_kern_avx512, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
static ps_kern_fn pick_ps_kern(void) {
  const int lv = cpu_level();
  return lv == 2 ? ps_kern_avx512 : lv == 1 ? ps_kern_avx2 : ps_kern_base;
}
#else
static ps_kern_fn pick_ps_kern(void) { return ps_kern_base; }
#endif

/* The keys of an all-finite tile (float32 elements, or the doubles A/E) */
typedef void (*keys_kern_fn)(const tile_t *, uint64_t *);
#define KEYS_KERN(NAME, ATTR)                                                                    \
  ATTR static void NAME(const tile_t *t, uint64_t *restrict keys) {                              \
    const int len = t->len;                                                                      \
    if (!t->dbl) {                                                                               \
      const char *pa = t->fa, *pe = t->fe;                                                       \
      for (int j = 0; j < len; ++j) {                                                            \
        float fa, fe;                                                                            \
        memcpy(&fa, pa + 4 * (size_t)j, 4);                                                      \
        memcpy(&fe, pe + 4 * (size_t)j, 4);                                                      \
        keys[j] = vgct_bits_from_f64(fabs((double)fa - (double)fe));                             \
      }                                                                                          \
    } else {                                                                                     \
      for (int j = 0; j < len; ++j) keys[j] = vgct_bits_from_f64(fabs(t->A[j] - t->E[j]));       \
    }                                                                                            \
  }
KEYS_KERN(keys_kern_base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VGCT_NO_CPU_DISPATCH)
KEYS_KERN(keys_kern_avx2, __attribute__((target("avx2"))))
KEYS_KERN(keys_kern_avx512, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
static keys_kern_fn pick_keys_kern(void) {
  const int lv = cpu_level();
  return lv == 2 ? keys_kern_avx512 : lv == 1 ? keys_kern_avx2 : keys_kern_base;
}
#else
static keys_kern_fn pick_keys_kern(void) { return keys_kern_base; }
#endif

/* the key of pair j of an all-finite (float32 or double) tile */
static inline uint64_t tile_key(const tile_t *t, int j) {
  if (t->dbl) return vgct_bits_from_f64(fabs(t->A[j] - t->E[j]));
  float fa, fe;
  memcpy(&fa, t->fa + 4 * (size_t)j, 4);
  memcpy(&fe, t->fe + 4 * (size_t)j, 4);
  return vgct_bits_from_f64(fabs((double)fa - (double)fe));
}

/* One window with no tie value inside (pivots lo and hi only: the common
 * case) over an all-finite tile, the keys computed and tested in the same
 * loop: cnt[0] += keys < lo, cnt[1] += keys == lo, cnt[2] += keys == hi,
 * fl[j] = lo < key < hi (the few keys to store are computed again, tile_key). */
typedef void (*ps_fused_fn)(const tile_t *, int64_t, int64_t, int64_t *, unsigned char *);
#define PS_FUSED(NAME, ATTR)                                                                     \
  ATTR static void NAME(const tile_t *t, int64_t lo, int64_t hi, int64_t *cnt,                   \
                        unsigned char *restrict fl) {                                            \
    const int len = t->len;                                                                      \
    int64_t lt = 0, el = 0, eh = 0;                                                              \
    if (!t->dbl) {                                                                               \
      const char *pa = t->fa, *pe = t->fe;                                                       \
      for (int j = 0; j < len; ++j) {                                                            \
        float fa, fe;                                                                            \
        memcpy(&fa, pa + 4 * (size_t)j, 4);                                                      \
        memcpy(&fe, pe + 4 * (size_t)j, 4);                                                      \
        const int64_t k = (int64_t)vgct_bits_from_f64(fabs((double)fa - (double)fe));            \
        lt += k < lo; el += k == lo; eh += k == hi;                                              \
        fl[j] = (unsigned char)((k > lo) & (k < hi));                                            \
      }                                                                                          \
    } else {                                                                                     \
      for (int j = 0; j < len; ++j) {                                                            \
        const int64_t k = (int64_t)vgct_bits_from_f64(fabs(t->A[j] - t->E[j]));                  \
        lt += k < lo; el += k == lo; eh += k == hi;                                              \
        fl[j] = (unsigned char)((k > lo) & (k < hi));                                            \
      }                                                                                          \
    }                                                                                            \
    cnt[0] += lt; cnt[1] += el; cnt[2] += eh;                                                    \
  }
PS_FUSED(ps_fused_base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VGCT_NO_CPU_DISPATCH)
PS_FUSED(ps_fused_avx2, __attribute__((target("avx2"))))
PS_FUSED(ps_fused_avx512, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))))
static ps_fused_fn pick_ps_fused(void) {
  const int lv = cpu_level();
  return lv == 2 ? ps_fused_avx512 : lv == 1 ? ps_fused_avx2 : ps_fused_base;
}
#else
static ps_fused_fn pick_ps_fused(void) { return ps_fused_base; }
#endif

/* The tile's finite keys into the windows (before tile_patch rewrites A/E);
 * fin: the fold found every pair finite (the keys need no class test);
 * the keys to store (few: the window's share of the data, minus its ties)
 * are found 8 flags at a time. */
static void tile_presel(const tile_t *t, struct vgct_cpu_presel *S, ps_thread *T, int fin) {
  int64_t keys[TILE];
  unsigned char fl[TILE + 8];
  int m;
  const int fused = fin && !t->isint && S->nw == 1 && S->npv[0] <= 2;
  if (fused) {
    int64_t cnt[3] = {0, 0, 0};
    S->fused(t, (int64_t)S->lo[0], (int64_t)S->hi[0], cnt, fl);
    m = t->len;
    T->lt[0] += cnt[0];
    T->eq[0][0] += cnt[1];
    if (S->npv[0] == 2) T->eq[0][1] += cnt[2];
  } else if (fin && !t->isint) {
    S->keys(t, (uint64_t *)(void *)keys);
    m = t->len;
  } else {
    m = tile_keys(t, (uint64_t *)(void *)keys);
  }
  T->nkeys += m;
  for (int g = 0; g < S->nw; ++g) {
    const int npv = S->npv[g];
    if (!fused)
      S->kern(keys, m, (int64_t)S->lo[g], (int64_t)S->hi[g], npv, S->pvs[g], &T->lt[g], T->eq[g], fl);
    if (npv < 2) continue; /* lo == hi: nothing strictly inside */
    for (int j = m; j < m + 8; ++j) fl[j] = 0;
    uint64_t *st = T->st[g];
    int c = T->nst[g];
    for (int j = 0; j < m; j += 8) {
      uint64_t w;
      memcpy(&w, fl + j, 8);
      while (w) { /* flags are 0/1: bit 8b is flag j + b */
        const int b = __builtin_ctzll(w) >> 3;
        st[c++] = fused ? tile_key(t, j + b) : (uint64_t)keys[j + b];
        if (c == PS_LBUF) { ps_flush(S, g, st, c); c = 0; }
        w &= w - 1;
      }
    }
    T->nst[g] = c;
  }
}

/* after the pass: the threads' counters summed, their staged keys stored */
static void presel_collect(struct vgct_cpu_presel *S, ps_thread *T, int nthreads) {
  S->nkeys = 0;
  for (int g = 0; g < S->nw; ++g) {
    S->lt[g] = 0;
    for (int i = 0; i < PS_MAXPV; ++i) S->eq[g][i] = 0;
  }
  for (int k = 0; k < nthreads; ++k) {
    S->nkeys += T[k].nkeys;
    for (int g = 0; g < S->nw; ++g) {
      S->lt[g] += T[k].lt[g];
      for (int i = 0; i < S->npv[g]; ++i) S->eq[g][i] += T[k].eq[g][i];
      if (T[k].nst[g]) ps_flush(S, g, T[k].st[g], T[k].nst[g]);
    }
  }
}




/* ======================================================================
 * The fast fold of an all-finite tile (see the header comment).
 *
 * Computes the tile's sums exactly as NLANE lanes of vgct_acc_update merged
 * in lane order would (the lanes are the 8 elements of one vector: every
 * lane still folds its own elements in order with the same IEEE operations,
 * no reassociation, no FMA), plus the tile's max |d|, max |e|, max excess,
 * unequal and mismatch counts.  max_rel needs a division per pair; instead
 * the loop flags pairs that could reach the caller's threshold `relc`
 * (|d| >= relc*|e|, e != 0; with nz also |d| > 0) and the caller divides
 * only for tiles with such a candidate.  Returns 0 (and the caller uses the
 * definition path) when the tile holds a NaN or an infinity.
 * ====================================================================== */
typedef struct {
  double scale_a, scale_e, scale_d; /* the tile scales (1 when unscaled) */
  double saa, see, sae, sdd, sd;
  double mad, mex, mref;
  double nuneq, nmm;
  int rel_cand;
} fold_t;

typedef int (*fold_fn)(const double *, const double *, int, double, double, double, int, fold_t *);
/* the float32 x float32 fold (cpu_fold32.inc): element bytes in, fold_u's result out */
typedef int (*fold32_fn)(const char *, const char *, int, double, double, double, int, fold_t *,
                         unsigned char *);

#if defined(__GNUC__) || defined(__clang__)
#define VGCT_HAVE_VEC 1
/* one instantiation per native vector width: GCC scalarises vectors wider
 * than the target's registers, so each target gets its own width */
typedef double vgct_v2d __attribute__((vector_size(16)));
typedef long long vgct_v2i __attribute__((vector_size(16)));
#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#define FOLD_MAX(a, b) _mm_max_pd((__m128d)(a), (__m128d)(b))
#endif
#define FOLD_NAME fold_vec2
#define FOLD_VD vgct_v2d
#define FOLD_VI vgct_v2i
#define FOLD_VW 2
#define FOLD_ATTR
#include "cpu_fold.inc"

#define DEF_FOLDS(SUFFIX, IMPL, ATTR)                                                          \
  ATTR static int fold_u##SUFFIX(const double *A, const double *E, int len, double rtol,       \
                                 double atol, double relc, int nz, fold_t *o) {                \
    return IMPL(A, E, len, rtol, atol, relc, nz, 0, o);                                        \
  }                                                                                            \
  ATTR static int fold_s##SUFFIX(const double *A, const double *E, int len, double rtol,       \
                                 double atol, double relc, int nz, fold_t *o) {                \
    return IMPL(A, E, len, rtol, atol, relc, nz, 1, o);                                        \
  }
DEF_FOLDS(, fold_vec2, )
typedef float vgct_v2f __attribute__((vector_size(8)));
#define F32_NAME fold32_u
#define FOLD_VF vgct_v2f
#define FOLD_VD vgct_v2d
#define FOLD_VI vgct_v2i
#define FOLD_VW 2
#define FOLD_ATTR
#if defined(__x86_64__) || defined(__SSE2__)
#define FOLD_MAX(a, b) _mm_max_pd((__m128d)(a), (__m128d)(b))
#define FOLD_CVT(p) _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(p))))
#endif
#include "cpu_fold32.inc"

/* x86-64: the same source compiled for AVX2 and AVX-512 as well, picked at
 * run time.  No FMA in the targets (contraction would change roundings); the
 * same lanes and operations, so results are bitwise those of the baseline
 * (tested across levels by the engine tests). */
#if defined(__x86_64__) && !defined(VGCT_NO_CPU_DISPATCH)
#define VGCT_X86_DISPATCH 1
#define VGCT_AVX2 __attribute__((target("avx2")))
#define VGCT_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw")))
typedef double vgct_v4d __attribute__((vector_size(32)));
typedef long long vgct_v4i __attribute__((vector_size(32)));
typedef double vgct_v8d __attribute__((vector_size(64)));
typedef long long vgct_v8i __attribute__((vector_size(64)));
#define FOLD_NAME fold_vec4
#define FOLD_VD vgct_v4d
#define FOLD_VI vgct_v4i
#define FOLD_VW 4
#define FOLD_ATTR VGCT_AVX2
#define FOLD_MAX(a, b) _mm256_max_pd((__m256d)(a), (__m256d)(b))
#include "cpu_fold.inc"
#define FOLD_NAME fold_vec8
#define FOLD_VD vgct_v8d
#define FOLD_VI vgct_v8i
#define FOLD_VW 8
#define FOLD_ATTR VGCT_AVX512
#define FOLD_MAX(a, b) _mm512_max_pd((__m512d)(a), (__m512d)(b))
#define FOLD_ONEPASS 1
#include "cpu_fold.inc"
DEF_FOLDS(_avx2, fold_vec4, VGCT_AVX2)
DEF_FOLDS(_avx512, fold_vec8, VGCT_AVX512)
typedef float vgct_v4f __attribute__((vector_size(16)));
typedef float vgct_v8f __attribute__((vector_size(32)));
#define F32_NAME fold32_u_avx2
#define FOLD_VF vgct_v4f
#define FOLD_VD vgct_v4d
#define FOLD_VI vgct_v4i
#define FOLD_VW 4
#define FOLD_ATTR VGCT_AVX2
#define FOLD_MAX(a, b) _mm256_max_pd((__m256d)(a), (__m256d)(b))
#define FOLD_CVT(p) _mm256_cvtps_pd(_mm_loadu_ps((const float *)(const void *)(p)))
#include "cpu_fold32.inc"
#define F32_NAME fold32_u_avx512
#define FOLD_VF vgct_v8f
#define FOLD_VD vgct_v8d
#define FOLD_VI vgct_v8i
#define FOLD_VW 8
#define FOLD_ATTR VGCT_AVX512
#define FOLD_MAX(a, b) _mm512_max_pd((__m512d)(a), (__m512d)(b))
#define FOLD_ONEPASS 1
#define FOLD_CVT(p) _mm512_cvtps_pd(_mm256_loadu_ps((const float *)(const void *)(p)))
#define FOLD_MASK512 1
#include "cpu_fold32.inc"
#endif
#undef DEF_FOLDS

static fold32_fn pick_fold32(void) {
#ifdef VGCT_X86_DISPATCH
  int lv = cpu_level();
  if (lv == 2) return fold32_u_avx512;
  if (lv == 1) return fold32_u_avx2;
#endif
  return fold32_u;
}

static fold_fn pick_fold(int scaled) {
#ifdef VGCT_X86_DISPATCH
  int lv = cpu_level();
  if (lv == 2) return scaled ? fold_s_avx512 : fold_u_avx512;
  if (lv == 1) return scaled ? fold_s_avx2 : fold_u_avx2;
#endif
  return scaled ? fold_s : fold_u;
}
#else  /* no vector extensions: every tile takes the definition path */
static int fold_none(const double *A, const double *E, int len, double rtol, double atol,
                     double relc, int nz, fold_t *o) {
  (void)A; (void)E; (void)len; (void)rtol; (void)atol; (void)relc; (void)nz; (void)o;
  return 0;
}
static fold_fn pick_fold(int scaled) { (void)scaled; return fold_none; }
static fold32_fn pick_fold32(void) { return NULL; } /* tiles of doubles only */
#endif

/* ======================================================================
 * Pairwise merge stack (binary counter): deterministic, O(log n) state.
 * ====================================================================== */
typedef struct {
  vgct_acc st[64];
  int lv[64];
  int top;
} mstack_t;

static void ms_push(mstack_t *m, const vgct_acc *x) {
  vgct_acc cur = *x;
  int lv = 0;
  while (m->top > 0 && m->lv[m->top - 1] == lv) {
    vgct_acc left = m->st[m->top - 1];
    vgct_acc_merge(&left, &cur);
    cur = left;
    --m->top;
    ++lv;
  }
  m->st[m->top] = cur;
  m->lv[m->top] = lv;
  ++m->top;
}

/* merge what is left, right to left; returns 0 when empty */
static int ms_finish(mstack_t *m, vgct_acc *out) {
  if (m->top == 0) return 0;
  vgct_acc cur = m->st[m->top - 1];
  for (int k = m->top - 2; k >= 0; --k) {
    vgct_acc left = m->st[k];
    vgct_acc_merge(&left, &cur);
    cur = left;
  }
  *out = cur;
  return 1;
}

/* ======================================================================
 * Cancellation (vgct_params.interrupt): one flag per entry-point call.
 * Every thread tests it (a relaxed load) before each tile and stops its
 * unit when set; only thread 0 -- the calling thread -- calls the
 * interrupt function, at most every VGCT_POLL_MS, between tiles and while
 * it waits for the other threads (par_run).  A stopped call frees what it
 * allocated and returns VGCT_EINTR; the results are discarded.
 * ====================================================================== */
typedef struct {
  atomic_int stop;
  int (*poll)(void *);
  void *ctx;
  struct timespec last; /* thread 0 only */
  unsigned tick;        /* thread 0 only */
} cancel_t;

static void cc_init(cancel_t *cc, const vgct_params *p) {
  atomic_init(&cc->stop, 0);
  cc->poll = p->interrupt;
  cc->ctx = p->interrupt_ctx;
  cc->tick = 0;
  clock_gettime(CLOCK_MONOTONIC, &cc->last);
}

/* thread 0: call the interrupt function when VGCT_POLL_MS have passed */
static int cc_poll(cancel_t *cc) {
  if (atomic_load_explicit(&cc->stop, memory_order_relaxed)) return 1;
  if (!cc->poll) return 0;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long ms = (long long)(now.tv_sec - cc->last.tv_sec) * 1000 +
                       (now.tv_nsec - cc->last.tv_nsec) / 1000000;
  if (ms < VGCT_POLL_MS) return 0;
  cc->last = now;
  if (cc->poll(cc->ctx)) {
    atomic_store(&cc->stop, 1);
    return 1;
  }
  return 0;
}

/* before each tile: 1 = stop.  Thread 0 looks at the clock every 16 tiles. */
static inline int cc_check(cancel_t *cc, int tid) {
  if (atomic_load_explicit(&cc->stop, memory_order_relaxed)) return 1;
  if (tid != 0 || !cc->poll || (++cc->tick & 15u)) return 0;
  return cc_poll(cc);
}

static inline int cc_stopped(cancel_t *cc) { return atomic_load(&cc->stop) != 0; }

/* ======================================================================
 * Threads: units [0, nunits) handed out dynamically; what a unit computes
 * never depends on which thread runs it.
 * ====================================================================== */
typedef struct par_s {
  atomic_llong next;
  int64_t nunits;
  void (*fn)(void *ctx, int64_t unit, int tid);
  void *ctx;
  cancel_t *cc;
  pthread_mutex_t mu; /* finished / cv: thread 0 waits, polling, for the rest */
  pthread_cond_t cv;
  int finished;
} par_t;

typedef struct { par_t *par; int tid; } par_arg_t;

static void par_units(par_t *par, int tid) {
  for (;;) {
    if (par->cc && atomic_load_explicit(&par->cc->stop, memory_order_relaxed)) break;
    long long u = atomic_fetch_add(&par->next, 1);
    if (u >= par->nunits) break;
    par->fn(par->ctx, (int64_t)u, tid);
  }
}

static void *par_worker(void *arg) {
  par_arg_t *pa = (par_arg_t *)arg;
  par_t *par = pa->par;
  par_units(par, pa->tid);
  pthread_mutex_lock(&par->mu);
  par->finished += 1;
  pthread_cond_signal(&par->cv);
  pthread_mutex_unlock(&par->mu);
  return NULL;
}

/* runs fn over all units with up to nthreads threads (the caller is thread
 * 0); with a cancel state, the caller keeps polling (cc_poll) while the
 * other threads finish their units. */
static void par_run(int nthreads, int64_t nunits, void (*fn)(void *, int64_t, int), void *ctx,
                    cancel_t *cc) {
  par_t par;
  atomic_init(&par.next, 0);
  par.nunits = nunits; par.fn = fn; par.ctx = ctx; par.cc = cc;
  par.finished = 0;
  pthread_t th[MAX_THREADS];
  par_arg_t args[MAX_THREADS];
  int started = 0;
  if (nthreads > 1) {
    pthread_mutex_init(&par.mu, NULL);
    pthread_cond_init(&par.cv, NULL);
  }
  for (int t = 1; t < nthreads; ++t) {
    args[t].par = &par; args[t].tid = t;
    if (pthread_create(&th[t], NULL, par_worker, &args[t]) != 0) break; /* fewer threads */
    ++started;
  }
  par_units(&par, 0);
  if (nthreads > 1) {
    pthread_mutex_lock(&par.mu);
    while (par.finished < started) {
      if (cc && cc->poll) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += (long)VGCT_POLL_MS * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec += 1; dl.tv_nsec -= 1000000000L; }
        if (pthread_cond_timedwait(&par.cv, &par.mu, &dl) != 0 && par.finished < started) {
          pthread_mutex_unlock(&par.mu);
          cc_poll(cc); /* may take the GIL: not under the mutex */
          pthread_mutex_lock(&par.mu);
        }
      } else {
        pthread_cond_wait(&par.cv, &par.mu);
      }
    }
    pthread_mutex_unlock(&par.mu);
  }
  for (int t = 1; t <= started; ++t) pthread_join(th[t], NULL);
  if (nthreads > 1) {
    pthread_cond_destroy(&par.cv);
    pthread_mutex_destroy(&par.mu);
  }
}

static int64_t seg_size(int64_t n) {
  int64_t seg = SEG_MIN_EFF;
  while ((n + seg - 1) / seg > SEG_MAX_COUNT) seg *= 2;
  return seg;
}

static int pick_threads(int req, int64_t n, int64_t nunits) {
  int t = req < 1 ? 1 : req;
  if (t > MAX_THREADS) t = MAX_THREADS;
  if (n < PAR_MIN_EFF) t = 1;
  if ((int64_t)t > nunits) t = (int)(nunits < 1 ? 1 : nunits);
  return t;
}

/* ======================================================================
 * vgct_cpu_reduce
 * ====================================================================== */
typedef struct {
  const plan_t *P;
  double rtol, atol;
  int scaled;
  int64_t seg, nseg;
  vgct_acc *res;            /* [nseg] */
  int has_slices;
  int64_t nslices, nblk;
  vgct_slice_acc *blk;      /* [nblk][nslices] */
  tile_t **tiles;           /* per thread */
  fold_fn fold;
  fold32_fn fold32;         /* float32 x float32: float32 tiles (else NULL) */
  cancel_t *cc;
  atomic_int changed;       /* a maximum's rescan did not find it: torn input */
  struct vgct_cpu_presel *ps; /* vgct_params.presel, or NULL              */
  ps_thread *pst;           /* per thread: its window counters and staging   */
} red_ctx;

/* Maxima of a fast tile into `best` (lowest flat index among ties).  `v` is
 * the tile maximum of quantity `what`; finding its index costs a scan, done
 * only when it could win. */
enum { Q_ABS, Q_EXC };

static inline double q_value(int what, double a, double e, double rtol, double atol) {
  double ad = fabs(a - e), ae = fabs(e);
  if (what == Q_ABS) return ad;
  double tol = atol + rtol * ae;
  return ad > tol ? ad - tol : -1.0;
}

/* First j < len with q_value(what, A[j], E[j]) == v, for v > 0 (-1: none).
 * Blocks of 8 pairs are tested branch-free (vectorised) before one is
 * searched; with v > 0 the mismatch test of q_value is implied by the
 * equality (ad - tol == v > 0), and a patched (0, 0) pair never matches. */
static int first_match(const double *A, const double *E, int len, int what, double v,
                       double rtol, double atol) {
  int j = 0;
  for (; j + 8 <= len; j += 8) {
    int hit = 0;
    if (what == Q_ABS) {
      for (int l = 0; l < 8; ++l) hit |= fabs(A[j + l] - E[j + l]) == v;
    } else {
      for (int l = 0; l < 8; ++l) {
        const double ad = fabs(A[j + l] - E[j + l]), tol = atol + rtol * fabs(E[j + l]);
        hit |= ad - tol == v;
      }
    }
    if (hit) break;
  }
  for (; j < len; ++j)
    if (q_value(what, A[j], E[j], rtol, atol) == v) return j;
  return -1;
}

/* Returns 0, or -1 when the tile no longer holds v: a float32 tile is read
 * in place by the fold and again here, so an input written meanwhile
 * (another thread) can lose the maximum -- reported as VGCT_ECHANGED. */
static int tile_max_into(tile_t *t, const plan_t *P, int what, double v, double rtol,
                         double atol, double *bv, int64_t *bi, double *ba, double *be) {
  if (v < 0.0) return 0; /* no candidate in this tile */
  if (*bi >= 0 && v < *bv) return 0;
  if (*bi >= 0 && v == *bv && P->monotonic) return 0; /* later positions, larger indices */
  tile_dbl(t, P);
  /* flat indices grow along a run (lstep > 0): the first match of each run is
   * that run's lowest; a monotonic tile is one increasing sequence */
  int64_t best_i = -1;
  int best_j = -1;
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    if (v > 0.0) {
      const int j = first_match(t->A + ru->off, t->E + ru->off, ru->len, what, v, rtol, atol);
      if (j >= 0) {
        const int64_t li = ru->l0 + (int64_t)j * t->lstep;
        if (best_i < 0 || li < best_i) { best_i = li; best_j = ru->off + j; }
      }
    } else {
      for (int j = 0; j < ru->len; ++j) {
        const int q = ru->off + j;
        if (t->npatch && t->bad[q]) continue;
        if (q_value(what, t->A[q], t->E[q], rtol, atol) == v) {
          const int64_t li = ru->l0 + (int64_t)j * t->lstep;
          if (best_i < 0 || li < best_i) { best_i = li; best_j = q; }
          break;
        }
      }
    }
    if (P->monotonic && best_j >= 0) break;
  }
  if (best_j < 0) return -1; /* v came from this tile: only a torn input loses it */
  if (vgct_better(v, best_i, *bv, *bi)) {
    *bv = v; *bi = best_i;
    if (ba) { *ba = t->A[best_j]; *be = t->E[best_j]; }
  }
  return 0;
}

/* max_rel over the tile's pairs with e != 0, into best (exact, lowest index) */
static void tile_rel_into(const tile_t *t, vgct_acc *best, double relc, int nz, const unsigned char *cm) {
  const double z = nz ? 0.0 : -1.0;
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    for (int j = 0; j < ru->len; ++j) {
      if (cm) { /* the fold's flags (a superset of the test below) */
        const int q = ru->off + j;
        const unsigned m = (unsigned)cm[q >> 3] >> (q & 7);
        if (!m) { j += 7 - (q & 7); continue; }
        if (!(m & 1u)) continue;
      } else if ((j & 7) == 0 && j + 8 <= ru->len) { /* skip a block without candidates */
        const double *A = t->A + ru->off + j, *E = t->E + ru->off + j;
        int hit = 0;
        for (int l = 0; l < 8; ++l) {
          const double ad = fabs(A[l] - E[l]), ae = fabs(E[l]);
          hit |= (E[l] != 0.0) & (ad >= relc * ae) & (ad > z);
        }
        if (!hit) { j += 7; continue; }
      }
      const double a = t->A[ru->off + j], e = t->E[ru->off + j];
      const double ad = fabs(a - e), ae = fabs(e);
      if (e != 0.0 && ad >= relc * ae && ad > z) { /* the fold's candidate test */
        const double v = fabs(a - e) / fabs(e);
        const int64_t li = ru->l0 + (int64_t)j * t->lstep;
        if (vgct_better(v, li, best->max_rel, best->max_rel_i)) { best->max_rel = v; best->max_rel_i = li; }
      }
    }
  }
}

/* the slice of every pair of the tile when it is a single one, else -1 */
static inline int64_t tile_single_slice(const tile_t *t, const plan_t *P) {
  if (P->dpos == P->nd - 1) return (t->nr == 1 && t->len == 1) ? t->runs[0].s0 : -1;
  for (int r = 1; r < t->nr; ++r)
    if (t->runs[r].s0 != t->runs[0].s0) return -1;
  return t->runs[0].s0;
}

/* Pairs to their slices when the tile is not one slice.  Slice axis innermost:
 * consecutive pairs, consecutive slices, one vgct_slice_update each.  Slice
 * axis outer: a run has one slice; a run of >= 64 pairs is folded into NLANE
 * fresh lanes (pair j to lane j % NLANE; independent dependency chains) merged
 * in order into the slice, a shorter one pair by pair.  Both tile paths call
 * this, with the same lanes (patched pairs are skipped, as vgct_slice_update
 * skips non-finite ones). */
static void slices_per_pair(const tile_t *t, const plan_t *P, vgct_slice_acc *sl, int scaled,
                            int fast) {
  const int inner = P->dpos == P->nd - 1;
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    vgct_slice_acc *base = sl + ru->s0;
    const double *A = t->A + ru->off, *E = t->E + ru->off;
    const unsigned char *bad = t->npatch ? t->bad + ru->off : NULL;
    if (inner && fast && !scaled) {
      /* finite pairs: vgct_slice_update's unscaled branch, class tests dropped */
      for (int j = 0; j < ru->len; ++j) {
        if (bad && bad[j]) continue;
        vgct_slice_acc *q = base + j;
        const double a = A[j], e = E[j], d = a - e, ad = fabs(d);
        q->n_finite += 1;
        if (ad > q->max_abs) q->max_abs = ad;
        q->s_dd += d * d; q->s_ee += e * e; q->s_d += d;
      }
    } else if (inner) {
      for (int j = 0; j < ru->len; ++j) {
        if (bad && bad[j]) continue;
        if (scaled) vgct_slice_update(base + j, A[j], E[j], 1);
        else vgct_slice_update(base + j, A[j], E[j], 0);
      }
    } else if (ru->len >= 64 && fast && !scaled) {
      /* all pairs finite (patched ones are (0, 0)): the lanes below with the
       * class tests dropped -- the same operations on the same values */
      double sdd[NLANE], see[NLANE], sd[NLANE], mx[NLANE];
      for (int l = 0; l < NLANE; ++l) { sdd[l] = see[l] = sd[l] = 0.0; mx[l] = -1.0; }
      int j = 0;
      for (; j + NLANE <= ru->len; j += NLANE)
        for (int l = 0; l < NLANE; ++l) {
          const double a = A[j + l], e = E[j + l], d = a - e, ad = fabs(d);
          mx[l] = ad > mx[l] ? ad : mx[l];
          sdd[l] += d * d; see[l] += e * e; sd[l] += d;
        }
      for (int l = 0; j < ru->len; ++j, ++l) {
        const double a = A[j], e = E[j], d = a - e, ad = fabs(d);
        mx[l] = ad > mx[l] ? ad : mx[l];
        sdd[l] += d * d; see[l] += e * e; sd[l] += d;
      }
      int nb = 0;
      if (bad)
        for (int q = 0; q < ru->len; ++q) nb += bad[q];
      if (nb == ru->len) continue;
      vgct_slice_acc part; /* lanes merged in lane order (equal scales: plain adds) */
      vgct_slice_init(&part, 0);
      part.s_dd = sdd[0]; part.s_ee = see[0]; part.s_d = sd[0]; part.max_abs = mx[0];
      for (int l = 1; l < NLANE; ++l) {
        part.s_dd = part.s_dd + sdd[l]; part.s_ee = part.s_ee + see[l]; part.s_d = part.s_d + sd[l];
        part.max_abs = mx[l] > part.max_abs ? mx[l] : part.max_abs;
      }
      part.n_finite = ru->len - nb;
      vgct_slice_merge(base, &part);
    } else if (ru->len >= 64) {
      vgct_slice_acc lane[NLANE];
      for (int l = 0; l < NLANE; ++l) vgct_slice_init(&lane[l], scaled);
      for (int j = 0; j < ru->len; ++j) {
        if (bad && bad[j]) continue;
        if (scaled) vgct_slice_update(&lane[j % NLANE], A[j], E[j], 1);
        else vgct_slice_update(&lane[j % NLANE], A[j], E[j], 0);
      }
      for (int l = 1; l < NLANE; ++l) vgct_slice_merge(&lane[0], &lane[l]);
      vgct_slice_merge(base, &lane[0]);
    } else {
      for (int j = 0; j < ru->len; ++j) {
        if (bad && bad[j]) continue;
        if (scaled) vgct_slice_update(base, A[j], E[j], 1);
        else vgct_slice_update(base, A[j], E[j], 0);
      }
    }
  }
}

/* Tiles with NaN/Inf: each non-finite pair is folded by vgct_acc_update into
 * `nf` (it only counts: classes, unequal, first class mismatch) and replaced
 * by (0, 0) in the buffers, marked in t->bad.  For the lane sums a (0, 0)
 * pair is an exact no-op, as the skipped pair is in the definition (sums
 * start at +0 and can never become -0, so s + 0 == s bit for bit); maxima
 * scans and per-pair slice updates skip marked pairs; the caller takes
 * n_finite = len - npatch.  Returns the number of pairs patched. */
static int tile_patch(tile_t *t, double rtol, double atol, int scaled, vgct_acc *nf) {
  vgct_acc_init(nf, scaled);
  int np = 0;
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    for (int j = 0; j < ru->len; ++j) {
      const int q = ru->off + j;
      const double a = t->A[q], e = t->E[q];
      const int ok = vgct_class(a) == VGCT_FINITE && vgct_class(e) == VGCT_FINITE;
      t->bad[q] = (unsigned char)!ok;
      if (!ok) {
        const int64_t li = ru->l0 + (int64_t)j * t->lstep;
        if (scaled) vgct_acc_update(nf, a, e, li, rtol, atol, 1);
        else vgct_acc_update(nf, a, e, li, rtol, atol, 0);
        t->A[q] = 0.0; t->E[q] = 0.0;
        ++np;
      }
    }
  }
  t->npatch = np;
  return np;
}

/* The definition: fold a tile with vgct_acc_update into NLANE lanes. */
static void tile_slow(const tile_t *t, const plan_t *P, double rtol, double atol, int scaled,
                      vgct_acc *tacc, vgct_slice_acc *sl) {
  double Sa = 1.0, Se = 1.0, Sd = 1.0;
  if (scaled) {
    double Ma = 0.0, Me = 0.0, Md = 0.0;
    for (int j = 0; j < t->len; ++j) {
      double a = t->A[j], e = t->E[j];
      if (vgct_class(a) == VGCT_FINITE && vgct_class(e) == VGCT_FINITE) {
        double x = fabs(a), y = fabs(e), z = fabs(a - e); /* z: +Inf when a - e overflows */
        if (x > Ma) Ma = x;
        if (y > Me) Me = y;
        if (z > Md) Md = z;
      }
    }
    Sa = tile_scale(Ma); Se = tile_scale(Me); Sd = tile_scale(Md);
  }
  vgct_acc lane[NLANE];
  for (int l = 0; l < NLANE; ++l) {
    vgct_acc_init(&lane[l], scaled);
    if (scaled) { lane[l].scale_a = Sa; lane[l].scale_e = Se; lane[l].scale_d = Sd; }
  }
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    for (int j = 0; j < ru->len; ++j) {
      int q = ru->off + j;
      int64_t li = ru->l0 + (int64_t)j * t->lstep;
      if (scaled) vgct_acc_update(&lane[q % NLANE], t->A[q], t->E[q], li, rtol, atol, 1);
      else vgct_acc_update(&lane[q % NLANE], t->A[q], t->E[q], li, rtol, atol, 0);
    }
  }
  for (int l = 1; l < NLANE; ++l) vgct_acc_merge(&lane[0], &lane[l]);
  *tacc = lane[0];
  if (sl) {
    int64_t c = tile_single_slice(t, P);
    if (c >= 0) {
      vgct_slice_acc sp[NLANE];
      for (int l = 0; l < NLANE; ++l) {
        vgct_slice_init(&sp[l], scaled);
        if (scaled) { sp[l].scale_e = Se; sp[l].scale_d = Sd; }
      }
      for (int q = 0; q < t->len; ++q) {
        if (scaled) vgct_slice_update(&sp[q % NLANE], t->A[q], t->E[q], 1);
        else vgct_slice_update(&sp[q % NLANE], t->A[q], t->E[q], 0);
      }
      for (int l = 1; l < NLANE; ++l) vgct_slice_merge(&sp[0], &sp[l]);
      vgct_slice_merge(&sl[c], &sp[0]);
    } else {
      slices_per_pair(t, P, sl, scaled, 0);
    }
  }
}

/* Integer pairs (P->intpair): the definition (vgct_int_pair,
 * vgct_acc_update_int) in NLANE lanes merged in order, as tile_slow; slices
 * pair by pair in iteration order. */
static void tile_int(const tile_t *t, const plan_t *P, double rtol, double atol, vgct_acc *tacc,
                     vgct_slice_acc *sl) {
  const int ua = P->dta == VGCT_UINT64, ue = P->dte == VGCT_UINT64;
  const int inner = P->dpos == P->nd - 1;
  vgct_acc lane[NLANE];
  for (int l = 0; l < NLANE; ++l) vgct_acc_init(&lane[l], 0);
  for (int r = 0; r < t->nr; ++r) {
    const run_t *ru = &t->runs[r];
    for (int j = 0; j < ru->len; ++j) {
      const int q = ru->off + j;
      vgct_int_cmp c;
      vgct_int_pair(t->IA[q], ua, t->IE[q], ue, rtol, atol, &c);
      vgct_acc_update_int(&lane[q % NLANE], &c, ru->l0 + (int64_t)j * t->lstep);
      if (sl) vgct_slice_update_int(sl + ru->s0 + (inner ? j : 0), &c);
    }
  }
  for (int l = 1; l < NLANE; ++l) vgct_acc_merge(&lane[0], &lane[l]);
  *tacc = lane[0];
}

static void reduce_segment(red_ctx *C, int64_t s, tile_t *t, vgct_slice_acc *sl, int tid) {
  const plan_t *P = C->P;
  const int scaled = C->scaled;
  const int64_t start = s * C->seg;
  const int64_t end = start + C->seg < P->n ? start + C->seg : P->n;
  iter_t it;
  iter_seek(P, &it, start);
  mstack_t ms;
  ms.top = 0;
  vgct_acc best; /* maxima of fast tiles */
  vgct_acc_init(&best, scaled);
  while (it.pos < end) {
    if (cc_check(C->cc, tid)) return; /* the call is discarded */
    if (P->intpair) {
      tile_fill_int(P, &it, end, t);
      if (C->ps) tile_presel(t, C->ps, &C->pst[tid], 0);
      vgct_acc tacc;
      tile_int(t, P, C->rtol, C->atol, &tacc, sl);
      ms_push(&ms, &tacc);
      continue;
    }
    if (C->fold32) tile_fill32(P, &it, end, t);
    else tile_fill(P, &it, end, t);
    fold_t f;
    memset(&f, 0, sizeof f);
    /* max_rel candidates: pairs whose ratio could reach the best so far
     * (margin 2^-40 >> the rounding of relc*|e|); in a monotonic segment a
     * ratio of 0 never beats an existing best (later index) */
    double relc = -1.0;
    int nz = 0;
    if (best.max_rel_i >= 0) {
      /* (a best of +inf: ties need |d|/|e| >= DBL_MAX, so the threshold is capped there) */
      relc = best.max_rel >= 0x1p-1000 ? fmin(best.max_rel, DBL_MAX) * (1.0 - 0x1p-40) : 0.0;
      nz = P->monotonic;
    }
    int fast = FORCE_SLOW ? 0
               : C->fold32 ? C->fold32(t->fa, t->fe, t->len, C->rtol, C->atol, relc, nz, &f, t->cm)
                           : C->fold(t->A, t->E, t->len, C->rtol, C->atol, relc, nz, &f);
    /* the quantile windows: a fast tile is all finite; else before tile_patch */
    if (C->ps) tile_presel(t, C->ps, &C->pst[tid], fast != 0);
    const unsigned char *cm = fast == 2 ? t->cm : NULL; /* candidate bits of the pairs */
    vgct_acc tacc;
    vgct_acc nf;
    if (!fast) tile_dbl(t, P); /* float32 tiles: every other path reads A/E */
    if (!fast && !FORCE_SLOW) {
      tile_patch(t, C->rtol, C->atol, scaled, &nf);
      if (t->npatch == t->len) { /* nothing finite: counts only */
        ms_push(&ms, &nf);
        continue;
      }
      /* all finite now: the fold cannot fail (see fold_fast_vec) */
      fast = C->fold(t->A, t->E, t->len, C->rtol, C->atol, relc, nz, &f);
    }
    if (!fast) {
      tile_slow(t, P, C->rtol, C->atol, scaled, &tacc, sl);
      ms_push(&ms, &tacc);
      continue;
    }
    const int nfin = t->len - t->npatch;
    vgct_acc_init(&tacc, scaled);
    tacc.scale_a = f.scale_a; tacc.scale_e = f.scale_e; tacc.scale_d = f.scale_d;
    tacc.s_aa = f.saa; tacc.s_ee = f.see; tacc.s_ae = f.sae; tacc.s_dd = f.sdd; tacc.s_d = f.sd;
    tacc.n = nfin; tacc.n_finite = nfin;
    tacc.n_unequal = (int64_t)f.nuneq; tacc.n_mismatch = (int64_t)f.nmm;
    if (t->npatch) vgct_acc_merge(&tacc, &nf); /* zero sums at scales <= the tile's: sums unchanged */
    ms_push(&ms, &tacc);
    if (f.mref > best.max_abs_ref) best.max_abs_ref = f.mref;
    if (tile_max_into(t, P, Q_ABS, f.mad, C->rtol, C->atol, &best.max_abs, &best.max_abs_i,
                      &best.max_abs_a, &best.max_abs_e) < 0 ||
        tile_max_into(t, P, Q_EXC, f.mex, C->rtol, C->atol, &best.worst_excess, &best.worst_i,
                      NULL, NULL) < 0)
      atomic_store(&C->changed, 1);
    if (f.rel_cand) {
      tile_dbl(t, P);
      tile_rel_into(t, &best, relc, nz, cm);
    }
    if (sl) {
      int64_t c = tile_single_slice(t, P);
      if (c >= 0) {
        vgct_slice_acc sp; /* == NLANE lanes of vgct_slice_update, merged in order */
        sp.scale_e = f.scale_e; sp.scale_d = f.scale_d; sp.s_dd = f.sdd; sp.s_ee = f.see; sp.s_d = f.sd;
        sp.max_abs = f.mad; sp.n_finite = nfin;
        vgct_slice_merge(&sl[c], &sp);
      } else {
        tile_dbl(t, P);
        slices_per_pair(t, P, sl, scaled, 1);
      }
    }
  }
  vgct_acc r;
  if (!ms_finish(&ms, &r)) vgct_acc_init(&r, scaled);
  vgct_acc_merge(&r, &best);
  C->res[s] = r;
}

static void reduce_unit(void *ctx, int64_t u, int tid) {
  red_ctx *C = (red_ctx *)ctx;
  tile_t *t = C->tiles[tid];
  if (!C->has_slices) { reduce_segment(C, u, t, NULL, tid); return; }
  vgct_slice_acc *sl = C->blk + u * C->nslices;
  for (int64_t j = 0; j < C->nslices; ++j) vgct_slice_init(&sl[j], C->scaled);
  int64_t s0 = u * C->nseg / C->nblk, s1 = (u + 1) * C->nseg / C->nblk;
  for (int64_t s = s0; s < s1 && !cc_check(C->cc, tid); ++s) reduce_segment(C, s, t, sl, tid);
}

static int alloc_tiles(tile_t **tiles, int nthreads) {
  for (int i = 0; i < nthreads; ++i) tiles[i] = NULL;
  for (int i = 0; i < nthreads; ++i) {
    tiles[i] = (tile_t *)eng_malloc(sizeof(tile_t));
    if (!tiles[i]) return 0;
  }
  return 1;
}
static void free_tiles(tile_t **tiles, int nthreads) {
  for (int i = 0; i < nthreads; ++i) free(tiles[i]);
}

static void acc_merge_all(const vgct_acc *v, int64_t cnt, vgct_acc *out) {
  mstack_t ms;
  ms.top = 0;
  for (int64_t i = 0; i < cnt; ++i) ms_push(&ms, &v[i]);
  ms_finish(&ms, out);
}

int vgct_cpu_reduce(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                    vgct_acc *out, vgct_slice_acc *slices, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  const int scaled = vgct_needs_scaling(a, e);
  vgct_acc_init(out, scaled);
  const int has_slices = p->dim >= 0;
  if (has_slices && (p->dim >= a->ndim || !slices)) {
    set_err(err, errlen, "vgct_cpu_reduce: %s %lld out of range (or no slice array)", "dim",
            (long long)p->dim);
    return VGCT_EVALUE;
  }
  const int64_t nslices = has_slices ? a->shape[p->dim] : 0;
  for (int64_t j = 0; j < nslices; ++j) vgct_slice_init(&slices[j], scaled);
  plan_t P;
  plan_build(a, e, has_slices ? p->dim : -1, &P);
  if (p->presel) p->presel->filled = 0;
  if (P.n == 0) return VGCT_OK;

  red_ctx C;
  memset(&C, 0, sizeof C);
  cancel_t cc;
  cc_init(&cc, p);
  C.cc = &cc;
  atomic_init(&C.changed, 0);
  C.P = &P; C.rtol = p->rtol; C.atol = p->atol; C.scaled = scaled;
  C.fold = pick_fold(scaled);
  if (a->dtype == VGCT_FLOAT32 && e->dtype == VGCT_FLOAT32 && !P.intpair) {
    /* float32 tiles, unless per-slice statistics would often need every pair as
     * a double anyway (slice_per_pair): slice axis innermost, or fewer than
     * 8 tiles of consecutive positions per slice */
    int64_t span = 1;
    for (int k = P.dpos + 1; k < P.nd; ++k) span *= P.shape[k];
    if (!has_slices || P.dpos < 0 || (P.dpos < P.nd - 1 && span >= 8 * TILE)) C.fold32 = pick_fold32();
  }
  C.seg = seg_size(P.n);
  C.nseg = (P.n + C.seg - 1) / C.seg;
  C.has_slices = has_slices;
  C.nslices = nslices;
  int64_t nunits = C.nseg;
  if (has_slices) {
    int64_t nb = MAX_SLICE_BLOCKS;
    if (nb > C.nseg) nb = C.nseg;
    while (nb > 1 && nb * nslices > SLICE_BLOCK_BUDGET) --nb;
    C.nblk = nb;
    nunits = nb;
  }
  int nthreads = pick_threads(p->nthreads, P.n, nunits);
  tile_t *tiles[MAX_THREADS];
  for (int i = 0; i < nthreads; ++i) tiles[i] = NULL; /* freed on every path */
  C.tiles = tiles;
  C.res = (vgct_acc *)eng_malloc((size_t)C.nseg * sizeof(vgct_acc));
  if (has_slices) C.blk = (vgct_slice_acc *)eng_malloc((size_t)(C.nblk * nslices) * sizeof(vgct_slice_acc));
  int ok = C.res && (!has_slices || C.blk) && alloc_tiles(tiles, nthreads);
  if (ok && p->presel) {
    C.pst = (ps_thread *)eng_calloc((size_t)nthreads, sizeof(ps_thread));
    ok = C.pst != NULL;
    C.ps = p->presel;
    C.ps->filled = 0;
    for (int g = 0; g < C.ps->nw; ++g) atomic_store(&C.ps->pos[g], 0);
  }
  if (!ok) {
    free_tiles(tiles, nthreads); free(C.res); free(C.blk); free(C.pst);
    set_err(err, errlen, "vgct_cpu_reduce: out of memory (%s; %lld segments)",
            "segment results, slice blocks, tile buffers or window counters", (long long)C.nseg);
    return VGCT_ENOMEM;
  }
  par_run(nthreads, nunits, reduce_unit, &C, &cc);
  if (C.ps) { /* the threads' window counters and last staged keys */
    presel_collect(C.ps, C.pst, nthreads);
    C.ps->filled = !cc_stopped(&cc);
    free(C.pst);
  }
  if (cc_stopped(&cc) || atomic_load(&C.changed)) {
    const int stopped = cc_stopped(&cc);
    free_tiles(tiles, nthreads); free(C.res); free(C.blk);
    vgct_acc_init(out, scaled);
    if (stopped) set_err(err, errlen, "vgct_cpu_reduce: %s (%lld pairs)", "interrupted", (long long)P.n);
    else set_err(err, errlen, "input changed during compare: %s (%lld pairs)",
                 "a maximum found by one read of a tile was gone on the next", (long long)P.n);
    return stopped ? VGCT_EINTR : VGCT_ECHANGED;
  }
  acc_merge_all(C.res, C.nseg, out);
  if (has_slices) {
    for (int64_t j = 0; j < nslices; ++j) slices[j] = C.blk[j];
    for (int64_t b = 1; b < C.nblk; ++b)
      for (int64_t j = 0; j < nslices; ++j) vgct_slice_merge(&slices[j], &C.blk[b * nslices + j]);
  }
  free_tiles(tiles, nthreads);
  free(C.res);
  free(C.blk);
  return VGCT_OK;
}

/* ======================================================================
 * vgct_cpu_select: radix selection over vgct_absdiff_key keys
 * ====================================================================== */
#define NLEVEL 4
static const int lv_shift[NLEVEL] = {47, 31, 15, 0};
static const int lv_width[NLEVEL] = {16, 16, 16, 15};
#define HBINS 65536
#define MAX_PEND 4   /* groups histogrammed in one pass */
#define MAX_GATH 8   /* groups gathered in one pass     */
#define LBUF 256     /* per-thread gather staging       */
#define MAX_RNG 4    /* sampled ranges in the first pass */

typedef struct {
  uint64_t prefix; /* key >> shift == prefix for the group's keys */
  int shift;       /* bits below the known prefix                  */
  int level;       /* next digit level to histogram                */
  int64_t count;   /* keys in the group                            */
  int nr;          /* ranks (indices into the rank arrays)          */
  int first;       /* index of the first of them in the order list */
} group_t;

typedef struct {
  const plan_t *P;
  int64_t seg, nseg;
  int npend, ngath;
  uint64_t pend_prefix[MAX_PEND];
  int pend_pshift, pend_dshift;  /* prefix = key >> pshift; digit = (key >> dshift) & dmask */
  uint64_t dmask;
  uint64_t gath_prefix[MAX_GATH];
  int gath_shift[MAX_GATH];
  uint64_t *gath_buf[MAX_GATH];
  int64_t gath_cap[MAX_GATH];  /* the group's count from the previous pass */
  atomic_llong gath_pos[MAX_GATH];
  cancel_t *cc;
  uint64_t **hist;   /* per thread: [npend][HBINS] */
  int64_t *total;    /* per thread: finite pairs   */
  tile_t **tiles;
  uint64_t (*stage)[MAX_GATH][LBUF]; /* per thread */
  /* first pass only: key ranges [rlo, rhi] predicted by a sample to hold
   * ranks, gathered (bounded) while the histogram is built, with the exact
   * count of keys below each; a rank found inside is finished in memory */
  int nrng;
  uint64_t rlo[MAX_RNG], rhi[MAX_RNG];
  uint64_t *rbuf[MAX_RNG];
  int64_t rcap[MAX_RNG];
  atomic_llong rpos[MAX_RNG];
  int64_t (*rlt)[MAX_RNG];           /* per thread: keys < rlo */
} sel_ctx;

static void range_flush(sel_ctx *C, int tid, int g, int cnt) {
  long long at = atomic_fetch_add(&C->rpos[g], cnt);
  if (at + cnt <= C->rcap[g]) /* else the range overflowed: rpos > rcap marks it */
    memcpy(C->rbuf[g] + at, C->stage[tid][g], (size_t)cnt * sizeof(uint64_t));
}

/* more keys than the group counted in the previous pass (an input changed
 * meanwhile) are not stored: gath_pos > gath_cap then reports it */
static void stage_flush(sel_ctx *C, int tid, int g, int cnt) {
  long long at = atomic_fetch_add(&C->gath_pos[g], cnt);
  if (at + cnt <= C->gath_cap[g])
    memcpy(C->gath_buf[g] + at, C->stage[tid][g], (size_t)cnt * sizeof(uint64_t));
}

static void select_unit(void *ctx, int64_t s, int tid) {
  sel_ctx *C = (sel_ctx *)ctx;
  const plan_t *P = C->P;
  tile_t *t = C->tiles[tid];
  uint64_t *h = C->hist[tid];
  int nst[MAX_GATH];
  for (int g = 0; g < MAX_GATH; ++g) nst[g] = 0;
  const int64_t start = s * C->seg;
  const int64_t end = start + C->seg < P->n ? start + C->seg : P->n;
  int64_t fin = 0;
  iter_t it;
  iter_seek(P, &it, start);
  while (it.pos < end) {
    if (cc_check(C->cc, tid)) break; /* the pass is discarded */
    tile_fill_keys(P, &it, end, t);
    uint64_t keys[TILE];
    const int m = tile_keys(t, keys);
    fin += m;
    const int dsh = C->pend_dshift, psh = C->pend_pshift, npend = C->npend;
    const uint64_t dmask = C->dmask;
    if (npend == 1 && psh >= 63) { /* the first pass: every key; two histograms
                                      * (slots 0 and 1) break store-to-load chains */
      uint64_t *h2 = h + HBINS;
      int j = 0;
      for (; j + 1 < m; j += 2) {
        h[(keys[j] >> dsh) & dmask]++;
        h2[(keys[j + 1] >> dsh) & dmask]++;
      }
      if (j < m) h[(keys[j] >> dsh) & dmask]++;
    } else if (npend == 1) {
      const uint64_t p0 = C->pend_prefix[0];
      for (int j = 0; j < m; ++j)
        if ((keys[j] >> psh) == p0) h[(keys[j] >> dsh) & dmask]++;
    } else if (npend > 0) {
      for (int j = 0; j < m; ++j) {
        const uint64_t pre = keys[j] >> psh;
        for (int g = 0; g < npend; ++g)
          if (pre == C->pend_prefix[g]) { h[(size_t)g * HBINS + ((keys[j] >> dsh) & dmask)]++; break; }
      }
    }
    for (int g = 0; g < C->nrng; ++g) {
      const uint64_t lo = C->rlo[g], hi = C->rhi[g];
      uint64_t *stg = C->stage[tid][g];
      int c = nst[g];
      int64_t lt = 0;
      for (int j = 0; j < m; ++j) {
        const uint64_t k = keys[j];
        lt += k < lo;
        stg[c] = k;
        c += (k >= lo) & (k <= hi);
        if (c == LBUF) { range_flush(C, tid, g, LBUF); c = 0; }
      }
      nst[g] = c;
      C->rlt[tid][g] += lt;
    }
    for (int g = 0; g < C->ngath; ++g) {
      const int sh = C->gath_shift[g];
      const uint64_t pre = C->gath_prefix[g];
      uint64_t *stg = C->stage[tid][g];
      int c = nst[g];
      for (int j = 0; j < m; ++j) { /* branch-free compaction */
        stg[c] = keys[j];
        c += (keys[j] >> sh) == pre;
        if (c == LBUF) { stage_flush(C, tid, g, LBUF); c = 0; }
      }
      nst[g] = c;
    }
  }
  for (int g = 0; g < C->ngath; ++g)
    if (nst[g]) stage_flush(C, tid, g, nst[g]);
  for (int g = 0; g < C->nrng; ++g)
    if (nst[g]) range_flush(C, tid, g, nst[g]);
  C->total[tid] += fin;
}

/* ---- in-memory multi-select on uint64 (introselect, heapsort fallback) -- */
static void u64_sift(uint64_t *x, int64_t i, int64_t n) {
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && x[c + 1] > x[c]) ++c;
    if (x[i] >= x[c]) return;
    uint64_t t = x[i]; x[i] = x[c]; x[c] = t;
    i = c;
  }
}
static void u64_heapsort(uint64_t *x, int64_t n) {
  for (int64_t i = n / 2 - 1; i >= 0; --i) u64_sift(x, i, n);
  for (int64_t m = n - 1; m > 0; --m) {
    uint64_t t = x[0]; x[0] = x[m]; x[m] = t;
    u64_sift(x, 0, m);
  }
}
static void u64_isort(uint64_t *x, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    uint64_t v = x[i];
    int64_t j = i;
    while (j > 0 && x[j - 1] > v) { x[j] = x[j - 1]; --j; }
    x[j] = v;
  }
}

/* after the call, x[r] holds the value of rank r (ascending) for each r in
 * rk[0..nr) (sorted ascending, within [lo, hi)) */
static void u64_mselect(uint64_t *x, int64_t lo, int64_t hi, const int64_t *rk, int nr, int depth) {
  while (nr > 0) {
    int64_t n = hi - lo;
    if (n <= 32) { u64_isort(x + lo, n); return; }
    if (depth-- <= 0) { u64_heapsort(x + lo, n); return; }
    uint64_t a = x[lo], b = x[lo + n / 2], c = x[hi - 1];
    uint64_t pv = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
    /* three-way partition: [lo, lt) < pv, [lt, gt) == pv, [gt, hi) > pv */
    int64_t lt = lo, i = lo, gt = hi;
    while (i < gt) {
      uint64_t v = x[i];
      if (v < pv) { x[i] = x[lt]; x[lt] = v; ++lt; ++i; }
      else if (v > pv) { --gt; x[i] = x[gt]; x[gt] = v; }
      else ++i;
    }
    int k0 = 0;
    while (k0 < nr && rk[k0] < lt) ++k0;
    int k1 = k0;
    while (k1 < nr && rk[k1] < gt) ++k1;
    /* ranks in [lt, gt) are settled; recurse into the smaller side, loop on the other */
    if (k0 > 0 && nr - k1 > 0) {
      if (lt - lo < hi - gt) { u64_mselect(x, lo, lt, rk, k0, depth); lo = gt; rk += k1; nr -= k1; }
      else { u64_mselect(x, gt, hi, rk + k1, nr - k1, depth); hi = lt; nr = k0; }
    } else if (k0 > 0) { hi = lt; nr = k0; }
    else { lo = gt; rk += k1; nr -= k1; }
  }
}

typedef struct { int64_t rank; int orig; } rank_ref;
static int cmp_rank_ref(const void *x, const void *y) {
  const rank_ref *a = (const rank_ref *)x, *b = (const rank_ref *)y;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  return a->orig - b->orig;
}

static int cmp_u64(const void *x, const void *y) {
  const uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

#define SAMPLE_TILES 32
#define SAMPLE_MIN_N ((int64_t)1 << 18)

/* The first pass's ranges: read every (nblk/32)-th tile (about 32 tiles,
 * fixed by n), sort their keys, and for each distinct rank take the key
 * range that a generous binomial margin around its estimated position holds.
 * Only a prediction: the first pass counts exactly, and a rank that is not
 * inside a complete range takes the radix passes.  Deterministic. */
static void setup_ranges(sel_ctx *C, const plan_t *P, const rank_ref *order, int nranks,
                         int64_t cap, uint64_t *gbuf, tile_t *t, uint64_t *sample) {
  C->nrng = 0;
  const int64_t nblk = (P->n + TILE - 1) / TILE;
  int64_t step = nblk / SAMPLE_TILES;
  if (step < 1) step = 1;
  int64_t ns = 0, seen = 0;
  for (int64_t b = 0; b < nblk && ns + TILE <= (int64_t)(SAMPLE_TILES + 1) * TILE; b += step) {
    iter_t it;
    const int64_t pos = b * TILE, end = pos + TILE < P->n ? pos + TILE : P->n;
    iter_seek(P, &it, pos);
    while (it.pos < end) { /* a tile stops at run boundaries: refill to `end` */
      if (ns + TILE > (int64_t)(SAMPLE_TILES + 1) * TILE) break;
      tile_fill_keys(P, &it, end, t);
      seen += t->len;
      ns += tile_keys(t, sample + ns);
    }
  }
  if (ns < 256) return;
  qsort(sample, (size_t)ns, sizeof(uint64_t), cmp_u64);
  const double nest = (double)P->n * (double)ns / (double)seen; /* finite pairs, estimated */
  uint64_t lo[MAX_RNG], hi[MAX_RNG];
  double expect[MAX_RNG];
  int nr = 0;
  for (int q = 0; q < nranks; ++q) {
    if (q > 0 && order[q].rank == order[q - 1].rank) continue;
    double ph = ((double)order[q].rank + 0.5) / nest;
    ph = ph < 0.0 ? 0.0 : (ph > 1.0 ? 1.0 : ph);
    const double at = ph * (double)ns;
    const double m = 6.0 * sqrt((double)ns * ph * (1.0 - ph)) + 16.0 + (double)ns / 64.0;
    const int64_t ilo = (int64_t)floor(at - m), ihi = (int64_t)ceil(at + m);
    const uint64_t klo = ilo <= 0 ? 0 : sample[ilo];
    const uint64_t khi = ihi >= ns - 1 ? ~(uint64_t)0 : sample[ihi];
    const double ex = (double)((ihi < ns ? ihi : ns) - (ilo > 0 ? ilo : 0)) / (double)ns * nest;
    if (nr > 0 && klo <= hi[nr - 1]) { /* ranks ascend: merge with the previous range */
      if (khi > hi[nr - 1]) hi[nr - 1] = khi;
      expect[nr - 1] += ex;
      continue;
    }
    if (nr == MAX_RNG) break;
    lo[nr] = klo; hi[nr] = khi; expect[nr] = ex;
    ++nr;
  }
  int64_t used = 0;
  for (int g = 0; g < nr; ++g) {
    const double want = 2.0 * expect[g] + 4096.0;
    if (want > (double)(cap - used)) break;
    C->rlo[g] = lo[g]; C->rhi[g] = hi[g];
    C->rbuf[g] = gbuf + used;
    C->rcap[g] = (int64_t)want;
    atomic_init(&C->rpos[g], 0);
    used += C->rcap[g];
    C->nrng = g + 1;
  }
}

/* ---- vgct_cpu_presel_new / _free (contract: vgct_engine.h) ------------- */
#define PS_SAMPLE_MIN ((int64_t)1 << 14)
#define PS_SAMPLE_MAX ((int64_t)1 << 18)
#define PS_INF_KEY 0x7ff0000000000000ULL /* +Inf: the largest key */

void vgct_cpu_presel_free(struct vgct_cpu_presel *S) {
  if (!S) return;
  free(S->mem);
  free(S);
}

struct vgct_cpu_presel *vgct_cpu_presel_new(const vgct_view *a, const vgct_view *e,
                                            const double *qs, int nq) {
  plan_t P;
  plan_build(a, e, -1, &P);
  if (P.n < PRESEL_MIN_EFF || nq <= 0) return NULL;
  int64_t want = P.n / 256;
  want = want < PS_SAMPLE_MIN_EFF ? PS_SAMPLE_MIN_EFF : (want > PS_SAMPLE_MAX ? PS_SAMPLE_MAX : want);
  const int64_t ntiles = want / TILE, nblk = (P.n + TILE - 1) / TILE;
  const int64_t step = nblk / ntiles > 0 ? nblk / ntiles : 1;
  uint64_t *x = (uint64_t *)eng_malloc((size_t)(ntiles + 1) * TILE * sizeof(uint64_t));
  tile_t *t = (tile_t *)eng_malloc(sizeof(tile_t));
  struct vgct_cpu_presel *S = (struct vgct_cpu_presel *)eng_calloc(1, sizeof *S);
  if (!x || !t || !S) goto fail;
  /* evenly spaced tiles (fixed by n: deterministic) */
  int64_t ns = 0, seen = 0;
  for (int64_t b = 0; b < nblk && ns + TILE <= (ntiles + 1) * TILE; b += step) {
    iter_t it;
    const int64_t pos = b * TILE, end = pos + TILE < P.n ? pos + TILE : P.n;
    iter_seek(&P, &it, pos);
    while (it.pos < end && ns + TILE <= (ntiles + 1) * TILE) {
      tile_fill_keys(&P, &it, end, t);
      seen += t->len;
      ns += tile_keys(t, x + ns);
    }
  }
  if (ns < 1024) goto fail;
  const double nest = (double)P.n * (double)ns / (double)seen; /* finite pairs, estimated */
  /* the quantiles ascending; one window per group of overlapping ones */
  double q[2 * PS_MAXW];
  int nqs = 0;
  for (int i = 0; i < nq && nqs < 2 * PS_MAXW; ++i) q[nqs++] = qs[i];
  for (int i = 1; i < nqs; ++i) /* insertion sort */
    for (int j = i; j > 0 && q[j - 1] > q[j]; --j) { double z = q[j]; q[j] = q[j - 1]; q[j - 1] = z; }
  int64_t wlo[PS_MAXW], whi[PS_MAXW];
  int nw = 0;
  for (int i = 0; i < nqs; ++i) {
    const double ph = q[i];
    const double at = ph * (double)(ns - 1);
    /* 6 sigma of the sample's rank + a share for a sample that is not i.i.d. */
    const double mg = 6.0 * sqrt((double)ns * ph * (1.0 - ph)) + 16.0 + (double)ns / 2048.0;
    int64_t ilo = (int64_t)floor(at - mg), ihi = (int64_t)ceil(at + 1.0 + mg);
    if (ilo < 0) ilo = 0;
    if (ihi > ns - 1) ihi = ns - 1;
    if (nw > 0 && ilo <= whi[nw - 1]) { whi[nw - 1] = ihi > whi[nw - 1] ? ihi : whi[nw - 1]; continue; }
    if (nw == PS_MAXW) break;
    wlo[nw] = ilo; whi[nw] = ihi; ++nw;
  }
  int64_t rk[2 * PS_MAXW];
  for (int g = 0; g < nw; ++g) { rk[2 * g] = wlo[g]; rk[2 * g + 1] = whi[g]; }
  int nrk = 0;
  for (int i = 0; i < 2 * nw; ++i) if (nrk == 0 || rk[nrk - 1] != rk[i]) rk[nrk++] = rk[i];
  int depth = 2;
  for (int64_t c = ns; c > 1; c >>= 1) depth += 2;
  u64_mselect(x, 0, ns, rk, nrk, depth); /* x[wlo..whi]: the window's sample keys */
  int64_t budget = VGCT_PRESEL_MAX_KEYS, total = 0;
  for (int g = 0; g < nw; ++g) {
    const int64_t ilo = wlo[g], ihi = whi[g], len = ihi - ilo + 1;
    uint64_t *y = x + ilo;
    qsort(y, (size_t)len, sizeof(uint64_t), cmp_u64);
    const uint64_t lo = ilo == 0 ? 0 : y[0], hi = ihi == ns - 1 ? PS_INF_KEY : y[len - 1];
    /* ties: the values inside filling >= 1/16 of the window's sample (at most
     * 16 of them), the PS_MAXPV - 2 most frequent kept, ascending */
    uint64_t hv[17];
    int64_t hc[17];
    int nh = 0;
    for (int64_t r = 0; r < len;) {
      int64_t r2 = r;
      while (r2 < len && y[r2] == y[r]) ++r2;
      if (y[r] > lo && y[r] < hi && (r2 - r) * 16 >= len && nh < 17) { hv[nh] = y[r]; hc[nh] = r2 - r; ++nh; }
      r = r2;
    }
    for (int i = 0; i < nh; ++i) /* most frequent first (ties: smaller value first) */
      for (int j = i + 1; j < nh; ++j)
        if (hc[j] > hc[i] || (hc[j] == hc[i] && hv[j] < hv[i])) {
          uint64_t tv = hv[i]; hv[i] = hv[j]; hv[j] = tv;
          int64_t tc = hc[i]; hc[i] = hc[j]; hc[j] = tc;
        }
    if (nh > PS_MAXPV - 2) nh = PS_MAXPV - 2;
    for (int i = 1; i < nh; ++i) /* ascending */
      for (int j = i; j > 0 && hv[j - 1] > hv[j]; --j) { uint64_t z = hv[j]; hv[j] = hv[j - 1]; hv[j - 1] = z; }
    S->lo[g] = lo; S->hi[g] = hi;
    int npv = 0;
    S->pv[g][npv++] = lo;
    for (int i = 0; i < nh; ++i) S->pv[g][npv++] = hv[i];
    if (hi != lo) S->pv[g][npv++] = hi;
    S->npv[g] = npv;
    for (int i = 0; i < npv; ++i) S->pvs[g][i] = (int64_t)S->pv[g][i];
    /* the stored keys expected: the window's sample share, ties excluded */
    int64_t inner = len;
    for (int r = 0; r < len; ++r) {
      int piv = 0;
      for (int i = 0; i < npv; ++i) piv |= y[r] == S->pv[g][i];
      inner -= piv;
    }
    const double cap = 2.0 * (double)inner / (double)ns * nest + 4096.0;
    if (cap > (double)(budget - total)) break;
    S->cap[g] = (int64_t)cap;
    total += S->cap[g];
    S->nw = g + 1;
  }
  if (S->nw == 0) goto fail;
  S->kern = pick_ps_kern();
  S->keys = pick_keys_kern();
  S->fused = pick_ps_fused();
  S->mem = (uint64_t *)eng_malloc((size_t)total * sizeof(uint64_t)); /* untouched pages are free */
  if (!S->mem) goto fail;
  int64_t off = 0;
  for (int g = 0; g < S->nw; off += S->cap[g], ++g) {
    S->buf[g] = S->mem + off;
    atomic_init(&S->pos[g], 0);
  }
  free(x);
  free(t);
  return S;
fail:
  free(x);
  free(t);
  free(S);
  return NULL;
}

/* The ranks (order[0..nranks), ascending) that fell inside a complete window
 * of the reduction: values written, resolved[] set.  VGCT_ECHANGED when the
 * window counts contradict the reduction's n_finite. */
static int presel_resolve(struct vgct_cpu_presel *S, int64_t n_finite, const rank_ref *order,
                          int nranks, unsigned char *resolved, double *values, char *err,
                          size_t errlen) {
  if (S->nkeys != n_finite) {
    snprintf(err, errlen,
             "input changed during compare: %lld finite pairs in the reduction, %lld keys in its "
             "quantile windows (do not write into the inputs while compare() reads them)",
             (long long)n_finite, (long long)S->nkeys);
    return VGCT_ECHANGED;
  }
  for (int g = 0; g < S->nw; ++g) {
    const int64_t stored = (int64_t)atomic_load(&S->pos[g]);
    if (stored > S->cap[g]) continue; /* overflowed: the passes take these ranks */
    int64_t tot = stored;
    for (int i = 0; i < S->npv[g]; ++i) tot += S->eq[g][i];
    if (S->lt[g] + tot > n_finite) {
      snprintf(err, errlen,
               "input changed during compare: a quantile window counted %lld keys of %lld finite "
               "pairs (do not write into the inputs while compare() reads them)",
               (long long)(S->lt[g] + tot), (long long)n_finite);
      return VGCT_ECHANGED;
    }
    uint64_t *y = S->buf[g];
    int64_t below[PS_MAXPV]; /* stored keys below each pivot */
    for (int i = 0; i < S->npv[g]; ++i) {
      int64_t c = 0;
      for (int64_t j = 0; j < stored; ++j) c += y[j] < S->pv[g][i];
      below[i] = c;
    }
    int depth = 2;
    for (int64_t c = stored; c > 1; c >>= 1) depth += 2;
    /* each rank inside: a pivot's value, or a rank among the stored keys */
    int64_t srk[2 * PS_MAXW * 32];
    int nsr = 0, many = 0;
    for (int q = 0; q < nranks; ++q) {
      const int64_t r = order[q].rank - S->lt[g];
      if (resolved[q] || r < 0 || r >= tot) continue;
      /* sorted window: stored keys < pv[0], pv[0] x eq[0], stored in (pv[0], pv[1]), ... */
      int64_t acc = 0, sr = -1;
      int found = 0;
      for (int i = 0; i < S->npv[g]; ++i) {
        const int64_t start = below[i] + acc;
        if (r < start) { sr = r - acc; found = 1; break; }
        if (r < start + S->eq[g][i]) { /* a pivot: its value */
          values[order[q].orig] = vgct_f64_from_bits(S->pv[g][i]);
          resolved[q] = 1;
          found = 1;
          break;
        }
        acc += S->eq[g][i];
      }
      if (!found) sr = r - acc;
      if (sr >= 0) {
        if (nsr < (int)(sizeof srk / sizeof srk[0])) srk[nsr++] = sr;
        else many = 1;
      }
    }
    if (nsr == 0) continue;
    /* the stored ranks: one multi-select (ascending, distinct); one sort only for more
     * ranks than compare() ever asks (the engine tests' dense rank lists) */
    if (many) {
      qsort(y, (size_t)stored, sizeof(uint64_t), cmp_u64);
    } else {
      for (int i = 1; i < nsr; ++i)
        for (int j = i; j > 0 && srk[j - 1] > srk[j]; --j) { int64_t z = srk[j]; srk[j] = srk[j - 1]; srk[j - 1] = z; }
      int u = 0;
      for (int i = 0; i < nsr; ++i) if (u == 0 || srk[u - 1] != srk[i]) srk[u++] = srk[i];
      u64_mselect(y, 0, stored, srk, u, depth);
    }
    for (int q = 0; q < nranks; ++q) { /* the same walk, now reading the stored keys */
      const int64_t r = order[q].rank - S->lt[g];
      if (resolved[q] || r < 0 || r >= tot) continue;
      int64_t acc = 0;
      for (int i = 0; i < S->npv[g]; ++i) {
        if (r < below[i] + acc) break;
        acc += S->eq[g][i];
      }
      values[order[q].orig] = vgct_f64_from_bits(y[r - acc]);
      resolved[q] = 1;
    }
  }
  return VGCT_OK;
}

/* Split group gi (its keys counted by their next digit in hsum, HBINS bins,
 * summing to its count: the caller checks) into one new group per bucket
 * holding some of its ranks, appended at groups[*ng]: each rank becomes
 * relative to its bucket; a bucket with every bit known is finished (the
 * value is the key), one of at most gcap keys is to be gathered (state 1),
 * else histogrammed at the next level (state 0).  Group gi is done (2). */
static void split_group(group_t *groups, int *ng, int *gstate, int gi, const uint64_t *hsum,
                        const rank_ref *order, int64_t *rel, double *values, int64_t gcap) {
  const group_t *G = &groups[gi];
  int64_t below = 0;
  int b = 0;
  int q = 0;
  while (q < G->nr) {
    int64_t r = rel[G->first + q];
    while (below + (int64_t)hsum[b] <= r) { below += (int64_t)hsum[b]; ++b; }
    /* new group: the ranks of G falling in bucket b */
    int q0 = q;
    while (q < G->nr && rel[G->first + q] < below + (int64_t)hsum[b]) { rel[G->first + q] -= below; ++q; }
    group_t *N = &groups[*ng];
    N->prefix = (G->prefix << lv_width[G->level]) | (uint64_t)b;
    N->shift = lv_shift[G->level];
    N->level = G->level + 1;
    N->count = (int64_t)hsum[b];
    N->nr = q - q0;
    N->first = G->first + q0;
    if (N->level == NLEVEL) { /* every bit known: the value is the key */
      for (int z = q0; z < q; ++z) values[order[G->first + z].orig] = vgct_f64_from_bits(N->prefix);
      gstate[*ng] = 2;
    } else {
      gstate[*ng] = N->count <= gcap ? 1 : 0;
    }
    ++*ng;
  }
  gstate[gi] = 2;
}

int vgct_cpu_select(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                    const int64_t *ranks, int nranks, double *values,
                    char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (nranks <= 0) return VGCT_OK;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r] < 0) {
      set_err(err, errlen, "vgct_cpu_select: %s %lld is negative", "rank", (long long)ranks[r]);
      return VGCT_EVALUE;
    }
  plan_t P;
  plan_build(a, e, -1, &P);
  const int64_t cap = SELECT_CAP_EFF;

  /* working state, all bounded by nranks and constants */
  int rc = VGCT_OK;
  rank_ref *order = (rank_ref *)eng_malloc((size_t)nranks * sizeof(rank_ref));
  int64_t *rel = (int64_t *)eng_malloc((size_t)nranks * sizeof(int64_t)); /* rank within its group, by order index */
  group_t *groups = (group_t *)eng_malloc((size_t)nranks * sizeof(group_t) * 2);
  int *gstate = (int *)eng_malloc((size_t)nranks * 2 * sizeof(int)); /* 0 pend 1 gather 2 done */
  sel_ctx C;
  memset(&C, 0, sizeof C);
  cancel_t cc;
  cc_init(&cc, p);
  C.cc = &cc;
  C.P = &P;
  C.seg = seg_size(P.n);
  C.nseg = P.n > 0 ? (P.n + C.seg - 1) / C.seg : 0;
  int nthreads = pick_threads(p->nthreads, P.n, C.nseg);
  tile_t *tiles[MAX_THREADS];
  uint64_t *hist[MAX_THREADS];
  int64_t total[MAX_THREADS];
  for (int i = 0; i < nthreads; ++i) { hist[i] = NULL; tiles[i] = NULL; }
  C.tiles = tiles; C.hist = hist; C.total = total;
  C.stage = eng_malloc((size_t)nthreads * sizeof *C.stage);
  C.rlt = eng_malloc((size_t)nthreads * sizeof *C.rlt);
  unsigned char *resolved = (unsigned char *)eng_malloc((size_t)nranks);
  uint64_t *gbuf = NULL, *sample = NULL;
  int ok = order && rel && groups && gstate && C.stage && C.rlt && resolved &&
           alloc_tiles(tiles, nthreads);
  /* the candidate buffer: never more keys than pairs */
  const int64_t gcap = cap < P.n ? cap : P.n;
  if (ok) { gbuf = (uint64_t *)eng_malloc((size_t)(gcap > 0 ? gcap : 1) * sizeof(uint64_t)); ok = gbuf != NULL; }
  if (!ok) {
    set_err(err, errlen, "vgct_cpu_select: out of memory (%s, %lld threads)",
            "histograms, tile buffers or the candidate buffer", (long long)nthreads);
    rc = VGCT_ENOMEM;
    goto done;
  }
  for (int r = 0; r < nranks; ++r) { order[r].rank = ranks[r]; order[r].orig = r; }
  qsort(order, (size_t)nranks, sizeof(rank_ref), cmp_rank_ref);
  for (int r = 0; r < nranks; ++r) rel[r] = order[r].rank;
  for (int r = 0; r < nranks; ++r) resolved[r] = 0;
  if (p->presel && p->presel->filled && p->expect_finite >= 0) {
    /* the reduction's windows: ranks inside are finished without a pass */
    rc = presel_resolve(p->presel, p->expect_finite, order, nranks, resolved, values, err, errlen);
    if (rc != VGCT_OK) goto done;
    int w = 0;
    for (int r = 0; r < nranks; ++r)
      if (!resolved[r]) { order[w] = order[r]; resolved[w] = 0; ++w; }
    nranks = w;
    for (int r = 0; r < nranks; ++r) rel[r] = order[r].rank;
    if (nranks == 0) {
#ifdef VGCT_CPU_TESTING
      vgct_cpu_test_last_passes = 0;
#endif
      goto done;
    }
  }

  /* one root group holding every finite key (prefix: the sign bit, 0) */
  int ng = 1;
  groups[0].prefix = 0; groups[0].shift = 63; groups[0].level = 0; groups[0].count = -1;
  groups[0].nr = nranks; groups[0].first = 0;
  gstate[0] = 0;
  int64_t n_finite = -1;
  int passes = 0;
  const int64_t ef = p->expect_finite;
  if (ef >= 0) { /* n_finite known: the first pass need not find it */
    for (int r = 0; r < nranks; ++r)
      if (order[r].rank >= ef) {
        set_err(err, errlen, "vgct_cpu_select: %s %lld out of range (finite pairs: see n_finite)",
                "rank", (long long)order[r].rank);
        rc = VGCT_EVALUE;
        goto done;
      }
    if (ef <= gcap) { /* every key fits the buffer: one gathering pass */
      groups[0].count = ef;
      gstate[0] = 1;
      n_finite = ef;
    }
  }
  if (n_finite < 0 && P.n >= SAMPLE_MIN_N && cap >= 8192) { /* a sample predicts where the ranks lie */
    sample = (uint64_t *)eng_malloc((size_t)(SAMPLE_TILES + 1) * TILE * sizeof(uint64_t));
    if (sample) setup_ranges(&C, &P, order, nranks, gcap, gbuf, tiles[0], sample);
  }
  for (;;) {
    /* choose this pass's work: pending groups (same level) and gather groups */
    int pend[MAX_PEND], gath[MAX_GATH];
    C.npend = 0; C.ngath = 0;
    int level = -1;
    for (int g = 0; g < ng && C.npend < MAX_PEND; ++g)
      if (gstate[g] == 0 && (level < 0 || groups[g].level == level)) {
        level = groups[g].level;
        pend[C.npend++] = g;
      }
    int64_t used = 0;
    for (int g = 0; g < ng && C.ngath < MAX_GATH; ++g)
      if (gstate[g] == 1 && used + groups[g].count <= gcap) {
        gath[C.ngath++] = g;
        used += groups[g].count;
      }
    if (C.npend == 0 && C.ngath == 0) break;
    if (C.npend) {
      C.pend_dshift = lv_shift[level];
      C.pend_pshift = lv_shift[level] + lv_width[level];
      C.dmask = ((uint64_t)1 << lv_width[level]) - 1;
      for (int k = 0; k < C.npend; ++k) C.pend_prefix[k] = groups[pend[k]].prefix;
      const int slots = C.npend > 1 ? C.npend : 2; /* the first pass uses slot 1 too */
      for (int i = 0; i < nthreads; ++i) {
        if (!hist[i] && !(hist[i] = (uint64_t *)eng_malloc((size_t)MAX_PEND * HBINS * sizeof(uint64_t)))) {
          set_err(err, errlen, "vgct_cpu_select: out of memory (%s, %lld threads)", "histograms",
                  (long long)nthreads);
          rc = VGCT_ENOMEM;
          goto done;
        }
        memset(hist[i], 0, (size_t)slots * HBINS * sizeof(uint64_t));
      }
    }
    used = 0;
    for (int k = 0; k < C.ngath; ++k) {
      group_t *G = &groups[gath[k]];
      C.gath_prefix[k] = G->prefix; C.gath_shift[k] = G->shift;
      C.gath_buf[k] = gbuf + used;
      C.gath_cap[k] = G->count;
      atomic_init(&C.gath_pos[k], 0);
      used += G->count;
    }
    for (int i = 0; i < nthreads; ++i) {
      total[i] = 0;
      for (int g = 0; g < MAX_RNG; ++g) C.rlt[i][g] = 0;
    }
    par_run(nthreads, C.nseg, select_unit, &C, &cc);
    ++passes;
    if (cc_stopped(&cc)) {
      set_err(err, errlen, "vgct_cpu_select: %s after %lld passes", "interrupted", (long long)passes);
      rc = VGCT_EINTR;
      goto done;
    }
    if (n_finite >= 0) { /* every pass reads every pair: the same finite count each time */
      int64_t nf = 0;
      for (int i = 0; i < nthreads; ++i) nf += total[i];
      if (nf != n_finite) {
        snprintf(err, errlen,
                 "input changed during compare: %lld finite pairs in one pass, %lld in the next "
                 "quantile pass (do not write into the inputs while compare() reads them)",
                 (long long)n_finite, (long long)nf);
        rc = VGCT_ECHANGED;
        goto done;
      }
    } else {
      n_finite = 0;
      for (int i = 0; i < nthreads; ++i) n_finite += total[i];
      groups[0].count = n_finite;
      if (p->expect_finite >= 0 && n_finite != p->expect_finite) {
        snprintf(err, errlen,
                 "input changed during compare: %lld finite pairs in the reduction, %lld in the "
                 "quantile pass (do not write into the inputs while compare() reads them)",
                 (long long)p->expect_finite, (long long)n_finite);
        rc = VGCT_ECHANGED;
        goto done;
      }
      for (int r = 0; r < nranks; ++r)
        if (order[r].rank >= n_finite) {
          set_err(err, errlen, "vgct_cpu_select: %s %lld out of range (finite pairs: see n_finite)",
                  "rank", (long long)order[r].rank);
          rc = VGCT_EVALUE;
          goto done;
        }
      /* ranks inside a complete sampled range: [lt, lt + cnt) are exactly its keys */
      for (int g = 0; g < C.nrng; ++g) {
        const int64_t cnt = (int64_t)atomic_load(&C.rpos[g]);
        if (cnt > C.rcap[g]) continue; /* overflowed */
        int64_t lt = 0;
        for (int i = 0; i < nthreads; ++i) lt += C.rlt[i][g];
        int64_t rk[64];
        int depth = 2;
        for (int64_t c = cnt; c > 1; c >>= 1) depth += 2;
        int q = 0;
        while (q < nranks) { /* batches of 64 distinct ranks, read out after each */
          int m = 0, q0 = q;
          while (q < nranks && (m < 64 || (m > 0 && rk[m - 1] == order[q].rank - lt))) {
            const int64_t r = order[q].rank;
            if (!resolved[q] && r >= lt && r < lt + cnt && (m == 0 || rk[m - 1] != r - lt))
              rk[m++] = r - lt;
            ++q;
          }
          if (m == 0) continue;
          u64_mselect(C.rbuf[g], 0, cnt, rk, m, depth);
          for (int z = q0; z < q; ++z) {
            const int64_t r = order[z].rank;
            if (!resolved[z] && r >= lt && r < lt + cnt) {
              values[order[z].orig] = vgct_f64_from_bits(C.rbuf[g][r - lt]);
              resolved[z] = 1;
            }
          }
        }
      }
      if (C.nrng > 0) { /* the rest stay in the root group */
        int w = 0;
        for (int r = 0; r < nranks; ++r)
          if (!resolved[r]) { order[w] = order[r]; rel[w] = rel[r]; ++w; }
        groups[0].nr = w;
      }
      C.nrng = 0;
    }
    /* gathered groups: finish in memory */
    for (int k = 0; k < C.ngath; ++k) {
      group_t *G = &groups[gath[k]];
      uint64_t *x = C.gath_buf[k];
      int64_t cnt = G->count;
      if ((int64_t)atomic_load(&C.gath_pos[k]) != cnt) {
        snprintf(err, errlen,
                 "input changed during compare: a key range held %lld pairs in one quantile pass "
                 "and %lld in the next (do not write into the inputs while compare() reads them)",
                 (long long)cnt, (long long)atomic_load(&C.gath_pos[k]));
        rc = VGCT_ECHANGED;
        goto done;
      }
      int64_t rk[64];
      int done_r = 0;
      int depth = 2;
      for (int64_t c = cnt; c > 1; c >>= 1) depth += 2;
      while (done_r < G->nr) { /* ranks in batches of 64 (sorted, deduplicated) */
        int m = 0, q0 = done_r;
        while (done_r < G->nr && (m < 64 || rk[m - 1] == rel[G->first + done_r])) {
          int64_t v = rel[G->first + done_r];
          if (m == 0 || rk[m - 1] != v) rk[m++] = v;
          ++done_r;
        }
        u64_mselect(x, 0, cnt, rk, m, depth);
        /* read this batch out before the next one moves keys around */
        for (int q = q0; q < done_r; ++q)
          values[order[G->first + q].orig] = vgct_f64_from_bits(x[rel[G->first + q]]);
      }
      gstate[gath[k]] = 2;
    }
    /* histogrammed groups: split by digit */
    for (int k = 0; k < C.npend; ++k) {
      group_t *G = &groups[pend[k]];
      uint64_t *hsum = hist[0] + (size_t)k * HBINS;
      for (int i = 1; i < nthreads; ++i) {
        const uint64_t *hh = hist[i] + (size_t)k * HBINS;
        for (int b = 0; b < HBINS; ++b) hsum[b] += hh[b];
      }
      if (G->level == 0) /* the first pass's second histogram, of every thread */
        for (int i = 0; i < nthreads; ++i) {
          const uint64_t *hh = hist[i] + HBINS;
          for (int b = 0; b < HBINS; ++b) hsum[b] += hh[b];
        }
      int64_t hs = 0;
      for (int b = 0; b < HBINS; ++b) hs += (int64_t)hsum[b];
      if (hs != G->count) { /* the buckets below must hold every rank of G */
        snprintf(err, errlen,
                 "input changed during compare: a key range held %lld pairs in one quantile pass "
                 "and %lld in the next (do not write into the inputs while compare() reads them)",
                 (long long)G->count, (long long)hs);
        rc = VGCT_ECHANGED;
        goto done;
      }
      split_group(groups, &ng, gstate, pend[k], hsum, order, rel, values, gcap);
    }
    /* groups are append-only; compact finished ones away to bound the table */
    int w = 0;
    for (int g = 0; g < ng; ++g)
      if (gstate[g] != 2) { groups[w] = groups[g]; gstate[w] = gstate[g]; ++w; }
    ng = w;
  }
#ifdef VGCT_CPU_TESTING
  vgct_cpu_test_last_passes = passes;
#endif
  (void)passes;
done:
  for (int i = 0; i < nthreads; ++i) free(hist[i]);
  free_tiles(tiles, nthreads);
  free(C.stage);
  free(C.rlt);
  free(resolved);
  free(sample);
  free(gbuf);
  free(order); free(rel); free(groups); free(gstate);
  return rc;
}

/* ======================================================================
 * vgct_cpu_histogram: digit histograms of the selection keys for the
 * distributed radix selection of compare_sharded (contract: vgct_engine.h)
 * ====================================================================== */
typedef struct {
  const plan_t *P;
  int64_t seg, nseg;
  int nprefix, prefix_bits, width;
  const uint64_t *sorted_prefix; /* ascending                          */
  const int *row_of;             /* row (caller order) of sorted_prefix */
  int64_t **cnt;                 /* per thread: [nprefix << width]     */
  tile_t **tiles;
  cancel_t *cc;
} hist_ctx;

static void hist_unit(void *ctx, int64_t s, int tid) {
  hist_ctx *C = (hist_ctx *)ctx;
  const plan_t *P = C->P;
  tile_t *t = C->tiles[tid];
  int64_t *cnt = C->cnt[tid];
  const int pb = C->prefix_bits, w = C->width, np = C->nprefix;
  const int dsh = 64 - pb - w;
  const uint64_t dmask = (w == 64) ? ~(uint64_t)0 : (((uint64_t)1 << w) - 1);
  const int64_t start = s * C->seg;
  const int64_t end = start + C->seg < P->n ? start + C->seg : P->n;
  iter_t it;
  iter_seek(P, &it, start);
  uint64_t keys[TILE];
  while (it.pos < end) {
    if (cc_check(C->cc, tid)) break; /* the call is discarded */
    tile_fill_keys(P, &it, end, t);
    const int m = tile_keys(t, keys);
    if (pb == 0) {
      for (int j = 0; j < m; ++j) cnt[(keys[j] >> dsh) & dmask]++;
    } else if (np == 1) {
      const uint64_t p0 = C->sorted_prefix[0];
      for (int j = 0; j < m; ++j)
        if ((keys[j] >> (64 - pb)) == p0) cnt[(keys[j] >> dsh) & dmask]++;
    } else {
      for (int j = 0; j < m; ++j) {
        const uint64_t pre = keys[j] >> (64 - pb);
        int lo = 0, hi = np - 1; /* binary search in the sorted prefixes */
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (C->sorted_prefix[mid] < pre) lo = mid + 1; else hi = mid;
        }
        if (C->sorted_prefix[lo] == pre)
          cnt[((size_t)C->row_of[lo] << w) + ((keys[j] >> dsh) & dmask)]++;
      }
    }
  }
}

typedef struct { uint64_t prefix; int row; } prefix_ref;
static int cmp_prefix_ref(const void *x, const void *y) {
  const prefix_ref *a = (const prefix_ref *)x, *b = (const prefix_ref *)y;
  return a->prefix < b->prefix ? -1 : a->prefix > b->prefix;
}

int vgct_cpu_histogram(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                       const uint64_t *prefixes, int nprefix, int prefix_bits, int width,
                       int64_t *counts, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (prefix_bits < 0 || width < 1 || width > VGCT_HIST_MAX_WIDTH || prefix_bits + width > 64 ||
      nprefix < 1 || nprefix > VGCT_HIST_MAX_PREFIXES || !prefixes || !counts) {
    set_err(err, errlen, "vgct_cpu_histogram: bad arguments (%s; prefix_bits=%lld)",
            "need 0 <= prefix_bits, 1 <= width <= 16, prefix_bits + width <= 64, "
            "1 <= nprefix <= 128", (long long)prefix_bits);
    return VGCT_EVALUE;
  }
  if (prefix_bits == 0 && (nprefix != 1 || prefixes[0] != 0)) {
    set_err(err, errlen, "vgct_cpu_histogram: %s (nprefix=%lld)",
            "prefix_bits == 0 takes the single prefix 0", (long long)nprefix);
    return VGCT_EVALUE;
  }
  prefix_ref sorted[VGCT_HIST_MAX_PREFIXES];
  uint64_t sp[VGCT_HIST_MAX_PREFIXES];
  int row_of[VGCT_HIST_MAX_PREFIXES];
  for (int g = 0; g < nprefix; ++g) {
    if (prefix_bits > 0 && prefix_bits < 64 && (prefixes[g] >> prefix_bits) != 0) {
      set_err(err, errlen, "vgct_cpu_histogram: %s (prefix %lld)", "prefix >= 2^prefix_bits",
              (long long)g);
      return VGCT_EVALUE;
    }
    sorted[g].prefix = prefixes[g]; sorted[g].row = g;
  }
  qsort(sorted, (size_t)nprefix, sizeof(prefix_ref), cmp_prefix_ref);
  for (int g = 0; g < nprefix; ++g) {
    if (g > 0 && sorted[g].prefix == sorted[g - 1].prefix) {
      set_err(err, errlen, "vgct_cpu_histogram: %s (row %lld)", "duplicate prefix",
              (long long)sorted[g].row);
      return VGCT_EVALUE;
    }
    sp[g] = sorted[g].prefix; row_of[g] = sorted[g].row;
  }
  const size_t ncnt = (size_t)nprefix << width;
  memset(counts, 0, ncnt * sizeof(int64_t));
  plan_t P;
  plan_build(a, e, -1, &P);
  if (P.n == 0) return VGCT_OK;
  hist_ctx C;
  memset(&C, 0, sizeof C);
  C.P = &P;
  C.seg = seg_size(P.n);
  C.nseg = (P.n + C.seg - 1) / C.seg;
  C.nprefix = nprefix; C.prefix_bits = prefix_bits; C.width = width;
  C.sorted_prefix = sp; C.row_of = row_of;
  int nthreads = pick_threads(p->nthreads, P.n, C.nseg);
  /* extra counters (threads 1..) within 64 MiB */
  const size_t bytes = ncnt * sizeof(int64_t);
  while (nthreads > 1 && (size_t)(nthreads - 1) * bytes > ((size_t)64 << 20)) --nthreads;
  tile_t *tiles[MAX_THREADS];
  int64_t *cnt[MAX_THREADS];
  for (int i = 0; i < nthreads; ++i) cnt[i] = NULL;
  cnt[0] = counts;
  int ok = alloc_tiles(tiles, nthreads);
  for (int i = 1; ok && i < nthreads; ++i) {
    cnt[i] = (int64_t *)eng_calloc(ncnt, sizeof(int64_t));
    ok = cnt[i] != NULL;
  }
  if (!ok) {
    for (int i = 1; i < nthreads; ++i) free(cnt[i]);
    free_tiles(tiles, nthreads);
    set_err(err, errlen, "vgct_cpu_histogram: out of memory (%s, %lld threads)",
            "per-thread counters or tile buffers", (long long)nthreads);
    return VGCT_ENOMEM;
  }
  C.cnt = cnt; C.tiles = tiles;
  cancel_t cc;
  cc_init(&cc, p);
  C.cc = &cc;
  par_run(nthreads, C.nseg, hist_unit, &C, &cc);
  for (int i = 1; i < nthreads; ++i) {
    for (size_t b = 0; b < ncnt; ++b) counts[b] += cnt[i][b];
    free(cnt[i]);
  }
  free_tiles(tiles, nthreads);
  if (cc_stopped(&cc)) {
    set_err(err, errlen, "vgct_cpu_histogram: %s (%lld pairs)", "interrupted", (long long)P.n);
    return VGCT_EINTR;
  }
  return VGCT_OK;
}

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
