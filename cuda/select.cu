/*
 * select.cu -- vgct_cuda_select: exact order statistics of |a_i - e_i| over
 * the finite pairs, over the uint64 keys of vgct_absdiff_key (vgct_stats.h;
 * bit 63 is always 0; the integer order is the numeric order).  No sort of
 * the data, extra memory bounded (the 16 MiB workspace): histograms and a
 * candidate buffer of at most SEL_CAP keys.  Order statistics do not depend
 * on order, so every plan below gives the same, exact values (equal to the
 * CPU engine's), whatever order the atomics store keys in.
 *
 * Three plans, by n (pairs) -- the window plan answers what it can, the ranks
 * it does not cover go to the radix path:
 *
 * 1. Window plan (n >= SEL_WIN_MIN; the GPU form of the CPU engine's key
 *    windows, csrc/cpu_windows.inc).  Its cost does not depend on how the
 *    differences are distributed: one read of the inputs, and ties are
 *    counted in registers, never histogrammed.
 *    a. k_sel_sample: K = n/256 keys (clamped to [2^14, 2^20]) from runs of
 *       WIN_RUN consecutive chunks evenly spaced over the iteration (fixed by
 *       the shape: deterministic), into the candidate buffer.
 *    b. k_sel_cbuf, one cooperative grid over the sample's keys (where the
 *       device runs it; else k_sel_buf level 0, k_sel_fin and k_sel_buf levels
 *       1-4, which return at once when the finish answered): its exact order
 *       statistics at the
 *       windows' sample ranks, which it computes on the device from the
 *       sample's finite count ns (no host round trip): for the ranks
 *       of a window, at fraction ph of the n_finite keys, sample ranks
 *       floor(ph (ns-1) - mg) .. ceil(ph (ns-1) + 1 + mg), mg = z sqrt(ns ph
 *       (1-ph)) + 16 + ns/2048 (the CPU engine's margin; z = 6 sigmas, fewer,
 *       down to 3, only when the windows would not fit the buffer); windows
 *       that overlap merge, at most WIN_MAXW (4), 2 sample ranks each.
 *    c. k_sel_window<DA,DE,NW>: one pass over the inputs on every SM (several
 *       blocks each, no shared histogram): per key and window g, lt += key <
 *       lo, eql += key == lo, eqh += key == hi, keys strictly inside staged
 *       per warp and appended to window g's region of the candidate buffer
 *       (bounded: past its cap the window is marked overflowed); lo = 0 /
 *       hi = +Inf when the window reaches the sample's ends.  Also the
 *       finite count, checked against the reduction's (VGCT_ECHANGED).
 *       Counters in registers, one 64-bit atomic per block and counter.
 *       One host round trip reads the counts.
 *    d. On the host: a rank r with lt <= r < lt + eql is lo, one past the
 *       stored keys (up to + eqh) is hi, one in between is rank r - lt - eql
 *       of the window's stored keys: one k_sel_fin block selecting in that region
 *       when it holds at most FIN_CAP keys, else k_sel_cbuf over it (where
 *       the device runs it), else k_sel_buf levels 0 and 1
 *       over it, k_sel_fin over the rank's level-1 bucket, and levels 2-4 --
 *       which return at once when the finish answered (up to NSLOT_WSEL
 *       batches of SEL_NS ranks before one host round trip).  The
 *       stored keys are bounded by the window's rank width whatever the
 *       data: ties at lo and hi are counted, not stored.
 *    A rank in no window (the sample misled, a window overflowed) goes to the
 *    radix path -- slower, never inexact.
 *    c'. The fused window (vgct_cuda_compare, at the end of this file): with
 *       one window, and a reduction that runs k_reduce_bulk (flat 16-byte-
 *       aligned float16/bfloat16/float32 pairs, n >= WIN_FUSE_MIN, sm_90),
 *       steps a-b run BEFORE the reduction (windows predicted for n finite
 *       pairs), k_win_count writes the window's bounds, counts the sample's
 *       keys at or above lo, and its last block chooses the
 *       reduction's way (WinState::mode, below), and the reduction counts the
 *       window in its own pass (cuda/reduce.cu): no pass of the selection over
 *       the inputs, and no host round trip before the reduction -- the three
 *       k_reduce_bulk variants (no window, the sparse way, every pair
 *       classified) are launched in a row and each returns at once unless
 *       the device chose it (before 2026-12-02 the host read the verdict: a
 *       round trip of ~20-40 us with the GPU idle).  Up to WIN_FUSE_GE of the
 *       sample's keys at or above lo, the reduction keys only the few pairs
 *       that may be such keys (VgLook, vg_win_cand_keys: the sparse way);
 *       past it, it classifies every pair in its fold (VgWinCnt), at a cost
 *       that does not depend on the data.  A window the reduction's record
 *       will most likely answer (win_record_answers: the sample's keys at
 *       both ranks 0, or the window reaching 0 and the ranks below the
 *       sample's estimate of the record's zero count) is left to the record
 *       (vgct_ranks_known) by k_sel_sample's last block, from the sample's
 *       own counts (win_early): step b's levels and k_win_count
 *       then return at once, the reduction runs without the window, and only
 *       when the record does not answer do b (again) and c run after it
 *       (win_resume).  Then d, with the reduction's n_finite as the pass's
 *       count and lt = n_finite - (keys >= lo).
 * 2. Store-all (n < SEL_WIN_MIN, or ranks left by the windows, n <= SEL_CAP):
 *    k_sel_data stores every key at its position while it builds the level-0
 *    histogram (on every SM), then k_sel_fin (the one-block finish, below)
 *    and one copy to the host; only when the finish could not answer every
 *    rank (a bucket of several values and more than FIN_CAP keys), 4
 *    k_sel_buf passes and a second copy.
 * 2'. A small call (vgct_cuda_compare, n <= TINY_CAP): k_sel_tiny, one block
 *    queued behind the reduction, takes the ranks from the reduction's record
 *    on the device, keys every pair into shared memory and selects among them
 *    all (fin_select): one host wait for the reduction and the quantiles, no
 *    launch after the record, and no histogram to clear, flush and scan
 *    (~18 us of one block's latency at any such n).
 * 2''. A mid-size call (vgct_cuda_compare, TINY_PREFER < n <= SEL_CAP, and
 *    at most 16384 keys a block on every SM: 2.16M pairs of 8-pair chunks on
 *    132 SMs): k_sel_coop, 2' as one cooperative grid -- each block keys its
 *    pairs into its shared memory and the grid selects together, a grid
 *    barrier per 8-bit digit (no histogram of 32768 bins, no host round
 *    trip, no launch after the record).  It takes the store-all plan's
 *    calls; those it cannot take (a small device) stay there.
 * 3. Radix over the data (n > SEL_CAP): k_sel_data level 0, then a compaction
 *    pass when the wanted buckets hold <= SEL_CAP keys (the usual case: a
 *    1/16-octave bucket), else one more data histogram level first (heavy
 *    ties); then the buffer passes.  2 passes over the inputs normally, at
 *    most 6, and batches of SEL_NS ranks.
 *
 * Radix digits: level 0 = key bits 62..48 (15 bits: the exponent and 4
 * mantissa bits, a 1/16-octave bucket), levels 1..4 = 12 bits each (47..36,
 * 35..24, 23..12, 11..0).  After level L every wanted rank knows the bucket
 * (key prefix) holding it and its rank inside that bucket; after level 4 the
 * prefix is the key.  Ranks sharing a prefix share a histogram ("group").
 *
 * Kernels (trade-offs):
 *   k_sel_data<DA,DE,MODE>  one pass over the inputs (the reduce's iteration
 *                      model and loaders; float16/bfloat16/float32 keys by
 *                      vg_key_narrow), per key by MODE: the level's digit
 *                      histogram (block-private shared-memory counters, 128
 *                      KiB: one 1024-thread block per SM; a run-length cache
 *                      absorbs runs of equal digits, but many ties still
 *                      contend on one counter), that plus every key stored
 *                      (store-all), or the wanted keys appended (compaction).
 *   k_sel_buf          the same histogram over a buffer (L2-resident, small):
 *                      the store-all / compacted keys, the sample, a window.
 *   k_sel_sample       K keys at fixed positions (one small launch).
 *   k_sel_fin          after level 0 (after level 1 for a window's region):
 *                      each wanted bucket's extremes (one value: its ranks
 *                      are that key) and, when the small buckets hold at most
 *                      FIN_CAP keys, the wanted positions among them
 *                      selected by the last block in shared memory
 *                      (fin_select: a radix selection, digits of 8 bits
 *                      below the keys' common prefix); or one block
 *                      selecting in a window's region (direct).  Replaces
 *                      the later histogram levels (launch- and scan-bound at
 *                      small n) by one pass.
 *   k_sel_tiny         a small call's whole selection in one block, chained
 *                      behind the reduction (2' above).
 *   k_sel_cbuf         the window plan's buffers (its sample; a region past
 *                      FIN_CAP keys) selected by one cooperative grid,
 *                      coop_select over keys loaded from the buffer into each
 *                      block's shared memory: one launch and a grid barrier
 *                      per 8-bit digit instead of five histogram levels of
 *                      up to 32768 bins, each cleared, flushed and scanned
 *                      by a last block (~60 us of device time each for
 *                      the 16K-key sample and a p99 region at 2^22 pairs;
 *                      the call's wall 0.68-0.87x with it at 2^21-2^24,
 *                      docs/performance.md 2026-12-04 17:50 UTC);
 *                      needs a cooperative device and at most one block of
 *                      COOP_KEYS keys per SM (2.16M keys on 132 SMs: every
 *                      sample and region, which hold at most SEL_CAP keys;
 *                      a smaller device, or one that refuses the grid,
 *                      takes the levels).
 *   k_sel_coop         a mid-size call's whole selection in one cooperative
 *                      grid, chained behind the reduction (2'' above).
 *   k_sel_window       the window pass: 3 compares per key and window in
 *                      registers instead of a histogram (no contention from
 *                      ties; more instructions per key as windows are added,
 *                      so NW = 1 has its own instantiation) -- only for the
 *                      chunks not counted whole: every key below every
 *                      window's lo, or every key 0 (float16/bfloat16/float32:
 *                      tested on the float32 differences, vg_win_t32_of's
 *                      bound, before any key is made); the others' pairs
 *                      keyed and counted split over the warp, 32 a round
 *                      (staged as float32 pairs; other dtypes as keys), or
 *                      -- when at least WIN_DIRECT lanes have such a chunk
 *                      -- each lane its own.  Trade-off: ~3 float32
 *                      instructions a pair more where every chunk is looked
 *                      at (constant offset: the call +4%); on bf16 rounding
 *                      noise the kernel 16-28% faster, the p99 call 14%
 *                      (docs/performance.md, 2026-12-01 19:31 section).
 *   k_win_count        the fused window's bounds and the sample's verdict
 *                      (c' above: the sparse way or every pair, chosen by its
 *                      last block; a small grid over the sample; before
 *                      2026-12-02 k_win_prep wrote the bounds, a launch of
 *                      its own; the record is k_sel_sample's verdict,
 *                      win_early, its last block: the record's rule needs only
 *                      the sample's zero, nonzero and empty counts, so the
 *                      shapes the record answers skip the sample's levels).
 *   Each histogram kernel's last block (integer counter) scans the histogram
 *   and moves every rank one level down (vg_sel_scan), so consecutive levels
 *   need no host round trip.
 */
#include <stdio.h>
#include <string.h>
#include <cooperative_groups.h>
#include "vgct_cuda_internal.cuh"

namespace cg = cooperative_groups;

#define ST 1024      /* threads per block (one block per SM: 128 KiB smem) */
#define SEL_NS 8     /* ranks per batch                                   */
#define SEL_BINS 32768
#define SEL_SMEM (SEL_BINS * 4)
#define SEL_CAP ((12u << 20) / 8) /* candidate keys: 12 MiB               */
#define KEY_NONE VG_KEY_NONE

/* workspace layout (bytes from d_ws; shares the region with reduce.cu,
   calls are serialised by the device lock -- but vgct_cuda_compare runs a
   reduction INSIDE a live window plan, which reduce.cu's layout allows: its
   counter and gate words below WS_SEL_CNT, its result record at WS_RES =
   4096 (inside slot 0, the radix path's, not live then), its partials in
   the histograms (with a fused window planned: VgWinFuse.part, whichever
   of k_reduce_bulk's three variants runs; the sample's levels are done, or
   were skipped by win_early and rerun from a cleared workspace after the
   reduction, win_resume) or, without one, at its WS_PART, inside the
   candidate buffer, over the sample's keys.  So a fused plan's reduction must
   take VgWinFuse.part: win_resume reads the sample's keys again after it --
   vg_reduce_can_fuse checks the conditions under which vg_reduce_run does;
   were they to differ (the ring kernel not run, VgWinFuse.used 0), the rerun
   levels would read overwritten keys: a worse window, the ranks it misses
   left to the radix path, never an inexact result):
     [WS_SEL_CNT, +64)        last-block counters (5 levels, k_sel_fin's, k_win_count's,
                              win_early's)
     [WS_SEL_FIN, +136)       k_sel_fin's FinState (zeroed with the counters,
                              and left zero by each k_sel_fin: several a call)
     [WS_SEL_STATE, +4096)    8 state slots of SEL_SLOT bytes: 0 the radix
                              path's SelState, 1 the sample's, 2..6 the
                              window selections', 7 the window pass's WinState
     [WS_SEL_HIST, CLEAR_END) 5 levels x SEL_BINS x u64 histograms; k_sel_coop's
                              slots and per-pass histograms (WS_COOP_*:
                              a chained call's, after its reduction, no plan
                              live), and k_sel_cbuf's (the same words, inside
                              a live window plan: the sample's selection, a
                              region's; stream-ordered with the levels and
                              the reduction's partials, each of which writes
                              before it reads or clears first)
     [WS_SEL_CAND, +12 MiB)   the candidate buffer (SEL_CAP keys): the radix
                              path's candidates or stored keys; in the window
                              plan first the sample's keys, then the windows'
                              regions (the window pass reads only the sample's
                              state, never its keys)
     [WS_SEL_FREG, +64 KiB)   k_sel_fin's region: the wanted buckets' keys
   The whole [WS_SEL_CNT, CLEAR_END) is zeroed before each plan. */
#define WS_SEL_CNT 64                    /* 5 last-block counters + k_sel_fin's */
#define CNT_FIN 5                        /* k_sel_fin's counter (index)       */
#define WS_SEL_FIN 1024                  /* FinState: inside the zeroed range */
#define WS_SEL_STATE 4096
#define SEL_SLOT 512                     /* bytes of one state slot          */
#define WS_SEL_HIST 8192                 /* 5 levels x SEL_BINS x u64        */
#define WS_SEL_CAND (2u << 20)
#define WS_SEL_CLEAR_END (WS_SEL_HIST + 5u * SEL_BINS * 8u)
#define WS_SEL_FREG (WS_SEL_CAND + (size_t)SEL_CAP * 8u)
#define FIN_CAP 8192                     /* keys k_sel_fin selects among in one block */
#define FIN_SMEM (FIN_CAP * 8)           /* k_sel_fin's keys in shared memory */
#define TINY_CAP 16384                   /* pairs k_sel_tiny keys in one block */
#define TINY_SMEM (TINY_CAP * 8)         /* its keys in shared memory (128 KiB) */
#define TINY_PREFER 12288                /* pairs up to which k_sel_tiny runs where k_sel_coop
                                            could: k_sel_coop faster from ~12K pairs on an H200
                                            (2^13: tiny 0.89-0.95x coop; 2^14: coop 0.81-0.90x
                                            tiny; docs/performance.md, 2026-12-04) */
#define TINY_STATIC 16384                /* its static shared memory, at most (fin_select's
                                            counters, the record, the ranks: ~10.5 KiB,
                                            checked at its first launch) */
#define SLOT_RADIX 0
#define SLOT_SAMPLE 1
#define SLOT_WSEL 2                      /* first window-selection slot       */
#define NSLOT_WSEL 5                     /* window selections per round       */
#define SLOT_WIN 7

/* ---- the window plan's constants ----------------------------------------
 * SEL_WIN_MIN: the window plan from this many pairs on; below it the store-
 * all plan (every key stored by the data pass, then the finish).  The window
 * plan costs a fixed ~4 launches (the sample, its selection by one
 * cooperative grid -- ~9 without it: its level 0, the finish and four levels
 * that return at once when it answered --, the window pass, one selection in a
 * window's stored keys) and 2 host round trips on top of its one
 * read of the inputs; store-all costs 1 round trip, an 8-byte store and a
 * read back a key.  Measured on an H200 (2026-12-01, bf16, p99,
 * VGCT_CUDA_TRACE, before the finish): at 2^20 pairs the window plan took
 * 256 us against ~170 us for store-all, at 2^24 308 us against ~610 us for
 * the radix plan.  So store-all as long as it can (n <= SEL_CAP), the window
 * plan above. */
#define SEL_WIN_MIN ((int64_t)SEL_CAP + 1)
#define WIN_SMIN (INT64_C(1) << 14)      /* sample keys: n/256 within these  */
#define WIN_SMAX (INT64_C(1) << 20)
#define WIN_RUN 32                       /* chunks of one sample run (a warp) */
#define WT 256                           /* threads of the sample/window kernels */
/* window-pass blocks per SM (and its launch bound): 85 registers a thread
   for one window (at 4 blocks, 64, the bf16/fp16 loops spilled), 128 for
   up to four */
#define WIN_BPM(nw) ((nw) == 1 ? 3 : 2)

struct SelState {
  unsigned long long total;   /* finite keys (level-0 count; the direct
                                 finish's count of its keys)          */
  unsigned long long ncand;   /* keys in the candidate buffer         */
  int ng, bad;                /* groups; a rank >= total was asked    */
  unsigned long long gprefix[SEL_NS];
  int slot_group[SEL_NS];
  unsigned long long prefix[SEL_NS];
  long long rank[SEL_NS];
  unsigned long long count[SEL_NS];
  long long srank[SEL_NS];    /* sample passes: the sample ranks used  */
  int fin;                    /* k_sel_fin resolved every slot: prefix[s] is its key */
  int fin_ties, fin_selected; /* ...slots by a one-key bucket, by the selection */
  int fin_pad;
  int skip;                   /* the sample's passes: its levels, k_sel_fin and
                                 k_win_count return at once -- k_sel_sample's last block
                                 left the fused window to the record (win_early)      */
};

/* k_sel_fin's grid-wide scratch (zeroed with the counters before a plan,
 * and again by each k_sel_fin's last block once read): per group the
 * largest ~key (so ~minc is the smallest key) and the largest key of its
 * bucket, and the keys appended to the region. */
struct FinState {
  unsigned long long minc[SEL_NS], max[SEL_NS];
  unsigned long long nfin;
};

/* WinState (the window pass's result, slot SLOT_WIN): vgct_cuda_internal.cuh. */


__host__ __device__ __forceinline__ int sel_shift(int L) { return L == 0 ? 48 : 48 - 12 * L; }
__host__ __device__ __forceinline__ int sel_bits(int L) { return L == 0 ? 15 : 12; }
__host__ __device__ __forceinline__ int sel_pshift(int L) { return L == 0 ? 63 : sel_shift(L - 1); }

struct KArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int level;      /* histogram level, -1 none                            */
  int store_all;  /* store every key at its position with the level-0
                     histogram (n <= SEL_CAP)                             */
  int compact;    /* append keys whose prefix at level `clevel` is wanted */
  int clevel;
  int ns;
  long long rank0[SEL_NS];
  long long nbuf;   /* k_sel_buf: keys in the buffer; < 0: st->ncand        */
  /* the sample's passes (sample = 1): level 0 computes the ranks on the
     device from the sample's finite count ns: slot 2g is window g's low end,
     floor(wph*(ns-1) - mg), slot 2g+1 its high end, ceil(wph*(ns-1) + 1 + mg),
     mg = wz sqrt(ns wph (1 - wph)) + 16 + ns/2048, plus wshift (test hook),
     clamped to [0, ns) */
  int sample;
  double wph[SEL_NS];
  double wz;
  long long wshift;
  SelState *st;
  unsigned long long *hist; /* this level's histograms                  */
  unsigned long long *cand;
  unsigned *counter;        /* this level's last-block counter          */
};

/* k_sel_buf's arguments: KArgs's selection fields without the iteration
 * (k_sel_buf reads the candidate buffer, never the inputs), so a launch
 * copies ~250 bytes of kernel parameters instead of KArgs's ~2.3 KB. */
struct BArgs {
  int level, ns, sample;
  long long rank0[SEL_NS];
  long long nbuf;
  double wph[SEL_NS];
  double wz;
  long long wshift;
  SelState *st;
  unsigned long long *hist, *cand;
  unsigned *counter;
};

/* ---- histogram helpers -------------------------------------------------- */

struct HistCtx {
  unsigned *sm;
  int level, shift, pshift, ng, nbins;
  unsigned long long gp[SEL_NS];
  unsigned last_bin, run; /* run-length cache */
};

__device__ __forceinline__ void hist_flush_run(HistCtx &h) {
  if (h.run) atomicAdd(&h.sm[h.last_bin], h.run);
  h.run = 0;
}

__device__ __forceinline__ void hist_key(HistCtx &h, unsigned long long key) {
  if (key >> 63) return; /* KEY_NONE: not a finite pair */
  unsigned bin;
  if (h.level == 0) {
    bin = (unsigned)(key >> 48);
  } else {
    const unsigned long long p = key >> h.pshift;
    int g = -1;
#pragma unroll
    for (int i = 0; i < SEL_NS; ++i)
      if (i < h.ng && p == h.gp[i]) g = i;
    if (g < 0) return;
    bin = (unsigned)g * 4096u + (unsigned)((key >> h.shift) & 4095u);
  }
  if (h.run && bin == h.last_bin) {
    ++h.run;
  } else {
    hist_flush_run(h);
    h.last_bin = bin;
    h.run = 1;
  }
}

__device__ void hist_begin(HistCtx &h, unsigned *sm, int level, const SelState *st) {
  h.sm = sm;
  h.level = level;
  h.shift = level >= 0 ? sel_shift(level) : 0;
  h.pshift = level >= 0 ? sel_pshift(level) : 0;
  h.ng = 0;
  h.run = 0;
  h.last_bin = 0;
  if (level > 0) {
    h.ng = st->ng;
    for (int i = 0; i < SEL_NS; ++i) h.gp[i] = i < h.ng ? st->gprefix[i] : KEY_NONE;
  }
  h.nbins = level == 0 ? SEL_BINS : h.ng * 4096; /* only the groups' bins */
  if (level >= 0) {
    for (int i = threadIdx.x; i < h.nbins; i += blockDim.x) sm[i] = 0;
  }
  __syncthreads();
}

/* Flush block counters to the level's global histogram. */
__device__ void hist_end(HistCtx &h, unsigned long long *gh) {
  if (h.level < 0) return;
  hist_flush_run(h);
  __syncthreads();
  for (int i = threadIdx.x; i < h.nbins; i += blockDim.x) {
    unsigned c = h.sm[i];
    if (c) atomicAdd(gh + i, (unsigned long long)c);
  }
}

/* ---- the last block's scan: move every rank one level down -------------- */

/* The sample passes' rank of slot s (window s/2's low end when s is even, its
 * high end when odd) among the sample's ns finite keys: the CPU engine's
 * margin (csrc/cpu_select.inc, vgct_cpu_presel_new) with wz sigmas. */
template <class AT> /* KArgs, BArgs or CBArgs */
__device__ long long sel_sample_rank(const AT &A, int s, unsigned long long ns) {
  if (ns == 0) return 0; /* no finite key in the sample: the scan marks it bad */
  const double n = (double)ns, ph = A.wph[s];
  const double at = ph * (n - 1.0);
  const double mg = A.wz * sqrt(n * ph * (1.0 - ph)) + 16.0 + n / 2048.0;
  double x = (s & 1) ? ceil(at + 1.0 + mg) : floor(at - mg);
  x += (double)A.wshift;
  if (!(x >= 0.0)) x = 0.0;
  if (x > n - 1.0) x = n - 1.0;
  return (long long)x;
}

/* vg_sel_scan: the last block of a histogram pass (ST threads, NW = 32
 * warps) finds, for every slot s, the bin of its group's histogram holding
 * its rank, and moves the slot one level down (prefix, rank in the bin, the
 * bin's count).  Warp w owns a run of nb/NW bins of each group, read as
 * `per` rounds of 32 consecutive bins (one coalesced load a round):
 *   1. warp w sums each of its rounds (butterfly shuffles, the rounds
 *      independent of each other) into a round table in `scratch` (the
 *      kernel's shared histogram, free once flushed) and its run's total;
 *   2. one warp a group scans the NW run totals (exclusive);
 *   3. the one warp whose run holds a slot's rank finds the round (a scan
 *      of the round table and a ballot), then the bin (one load, a scan and
 *      a ballot).
 * Trade-off against the first form (a thread per run of 32 consecutive bins,
 * one pass of the block per slot): two barriers for all slots instead of
 * three per slot, and 8 sectors per warp load instead of 32 (ncu, 2^10 bf16
 * p99 on an H200: that scan held the level-0 kernel at 46 us, 75% of its
 * sectors excessive). */
template <class AT> /* KArgs or BArgs */
__device__ void vg_sel_scan(const AT &A, int level, unsigned long long *scratch) {
  static_assert(ST == 1024, "vg_sel_scan: one warp per 1/32 of the bins");
  constexpr int NW = ST / 32;
  static_assert(NW * (SEL_BINS / ST) * 8 <= SEL_SMEM && SEL_NS * NW * (4096 / ST) * 8 <= SEL_SMEM,
                "round table in the shared histogram");
  SelState *st = A.st;
  const int nb = level == 0 ? SEL_BINS : 4096, bits = sel_bits(level);
  const int wb = nb / NW, per = wb / 32; /* bins per warp's run; rounds (<= 32) */
  const int ngrp = level == 0 ? 1 : st->ng;
  __shared__ unsigned long long s_wsum[SEL_NS][NW], s_wex[SEL_NS][NW], s_tot[SEL_NS];
  __shared__ int s_bin[SEL_NS];
  __shared__ unsigned long long s_below[SEL_NS], s_cnt[SEL_NS];
  __shared__ long long s_rank[SEL_NS];
  __shared__ unsigned long long s_pref[SEL_NS];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  /* 1. warp w's rounds of each group: bins w*wb + 32 j + lane, j < per */
  for (int g = 0; g < ngrp; ++g) {
    const unsigned long long *h = A.hist + (size_t)g * nb + (size_t)w * wb;
    unsigned long long *rt = scratch + ((size_t)g * NW + w) * per;
    unsigned long long sum = 0;
#pragma unroll 8
    for (int j = 0; j < per; ++j) {
      unsigned long long t = __ldcg(h + 32 * j + lane);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
      if (lane == 0) rt[j] = t;
      sum += t;
    }
    if (lane == 0) s_wsum[g][w] = sum;
  }
  if (threadIdx.x < SEL_NS) s_bin[threadIdx.x] = -1;
  __syncthreads();
  /* 2. warp g: the exclusive scan of group g's NW run sums */
  if (w < ngrp) {
    const unsigned long long v = s_wsum[w][lane];
    unsigned long long iv = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(0xffffffffu, iv, o);
      if (lane >= o) iv += y;
    }
    s_wex[w][lane] = iv - v;
    if (lane == 31) s_tot[w] = iv;
  }
  __syncthreads();
  /* 3. each slot's rank, in the one warp whose run holds it */
  for (int s = 0; s < A.ns; ++s) {
    const int g = level == 0 ? 0 : st->slot_group[s];
    long long rank = level == 0 ? A.rank0[s] : st->rank[s];
    if (level == 0 && A.sample) rank = sel_sample_rank(A, s, s_tot[0]); /* same in every thread */
    if (threadIdx.x == 0) s_rank[s] = rank;
    const unsigned long long lo = s_wex[g][w], cnt = s_wsum[g][w];
    if (rank < 0 || (unsigned long long)rank < lo || (unsigned long long)rank >= lo + cnt) continue;
    const unsigned long long r = (unsigned long long)rank;
    /* the round: lane j holds round j's total */
    const unsigned long long t = lane < per ? scratch[((size_t)g * NW + w) * per + lane] : 0ull;
    unsigned long long it = t;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(0xffffffffu, it, o);
      if (lane >= o) it += y;
    }
    const int jr = __ffs(__ballot_sync(0xffffffffu, r < lo + it)) - 1; /* >= 0: r < lo + cnt */
    const unsigned long long c = lo + __shfl_sync(0xffffffffu, it - t, jr);
    /* the bin inside round jr */
    const unsigned long long hb = __ldcg(A.hist + (size_t)g * nb + (size_t)w * wb + 32 * jr + lane);
    unsigned long long inc = hb;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    const int fl = __ffs(__ballot_sync(0xffffffffu, r < c + inc)) - 1;
    if (lane == fl) {
      s_bin[s] = w * wb + 32 * jr + fl;
      s_below[s] = c + inc - hb;
      s_cnt[s] = hb;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (level == 0) st->total = s_tot[0];
    int ng = 0;
    unsigned long long *n_prefix = s_pref;
    for (int s = 0; s < A.ns; ++s) {
      if (level == 0 && A.sample) st->srank[s] = s_rank[s];
      const unsigned long long old = level == 0 ? 0ull : st->prefix[s];
      if (s_bin[s] < 0) {
        st->bad = 1;
        n_prefix[s] = old << bits;
        st->rank[s] = 0;
        st->count[s] = 0;
      } else {
        n_prefix[s] = (old << bits) | (unsigned long long)s_bin[s];
        st->rank[s] = s_rank[s] - (long long)s_below[s];
        st->count[s] = s_cnt[s];
      }
    }
    for (int s = 0; s < A.ns; ++s) {
      int g = -1;
      for (int i = 0; i < ng; ++i)
        if (st->gprefix[i] == n_prefix[s]) g = i;
      if (g < 0) {
        g = ng++;
        st->gprefix[g] = n_prefix[s];
      }
      st->slot_group[s] = g;
      st->prefix[s] = n_prefix[s];
    }
    st->ng = ng;
    *A.counter = 0;
  }
}

/* ---- kernels -------------------------------------------------------------- */

__device__ __forceinline__ bool sel_wanted(int cshift, int cng, const unsigned long long *cgp,
                                           unsigned long long lo, unsigned long long hi,
                                           unsigned long long key) {
  if (key >> 63) return false;
  const unsigned long long p = key >> cshift;
  if (p < lo || p > hi) return false; /* outside every wanted bucket: most keys */
  bool hit = false;
#pragma unroll
  for (int i = 0; i < SEL_NS; ++i) hit |= (i < cng && p == cgp[i]);
  return hit;
}

__device__ __forceinline__ void sel_append(const KArgs &A, SelState *st, unsigned long long key) {
  cg::coalesced_group g = cg::coalesced_threads();
  unsigned long long base = 0;
  if (g.thread_rank() == 0) base = atomicAdd(&st->ncand, (unsigned long long)g.size());
  base = g.shfl(base, 0);
  const unsigned long long pos = base + g.thread_rank();
  if (pos < SEL_CAP) A.cand[pos] = key;
}

/* What a data pass does with each key (a template parameter, so that the
 * per-key work is only the pass's own): SEL_HIST the level's histogram,
 * SEL_HIST_STORE that and every key stored at its position (n <= SEL_CAP),
 * SEL_COMPACT the wanted keys appended to the candidate buffer. */
enum { SEL_HIST = 0, SEL_HIST_STORE = 1, SEL_COMPACT = 2 };

template <int DA, int DE, int MODE>
__global__ void __launch_bounds__(ST, 1) k_sel_data(const __grid_constant__ KArgs A) {
  typedef vg_chunk<DA, DE> G;
  extern __shared__ __align__(16) unsigned sel_sm[];
  const IterSpec &it = A.it;
  SelState *st = A.st;
  constexpr bool HIST = MODE == SEL_HIST || MODE == SEL_HIST_STORE;
  HistCtx h;
  hist_begin(h, sel_sm, HIST ? A.level : -1, st);
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const bool unit = G::TYPED && sai == 1 && sei == 1;
  int cng = 0;
  const int cshift = MODE == SEL_COMPACT ? sel_shift(A.clevel) : 0;
  unsigned long long cgp[SEL_NS];
#pragma unroll
  for (int i = 0; i < SEL_NS; ++i) cgp[i] = KEY_NONE;
  unsigned long long clo = KEY_NONE, chi = 0; /* the range of the wanted prefixes */
  if (MODE == SEL_COMPACT) {
    cng = st->ng;
#pragma unroll
    for (int i = 0; i < SEL_NS; ++i)
      if (i < cng) {
        cgp[i] = st->gprefix[i];
        clo = cgp[i] < clo ? cgp[i] : clo;
        chi = cgp[i] > chi ? cgp[i] : chi;
      }
  }
  /* RU chunks per iteration, all fetched before the first is keyed (more
     bytes in flight per thread; one for the pairs with 48-byte chunks, whose
     second would spill at the 64-register cap of 1024 threads) */
  constexpr int RU = G::NVA + G::NVE > 2 ? 1 : 2;
  const int64_t stride = (int64_t)gridDim.x * ST;
  for (int64_t c0 = (int64_t)blockIdx.x * ST + threadIdx.x; c0 < A.nchunk; c0 += RU * stride) {
    vg_raw_chunk<DA, DE> r[RU];
    int64_t pos0[RU];
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const int64_t c = c0 + u * stride;
      r[u].cnt = 0;
      r[u].v = false;
      pos0[u] = 0;
      if (c < A.nchunk) {
        const VgChunkPos cp = vg_chunk_pos<G::CH>(it, c, A.cpr, A.cprd, L, sai, sei);
        pos0[u] = cp.pos;
        vg_chunk_fetch<DA, DE>(r[u], it.pa + cp.oa * isa, it.pe + cp.oe * ise, unit, cp.cnt);
      }
    }
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      if (r[u].cnt == 0) continue;
      unsigned long long keys[G::CH];
      vg_chunk_keys_of<DA, DE>(it, r[u], sai, sei, isa, ise, keys);
#pragma unroll
      for (int q = 0; q < G::CH; ++q) {
        if (q < r[u].cnt) {
          const unsigned long long key = keys[q];
          if (HIST) hist_key(h, key);
          if (MODE == SEL_HIST_STORE) A.cand[pos0[u] + q] = key;
          if (MODE == SEL_COMPACT && sel_wanted(cshift, cng, cgp, clo, chi, key)) sel_append(A, st, key);
        }
      }
    }
  }
  if (HIST) {
    hist_end(h, A.hist);
    if (vg_last_block(A.counter))
      vg_sel_scan(A, A.level, reinterpret_cast<unsigned long long *>(sel_sm));
  }
}

__global__ void __launch_bounds__(ST, 1) k_sel_buf(const __grid_constant__ BArgs A) {
  extern __shared__ __align__(16) unsigned sel_sm[];
  SelState *st = A.st;
  if (A.level > 0 && st->fin) return; /* k_sel_fin answered every slot (same in every block) */
  if (st->skip) return;                /* the sample's levels not needed (win_early)          */
  HistCtx h;
  hist_begin(h, sel_sm, A.level, st);
  unsigned long long n = A.nbuf >= 0 ? (unsigned long long)A.nbuf : st->ncand;
  if (n > SEL_CAP) n = SEL_CAP;
  for (unsigned long long i = (unsigned long long)blockIdx.x * ST + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * ST)
    hist_key(h, __ldcg(A.cand + i));
  hist_end(h, A.hist);
  if (vg_last_block(A.counter))
      vg_sel_scan(A, A.level, reinterpret_cast<unsigned long long *>(sel_sm));
}

/* ---- the one-block finish ------------------------------------------------
 * After the level-0 pass every wanted slot knows its bucket (its group's
 * 15-bit prefix: a 1/16-octave bucket; after level 1, 27 bits: key >> 36,
 * FinArgs.pshift) and its rank inside it; the radix
 * levels below cost a launch and a last-block scan each (a one-block
 * k_sel_buf is ~7 us of serial scan, docs/performance.md), four of them
 * (three after level 1).
 * k_sel_fin instead reads the buffer once more and keeps, per group, the
 * smallest and largest key of the bucket, and appends the keys of the
 * "small" groups (buckets of at most FIN_CAP keys) to a region when they
 * hold at most FIN_CAP keys together; its last block then answers each slot:
 *   - a bucket whose smallest and largest keys are equal holds one value
 *     (ties: bf16 rounding noise puts tens of thousands of keys on one value):
 *     every rank in it is that key, whatever the bucket's size;
 *   - else, in a small group, a selection in the region (fin_select): the
 *     groups' buckets are disjoint key ranges, so small group g's keys would
 *     sit at [below(g), below(g) + count(g)) of the region sorted, below(g)
 *     the counts of the small groups with smaller prefixes, and rank r of
 *     the bucket is the region's order statistic at position below(g) + r;
 *   - else (a big bucket of several values) it cannot answer.
 * Only when every slot is answered does it write the keys (prefix[s]) and set
 * st->fin, and k_sel_buf's later levels then return at once; otherwise the
 * state is left as the level pass left it and the levels run as before.
 * The values are the same order statistics whichever way they are found
 * (exact: counts only; deterministic).
 * direct = 1: a one-block launch over a whole buffer of at most FIN_CAP keys
 * (a window's stored keys, all finite): the order statistics of its finite
 * keys at rank0[s] (a key with bit 63 set, a non-finite pair's, would sort
 * above every finite one and is not counted), st->total their count,
 * st->bad when a rank is not below it.
 * Trade-off: one extra read of the buffer (L2-resident) and a selection among
 * at most FIN_CAP keys by one block, instead of the later histogram levels
 * (~11 us each at 2^20 keys): it wins where the wanted buckets are one value
 * (ties: no selection) or small, and a bucket of several values and more
 * than FIN_CAP keys pays the extra read for nothing (docs/performance.md). */
struct FinArgs {
  int ns, direct;
  int pshift;                /* the level's bucket: key >> pshift (48 after level 0,
                                36 after level 1: sel_shift)                        */
  long long nbuf;            /* keys in the buffer                                   */
  long long rank0[SEL_NS];   /* direct: the ranks                                    */
  SelState *st;
  FinState *fs;
  const unsigned long long *cand;
  unsigned long long *reg;   /* FIN_CAP keys                                         */
  unsigned *counter;
};

/* One radix digit of a selection, by one warp (every lane calls it): v[j] =
 * the count of keys with digit value 8 lane + j among those under the
 * position's prefix *pfx (the 256 counts over the warp's lanes); the lane
 * whose values hold the remaining rank *rem appends that value to the prefix
 * at bit lo and leaves the rank inside it (exactly one lane: the counts sum
 * to the keys under the prefix, more than *rem).  Shared by fin_select (the
 * block's counts) and coop_select (the grid's). */
__device__ __forceinline__ void sel_digit_take(const unsigned *v, int lo, unsigned long long *pfx,
                                               long long *rem) {
  const int lane = (int)(threadIdx.x & 31);
  const unsigned long long r = (unsigned long long)*rem;
  unsigned sum = 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum += v[j];
  unsigned inc = sum; /* inclusive scan over the lanes */
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  unsigned below = inc - sum;
  __syncwarp(); /* every lane has read *rem before its owner rewrites it */
  if (r >= below && r < inc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (r < below + v[j]) {
        *pfx |= (unsigned long long)(8 * lane + j) << lo;
        *rem = (long long)(r - below);
        break;
      }
      below += v[j];
    }
  }
}

/* coop_select's positions of one radix pass whose prefixes agree above its
 * digit count the same keys -- a quantile's two ranks are adjacent, and
 * share their prefix up to the pass whose digit tells them apart (most
 * often the last, or none: one key value) -- so only the first of them
 * counts the keys, and the others take their digit from its counts
 * (ncu, 2026-12-04: k_sel_coop's first pass, where every key is under the
 * prefix, spent ~half its stall samples waiting for __match_any_sync,
 * issued once per key and position).  sel_owners, by one warp (every lane
 * calls it; lane p for position p, its prefix against the earlier
 * positions'): *own, bit p set when p < np is the first position with its
 * prefix; row[p] for p < np: that first position (pfx: the prefixes at the
 * pass's start, in shared memory, as own and row).  One warp decides it a
 * pass and the block reads it after a barrier: every thread deciding it
 * from its own registers (8 x 8 unrolled 64-bit compares) was 14% of
 * k_sel_coop's instructions at 2^20 bf16 pairs (ncu, docs/performance.md,
 * 2026-12-04 16:25 UTC).  (The same in fin_select measured slower on
 * k_sel_tiny's calls -- one block, plain shared atomics: not taken there.) */
__device__ __forceinline__ void sel_owners(const unsigned long long *pfx, int np,
                                           unsigned long long above, int *row, unsigned *own) {
  const int lane = (int)(threadIdx.x & 31);
  int r = lane;
  if (lane < np) {
    const unsigned long long mine = pfx[lane];
    for (int q = lane - 1; q >= 0; --q)
      if (((pfx[q] ^ mine) & above) == 0ull) r = q;
    row[lane] = r;
  }
  const unsigned ob = __ballot_sync(0xffffffffu, lane < np && r == lane);
  if (lane == 0) *own = ob;
}

/* The order statistics of c keys by the block (every thread calls it, after
 * writing its keys): out[p] = the key at position pos[p] (0-based; every
 * pos[p] < c) of their ascending order, for p < np (1 <= np <= SEL_NS, c <=
 * TINY_CAP: what a caller holds in shared memory); the keys at s[0 .. c) are
 * only read.  A most-significant-
 * digit radix selection, every position at once:
 *   - the block's AND and OR of the keys: the bits above the highest bit in
 *     which two keys differ, and those below the lowest, are every key's (a
 *     wanted bucket's keys share at least their level's prefix, so the passes
 *     start below it; keys from bf16 or fp16 data have their low mantissa
 *     bits all zero, so the passes stop above them; one value: every
 *     position is that key, no pass);
 *   - then 8-bit digits from the highest such bit down to the lowest (the
 *     last may be narrower): position p's keys -- those whose bits above the digit equal
 *     its prefix so far -- counted per digit value in a shared-memory
 *     histogram (one per position), and warp p's scan of those 256 counts
 *     finds the digit value whose keys hold its remaining rank, appends it to
 *     the prefix and subtracts the keys below it.
 * After the last digit the prefix is the key itself: exact, whatever the
 * order the atomics ran in (counts only), hence deterministic.  Cost: a read
 * of the c keys and np compares each per pass, one pass per 8 bits of the
 * span in which the keys differ (at most 8, for a region of several groups;
 * one bucket after level 0: at most 6, and 1-3 for keys from bf16, fp16 or
 * fp32 data), no sort.  Trade-off against the bitonic sort
 * this replaced (docs/performance.md, 2026-12-04): it answers np positions,
 * not every one, and a digit value shared by most keys makes its counter
 * contend -- a pass's adds to one address are serialised, up to np * c of
 * them in a pass where every position's keys share one digit value (ties
 * with a few other values), still cheaper than the sort's 91 network stages
 * over every key at c = FIN_CAP in the measured shapes. */
__device__ void fin_select(const unsigned long long *s, int c, const long long *pos, int np,
                           unsigned long long *out) {
  __shared__ unsigned s_hist[SEL_NS][256];
  __shared__ unsigned long long s_and, s_or, s_pfx[SEL_NS];
  __shared__ long long s_rem[SEL_NS];
  const int t = (int)threadIdx.x, lane = t & 31, w = t >> 5;
  if (t == 0) {
    s_and = ~0ull;
    s_or = 0ull;
  }
  __syncthreads(); /* (also: the keys written by every thread) */
  unsigned long long ka = ~0ull, ko = 0ull;
  for (int i = t; i < c; i += ST) {
    const unsigned long long k = s[i];
    ka &= k;
    ko |= k;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ka &= __shfl_xor_sync(0xffffffffu, ka, o);
    ko |= __shfl_xor_sync(0xffffffffu, ko, o);
  }
  if (lane == 0) {
    atomicAnd(&s_and, ka);
    atomicOr(&s_or, ko);
  }
  __syncthreads();
  const unsigned long long diff = s_and ^ s_or; /* the bits in which some keys differ */
  int hi = diff ? 63 - __clzll((long long)diff) : -1; /* the highest of them */
  const int lowb = diff ? __ffsll((long long)diff) - 1 : 0; /* the lowest of them */
  if (t < np) {
    /* the bits above hi and below lowb are every key's: the prefix starts as
       them, bits [lowb, hi] cleared (one value, hi == -1: the key itself) */
    const unsigned long long span =
        diff ? ((hi < 63 ? (2ull << hi) : 0ull) - (1ull << lowb)) : 0ull;
    s_pfx[t] = s_and & ~span;
    s_rem[t] = pos[t];
  }
  for (; hi >= lowb; hi -= 8) {
    const int lo = hi - 7 > lowb ? hi - 7 : lowb;
    const unsigned dmask = (2u << (hi - lo)) - 1u; /* the digit's hi - lo + 1 bits */
    const unsigned long long above = hi < 63 ? ~0ull << (hi + 1) : 0ull;
    __syncthreads(); /* the previous pass's scans done (and its prefixes written) */
    for (int i = t; i < np * 256; i += ST) (&s_hist[0][0])[i] = 0u;
    /* the prefixes in registers for the pass: read from shared memory inside the
       loop, each key's compare reloaded them after every shared add (which may
       alias them) -- 18-27% of k_sel_tiny's instructions, 10-17% of its time
       (ncu at base clocks, 8192 and 12288 pairs; docs/performance.md,
       2026-12-04 16:25 UTC) */
    unsigned long long pf[SEL_NS];
#pragma unroll
    for (int p = 0; p < SEL_NS; ++p) pf[p] = p < np ? s_pfx[p] : 0ull;
    __syncthreads();
    for (int i = t; i < c; i += ST) {
      const unsigned long long k = s[i];
      const unsigned dg = (unsigned)(k >> lo) & dmask;
#pragma unroll
      for (int p = 0; p < SEL_NS; ++p) {
        if (p >= np) break;
        if (((k ^ pf[p]) & above) == 0ull) atomicAdd(&s_hist[p][dg], 1u);
      }
    }
    __syncthreads();
    if (w < np) { /* warp w: position w's digit; lane l holds values 8 l .. 8 l + 7 */
      unsigned v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = s_hist[w][8 * lane + j];
      sel_digit_take(v, lo, &s_pfx[w], &s_rem[w]);
    }
  }
  __syncthreads();
  if (t < np) out[t] = s_pfx[t];
  __syncthreads();
}

/* the bucket count of group g (the count of any of its slots) */
__device__ __forceinline__ unsigned long long fin_count(const SelState *st, int ns, int g) {
  for (int s = 0; s < ns; ++s)
    if (st->slot_group[s] == g) return st->count[s];
  return 0ull;
}

__global__ void __launch_bounds__(ST, 1) k_sel_fin(const __grid_constant__ FinArgs A) {
  extern __shared__ __align__(16) unsigned long long fin_sm[];
  __shared__ unsigned long long s_gp[SEL_NS], s_minc[SEL_NS], s_max[SEL_NS];
  __shared__ bool s_small[SEL_NS];
  SelState *st = A.st;
  if (A.direct) { /* one block */
    const long long c = A.nbuf;
    if (c > FIN_CAP) { /* not reached: the host launches it for at most FIN_CAP keys */
      if (threadIdx.x == 0) st->bad = 1;
      return;
    }
    /* the keys, and how many are a finite pair's (a window's stored keys
       are all finite; one with bit 63 set would sort above them all) */
    __shared__ unsigned long long s_out[SEL_NS];
    __shared__ unsigned s_nf;
    if (threadIdx.x == 0) s_nf = 0u;
    __syncthreads();
    unsigned nf = 0u;
    for (int i = threadIdx.x; i < c; i += ST) {
      const unsigned long long k = __ldcg(A.cand + i);
      fin_sm[i] = k;
      nf += (unsigned)!(k >> 63);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) nf += __shfl_xor_sync(0xffffffffu, nf, o);
    if ((threadIdx.x & 31) == 0 && nf) atomicAdd(&s_nf, nf);
    __syncthreads();
    const long long cf = (long long)s_nf; /* the same in every thread */
    bool ok = cf > 0 && A.ns >= 1 && A.ns <= SEL_NS;
    for (int s = 0; s < A.ns && s < SEL_NS; ++s) ok = ok && A.rank0[s] >= 0 && A.rank0[s] < cf;
    if (!ok) { /* the host's ranks are below its finite count: an input changed */
      if (threadIdx.x == 0) {
        st->total = (unsigned long long)cf;
        st->bad = 1;
      }
      return;
    }
    fin_select(fin_sm, (int)c, A.rank0, A.ns, s_out);
    if (threadIdx.x == 0) { /* every field the host reads, either way */
      st->total = (unsigned long long)cf;
      for (int s = 0; s < A.ns; ++s) {
        st->prefix[s] = s_out[s];
        st->rank[s] = 0;
      }
      st->fin_ties = 0;
      st->fin_selected = A.ns;
      st->bad = 0;
      st->fin = 1;
    }
    return;
  }
  if (st->bad || st->fin || st->skip) return; /* written before: the same in every block */
  const int ng = st->ng;
  unsigned long long tot = 0; /* keys of the small groups' buckets */
  for (int g = 0; g < ng; ++g) {
    const unsigned long long c = fin_count(st, A.ns, g);
    if (c <= FIN_CAP) tot += c;
  }
  const bool store = tot <= FIN_CAP;
  if (threadIdx.x < SEL_NS) {
    const int g = (int)threadIdx.x;
    s_gp[g] = g < ng ? st->gprefix[g] : KEY_NONE;
    s_small[g] = g < ng && store && fin_count(st, A.ns, g) <= FIN_CAP;
    s_minc[g] = 0ull;
    s_max[g] = 0ull;
  }
  __syncthreads();
  unsigned long long mn[SEL_NS], mx[SEL_NS];
#pragma unroll
  for (int q = 0; q < SEL_NS; ++q) {
    mn[q] = KEY_NONE;
    mx[q] = 0ull;
  }
  const unsigned long long n = (unsigned long long)A.nbuf;
  for (unsigned long long i = (unsigned long long)blockIdx.x * ST + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * ST) {
    const unsigned long long key = __ldcg(A.cand + i);
    if (key >> 63) continue; /* KEY_NONE: not a finite pair */
    const unsigned long long p = key >> A.pshift; /* the level's bucket */
    int g = -1;
    for (int q = 0; q < ng; ++q)
      if (p == s_gp[q]) g = q;
    if (g < 0) continue;
#pragma unroll
    for (int q = 0; q < SEL_NS; ++q)
      if (q == g) {
        mn[q] = key < mn[q] ? key : mn[q];
        mx[q] = key > mx[q] ? key : mx[q];
      }
    if (s_small[g]) {
      cg::coalesced_group cgp = cg::coalesced_threads();
      unsigned long long base = 0;
      if (cgp.thread_rank() == 0) base = atomicAdd(&A.fs->nfin, (unsigned long long)cgp.size());
      base = cgp.shfl(base, 0);
      const unsigned long long pos = base + cgp.thread_rank();
      if (pos < FIN_CAP) A.reg[pos] = key;
    }
  }
  /* the groups' extremes: warp shuffles, the block's in shared memory, one
     atomic per block and group (~min as a max: the zeroed scratch is the identity) */
  for (int q = 0; q < ng; ++q) { /* ng: the same in every thread */
    unsigned long long a = 0ull, b = 0ull;
#pragma unroll
    for (int u = 0; u < SEL_NS; ++u)
      if (u == q) {
        a = ~mn[u];
        b = mx[u];
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long ya = __shfl_xor_sync(0xffffffffu, a, o);
      const unsigned long long yb = __shfl_xor_sync(0xffffffffu, b, o);
      a = ya > a ? ya : a;
      b = yb > b ? yb : b;
    }
    if ((threadIdx.x & 31) == 0) {
      atomicMax(&s_minc[q], a);
      atomicMax(&s_max[q], b);
    }
  }
  __syncthreads();
  if ((int)threadIdx.x < ng) {
    atomicMax(&A.fs->minc[threadIdx.x], s_minc[threadIdx.x]);
    atomicMax(&A.fs->max[threadIdx.x], s_max[threadIdx.x]);
  }
  if (!vg_last_block(A.counter)) return;
  /* the last block: every other block's atomics and appends are visible (vg_last_block) */
  __shared__ unsigned long long s_key[SEL_NS];
  __shared__ bool s_tie[SEL_NS];
  __shared__ int s_need, s_ok;
  if (threadIdx.x == 0) {
    *A.counter = 0;
    const unsigned long long nfin = __ldcg(&A.fs->nfin);
    int need = 0, ok = 1;
    for (int s = 0; s < A.ns; ++s) {
      const int g = st->slot_group[s];
      const unsigned long long lo = ~__ldcg(&A.fs->minc[g]), hi = __ldcg(&A.fs->max[g]);
      s_tie[s] = lo == hi;
      if (lo == hi) {
        s_key[s] = lo;
        continue;
      }
      need = 1;
      /* a small group, and the region holds every key of the small groups */
      if (!s_small[g] || nfin != tot) {
        ok = 0;
        continue;
      }
      unsigned long long below = 0;
      for (int q = 0; q < ng; ++q)
        if (s_small[q] && st->gprefix[q] < st->gprefix[g]) below += fin_count(st, A.ns, q);
      s_key[s] = below + (unsigned long long)st->rank[s]; /* a position: fin_select below */
    }
    s_need = need;
    s_ok = ok;
    /* the scratch back to zero for the next finish of this call (the region's,
       after the sample's): only this thread reads it, and every other block's
       atomics are done */
    for (int g = 0; g < SEL_NS; ++g) A.fs->minc[g] = A.fs->max[g] = 0ull;
    A.fs->nfin = 0ull;
  }
  __syncthreads();
  if (!s_ok) return; /* not every slot answered: the levels run (state unchanged) */
  if (s_need) { /* the region's keys at the other slots' positions */
    __shared__ long long s_pos[SEL_NS];
    __shared__ int s_slot[SEL_NS], s_np;
    __shared__ unsigned long long s_out[SEL_NS];
    if (threadIdx.x == 0) {
      int np = 0;
      for (int s = 0; s < A.ns; ++s)
        if (!s_tie[s]) {
          s_slot[np] = s;
          s_pos[np++] = (long long)s_key[s];
        }
      s_np = np;
    }
    const int c = (int)tot; /* <= FIN_CAP: s_ok */
    for (int i = threadIdx.x; i < c; i += ST) fin_sm[i] = __ldcg(A.reg + i);
    __syncthreads(); /* s_np, s_pos (fin_select's own first barrier follows the keys) */
    fin_select(fin_sm, c, s_pos, s_np, s_out);
    if (threadIdx.x == 0)
      for (int q = 0; q < s_np; ++q) s_key[s_slot[q]] = s_out[q];
  }
  if (threadIdx.x == 0) {
    int nt = 0;
    for (int s = 0; s < A.ns; ++s) {
      st->prefix[s] = s_key[s];
      nt += s_tie[s];
    }
    st->fin_ties = nt;
    st->fin_selected = A.ns - nt;
    st->fin = 1;
  }
}

/* ---- a small call's selection, chained behind the reduction ---------------
 * k_sel_tiny: a call of at most TINY_CAP pairs with quantiles, one block
 * queued on the stream right behind the reduction's launch (VgChain,
 * vg_reduce_run), so that the host waits once for both -- no round trip
 * between the record and the selection, no launch after it (the previous
 * form waited for the record, then launched a store-only data pass, a direct
 * k_sel_fin and the state's copy, and synchronised again).  What it does:
 *   1. the reduction's record (its copy in the workspace: VgChain) into
 *      shared memory; from its n_finite every quantile's
 *      two ranks (vgct_quantile_ranks: the host's function, the same float64
 *      operations), less the ranks the record decides (vgct_rank_known;
 *      TArgs.known 0: none, the tests' hook) and the duplicates, in the
 *      order asked;
 *   2. none left (an identical pair, sparse differences, n_finite 0): done,
 *      the inputs not read;
 *   3. else every pair's key into shared memory at its iteration position
 *      (vg_chunk_pos, vg_chunk_keys: the data passes' own), a non-finite
 *      pair's with bit 63 set, above every finite key; the finite keys
 *      counted -- another count than the record's n_finite means an input
 *      was written meanwhile (`changed`: the host's error, nothing selected);
 *   4. the ranks SEL_NS at a time by fin_select among the m keys (a rank r <
 *      n_finite is the r-th finite key).
 * Its answers (TinyOut) go to the mapped pinned buffer, then its completion
 * word (after a system-scope fence), so the host reads them after its one
 * wait; the host takes the ranks again from the record it read and each
 * one's key from TinyOut (vgct_cuda_compare).  Exact and deterministic:
 * counts only (fin_select).  Trade-off: one block whatever m (TINY_CAP keys
 * in 128 KiB of shared memory, 16 pairs a thread at most; fin_select's
 * passes each read every key, and ties contend on a few shared counters);
 * and a call whose
 * record answers every rank still pays the launch and a one-block kernel
 * that reads the record and exits (~2-3 us; before, no selection ran at all
 * then).  Measured: docs/performance.md. */
struct TinyOut {
  unsigned long long total; /* finite keys counted (when the pairs were keyed)  */
  int nr;                   /* ranks answered: rank[0 .. nr), key[0 .. nr)       */
  int changed;              /* 1: total != the record's n_finite (nothing selected) */
  int batches;              /* fin_select calls (the tests' hook)                 */
  int keyed;                /* the pairs were keyed (some rank was left)          */
  int bad;                  /* m > TINY_CAP (k_sel_coop: a block's keys past its
                               shared memory): not launched so by the host (internal) */
  int passes;               /* k_sel_coop: its radix passes (grid barriers), all batches */
  int grid;                 /* k_sel_coop: its blocks (k_sel_tiny: 1)                  */
  int pad_;
  long long rank[2 * VGCT_MAX_QUANTILES];
  unsigned long long key[2 * VGCT_MAX_QUANTILES];
};

struct TArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int nq;
  int known; /* drop the ranks the record decides (vgct_cuda_test_known == 0) */
  int plant; /* test hook vgct_cuda_test_tiny_plant: 1 counts one finite key less */
  double q[VGCT_MAX_QUANTILES];
  const vgct_acc *rec; /* the reduction's record (in the workspace: VgChain)   */
  TinyOut *out;        /* device address of h_pin + VG_PIN_TINY                */
  unsigned *done;      /* the completion word (device address), or NULL, and   */
  unsigned seq;        /* the value to write there last                        */
};

/* The chained selections' keying loop (k_sel_tiny, k_sel_coop): for the
 * chunks c = c0, c0 + step, ... below c1 of A's iteration, f(c, cp, keys)
 * with the chunk's position (vg_chunk_pos) and its G::CH keys
 * (vg_chunk_keys: the data passes' own loaders and keys; past cp.cnt not a
 * pair's). */
template <int DA, int DE, class F>
__device__ __forceinline__ void sel_key_chunks(const TArgs &A, int64_t c0, int64_t c1, int64_t step,
                                               F &&f) {
  typedef vg_chunk<DA, DE> G;
  const IterSpec &it = A.it;
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const bool unit = G::TYPED && sai == 1 && sei == 1;
  for (int64_t c = c0; c < c1; c += step) {
    const VgChunkPos cp = vg_chunk_pos<G::CH>(it, c, A.cpr, A.cprd, L, sai, sei);
    unsigned long long keys[G::CH];
    vg_chunk_keys<DA, DE>(it, it.pa + cp.oa * isa, it.pe + cp.oe * ise, sai, sei, isa, ise, unit,
                          cp.cnt, keys);
    f(c, cp, keys);
  }
}

/* The ranks a chained selection answers (k_sel_tiny, k_sel_coop; every
 * thread of the block calls it, ST threads): the reduction's record copied
 * into s_rec (8-byte volatile loads of its copy in the workspace), from
 * its n_finite (*nf) each quantile's two ranks by the host's own function
 * (vgct_quantile_ranks, csrc/vgct_stats.h: the same float64 operations),
 * less the ranks the record decides (vgct_rank_known, when
 * A.known) and the repeats, in the order asked, into s_r[0 .. nr) -- written
 * by their threads, read after the caller's next barrier.  Returns nr, the
 * same in every thread (0 when n_finite is 0). */
__device__ int chain_ranks(const TArgs &A, vgct_acc &s_rec, long long *s_all, long long *s_r,
                           int *s_wcnt, int64_t *nf_out) {
  const int t = (int)threadIdx.x, lane = t & 31, w = t >> 5;
  for (int i = t; i < (int)(sizeof(vgct_acc) / 8); i += ST)
    reinterpret_cast<unsigned long long *>(&s_rec)[i] =
        reinterpret_cast<const volatile unsigned long long *>(A.rec)[i];
  __syncthreads();
  const int64_t nf = s_rec.n_finite;
  *nf_out = nf;
  const int R = 2 * A.nq;
  if (t < R && nf > 0) {
    int64_t lo, hi;
    double g;
    vgct_quantile_ranks(nf, A.q[t >> 1], &lo, &hi, &g);
    s_all[t] = (t & 1) ? hi : lo;
  }
  __syncthreads();
  bool keep = false;
  if (t < R && nf > 0) {
    const long long r = s_all[t];
    double x;
    keep = !(A.known && vgct_rank_known(&s_rec, r, &x));
    for (int j = 0; j < t && keep; ++j) keep = s_all[j] != r; /* its first occurrence */
  }
  const unsigned bk = __ballot_sync(0xffffffffu, keep);
  if (lane == 0 && w < 4) s_wcnt[w] = __popc(bk);
  __syncthreads();
  if (keep) {
    int base = 0;
    for (int i = 0; i < w; ++i) base += s_wcnt[i];
    s_r[base + __popc(bk & ((1u << lane) - 1u))] = s_all[t];
  }
  return s_wcnt[0] + s_wcnt[1] + s_wcnt[2] + s_wcnt[3];
}

/* A chained selection's answers (k_sel_tiny, k_sel_coop; one thread): TinyOut
 * (A.out, in the mapped pinned buffer), then the completion word after a
 * system-scope fence (CallCtx::wait_signal: the answers are there when the
 * host sees the word). */
__device__ void chain_answer(const TArgs &A, unsigned long long total, int nr, int changed, int bad,
                             int batches, int keyed, int passes) {
  TinyOut *out = A.out;
  out->total = total;
  out->nr = changed ? 0 : nr;
  out->changed = changed;
  out->bad = bad;
  out->batches = batches;
  out->keyed = keyed;
  out->passes = passes;
  out->grid = (int)gridDim.x;
  if (A.done) {
    __threadfence_system();
    *reinterpret_cast<volatile unsigned *>(A.done) = A.seq;
  }
}

template <int DA, int DE>
__global__ void __launch_bounds__(ST, 1) k_sel_tiny(const __grid_constant__ TArgs A) {
  typedef vg_chunk<DA, DE> G;
  static_assert(2 * VGCT_MAX_QUANTILES <= 4 * 32, "the ranks: four warps' ballots");
  static_assert(sizeof(vgct_acc) % 8 == 0, "the record read as 8-byte words");
  extern __shared__ __align__(16) unsigned long long tiny_sm[]; /* m <= TINY_CAP keys */
  __shared__ vgct_acc s_rec;
  __shared__ long long s_all[2 * VGCT_MAX_QUANTILES], s_r[2 * VGCT_MAX_QUANTILES];
  __shared__ unsigned long long s_out[SEL_NS];
  __shared__ int s_wcnt[4];
  __shared__ unsigned s_nf;
  const int t = (int)threadIdx.x, lane = t & 31;
  TinyOut *out = A.out;
  /* 1. the record, the ranks */
  if (t == 0) s_nf = 0u;
  int64_t nf;
  const int nr = chain_ranks(A, s_rec, s_all, s_r, s_wcnt, &nf);
  int changed = 0, batches = 0;
  unsigned long long total = 0;
  const int64_t m = A.it.m;
  if (nr > 0 && m <= TINY_CAP) { /* (m <= TINY_CAP: the host's condition) */
    /* 3. every pair's key at its position, the finite ones counted */
    unsigned fc = 0u;
    sel_key_chunks<DA, DE>(A, t, A.nchunk, ST,
                           [&](int64_t, const VgChunkPos &cp, const unsigned long long *keys) {
#pragma unroll
                             for (int q = 0; q < G::CH; ++q)
                               if (q < cp.cnt) {
                                 tiny_sm[cp.pos + q] = keys[q];
                                 fc += (unsigned)!(keys[q] >> 63);
                               }
                           });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fc += __shfl_xor_sync(0xffffffffu, fc, o);
    if (lane == 0 && fc) atomicAdd(&s_nf, fc);
    __syncthreads();
    total = s_nf - (A.plant == 1 ? 1u : 0u); /* (a planted fault: an input changed) */
    changed = total != (unsigned long long)nf;
    /* 4. the ranks, SEL_NS at a time (fin_select's first barrier: the keys and s_r written) */
    if (!changed)
      for (int b = 0; b < nr; b += SEL_NS) {
        const int np = nr - b < SEL_NS ? nr - b : SEL_NS;
        fin_select(tiny_sm, (int)m, s_r + b, np, s_out);
        if (t == 0)
          for (int k = 0; k < np; ++k) {
            out->rank[b + k] = s_r[b + k];
            out->key[b + k] = s_out[k];
          }
        ++batches;
      }
  }
  if (t == 0) chain_answer(A, total, nr, changed, nr > 0 && m > TINY_CAP, batches, nr > 0, 0);
}

/* ---- a mid-size call's selection: one cooperative launch ------------------
 * k_sel_coop: k_sel_tiny's plan for calls past TINY_PREFER pairs, up to
 * SEL_CAP and at most sms x COOP_KEYS keys (one block per SM), chained
 * behind the reduction the same way (VgChain; the answers in TinyOut, one
 * host wait) -- before it,
 * such a call waited for the record, launched the store-all data pass (the
 * level-0 histogram over 32768 shared counters a block, every key stored)
 * and k_sel_fin, and waited again.  A cooperative launch (every block
 * resident at once: cudaLaunchCooperativeKernel; cooperative_groups' grid
 * barrier, CUDA C++ Programming Guide, "Grid Synchronization"), each block
 * holding its own pairs' keys in shared memory for the whole selection:
 *   1. every block reads the record -- the reduction's copy in the
 *      workspace (VgChain: reading the mapped host buffer instead cost ~1.1
 *      us a block, +145 us a call on 132 blocks, measured 2026-12-04) -- and
 *      takes the ranks (chain_ranks, k_sel_tiny's): the same in every block;
 *   2'. none left (an identical pair, sparse differences, n_finite 0): no
 *      barrier, no key; the last block to arrive at the reduction's counter
 *      answers and sets it back to zero;
 *   2. else block b keys its chunks [b cpb, (b+1) cpb) into shared memory
 *      (a chunk's slots past its pairs, and a non-finite pair's key, have
 *      bit 63 set and take no part below), and writes the AND, the OR and
 *      the count of its finite keys to its slot; the grid zeroes the first
 *      batch's histograms; barrier;
 *   3. every block sums the slots: the finite count (another count than the
 *      record's n_finite: an input changed), and the bits above the highest
 *      and below the lowest in which two finite keys differ (every key's);
 *   4. the ranks SEL_NS at a time, by fin_select's radix selection spread
 *      over the grid (coop_select): per 8-bit digit, each block counts its
 *      keys under each rank's prefix in shared memory (a warp's equal
 *      digits added once: __match_any_sync, so ties do not contend; ranks
 *      whose prefixes agree counted once: sel_owners), adds the counts to
 *      the pass's global histogram, barrier, and every block
 *      reads the 256 totals and takes the same digit -- the same prefix in
 *      every block, without another round trip; after the last digit the
 *      prefix is the key.  In the last batch of ranks, each warp keeps only
 *      the keys still under a prefix for the next pass (in place, in the
 *      slots it has read: coop_select's compact).
 * When it selects, block 0 writes TinyOut and the completion word after a
 * barrier that follows every block's last read of the workspace and the
 * record (the others leave after the last pass's barrier without reading
 * its histogram); with nothing to select (2'), the last block to arrive at
 * the counter, after every block's read of the record.  Either way the next
 * call, on any stream, may reuse them once the host has read the word.
 * Exact and deterministic: counts only, the same answers as fin_select over
 * all the keys (the order statistics of the finite keys).  Trade-offs: a
 * grid barrier per 8 bits of the span in which
 * the finite keys differ (bf16 rounding noise: 3 passes at 2^16 pairs, 4 at
 * 2^20); and, as k_sel_tiny, a call whose record answers every rank still
 * pays the launch of a grid whose blocks read the record and leave: +5 us
 * over the call without quantiles at 2^16-2^20 on an H200 (the first form
 * keyed every pair and met twice first: +10-13 us; docs/performance.md,
 * 2026-12-04 13:35). */
#define COOP_KEYS 16384                  /* keys a block holds (128 KiB) */
#define COOP_SMEM (COOP_KEYS * 8)
#define COOP_STATIC 16384                /* its static shared memory, at most (checked) */
#define COOP_MIN_KEYS 2048               /* pairs a block at least: fewer blocks for fewer pairs */
#define COOP_MAX_GRID 1024
#define COOP_PASSES 8                    /* 8-bit digits of a span of at most 63 bits */
#define COOP_HIST_WORDS (COOP_PASSES * SEL_NS * 256) /* one batch's histograms (u32) */
#define WS_COOP_SLOT WS_SEL_HIST         /* COOP_MAX_GRID CoopSlot                 */
#define WS_COOP_HIST (WS_SEL_HIST + 32768u) /* a batch's COOP_HIST_WORDS, by batch  */
static_assert(COOP_MAX_GRID * 24 <= 32768, "k_sel_coop's slots below its histograms");
static_assert(WS_COOP_HIST + (size_t)(2 * VGCT_MAX_QUANTILES / SEL_NS) * COOP_HIST_WORDS * 4u <=
                  WS_SEL_CLEAR_END,
              "k_sel_coop's histograms inside the selection's histogram region");

struct CoopSlot {
  unsigned long long kand, kor, nf; /* a block's finite keys: AND, OR, count */
};

struct CArgs {
  TArgs t;           /* the chained call's (k_sel_tiny's): iteration, quantiles, record, out */
  int64_t cpb;       /* chunks a block (the last block may have fewer)              */
  CoopSlot *slot;    /* gridDim.x slots                                             */
  unsigned *arrive;  /* the reduction's last-block counter (WS_COUNTER: zero, and
                        left zero), for a call that selects nothing              */
  unsigned *hist;    /* batches x COOP_HIST_WORDS, zeroed by the kernel             */
};

/* fin_select spread over the grid (every thread of every block calls it with
 * the same span and positions): out[p] = the key at position pos[p] of the
 * grid's finite keys in ascending order, for p < np <= SEL_NS, each block
 * holding kc of the keys at s[0 .. kc) (bit 63 set: not a finite key, not
 * counted).  gand, gor: the AND and OR of every block's finite keys; gh:
 * COOP_HIST_WORDS zeroed words, a histogram per pass and position.  Only
 * block 0 (lead) reads the last pass's histogram and writes out; the others
 * return after its barrier.  Returns the passes (grid barriers) it made: one
 * per 8 bits of the span in which the keys differ, 0 for one value.
 * compact (the caller's last batch: the keys are not read again): from the
 * second pass on, each warp writes the keys still under some position's
 * prefix to the front of its own slots (COOP_SLOT: the slots it reads, in
 * the order it reads them), and the next pass reads only those.  A warp's
 * writes land in slots it has already read (a pass keeps at most the keys it
 * read), so the keys change in place.  Why: past the first passes few keys
 * are under a prefix, and each pass read them all (ncu, 2^20 float32 pairs,
 * six passes: the counting loop was ~60% of the kernel's instructions, two
 * thirds of its trips without a key under the prefix;
 * docs/performance.md, 2026-12-04 14:50 UTC). */
#define COOP_SLOT(j, w, lane) ((j) * ST + ((w) << 5) + (lane)) /* a warp's j-th trip's slot */
__device__ int coop_select(cg::grid_group &grid, unsigned long long *s, int kc,
                            unsigned long long gand, unsigned long long gor, const long long *pos,
                            int np, unsigned *gh, bool lead, unsigned long long *out,
                            bool compact) {
  __shared__ unsigned s_h[SEL_NS][256];
  __shared__ unsigned long long s_pfx[SEL_NS];
  __shared__ long long s_rem[SEL_NS];
  __shared__ int s_row[SEL_NS];
  __shared__ unsigned s_own;
  const int t = (int)threadIdx.x, lane = t & 31, w = t >> 5;
  const unsigned long long diff = gand ^ gor;
  int hi = diff ? 63 - __clzll((long long)diff) : -1;
  const int lowb = diff ? __ffsll((long long)diff) - 1 : 0;
  const int npass = diff ? (hi - lowb) / 8 + 1 : 0;
  __syncthreads(); /* the caller's reads of the previous batch's answers done */
  if (t < np) {
    const unsigned long long span =
        diff ? ((hi < 63 ? (2ull << hi) : 0ull) - (1ull << lowb)) : 0ull;
    s_pfx[t] = gand & ~span;
    s_rem[t] = pos[t];
  }
  const int kt = (kc + ST - 1) / ST; /* trips a warp over the whole slots */
  int len = -1; /* the warp's list of keys still under a prefix (from the second
                   pass on when compact; -1: every slot, i < kc) */
  for (int k = 0; k < npass; ++k, hi -= 8) {
    const int lo = hi - 7 > lowb ? hi - 7 : lowb;
    const unsigned dmask = (2u << (hi - lo)) - 1u;
    const unsigned long long above = hi < 63 ? ~0ull << (hi + 1) : 0ull;
    __syncthreads(); /* the previous pass's prefixes written and its rows read */
    for (int i = t; i < np * 256; i += ST) (&s_h[0][0])[i] = 0u;
    if (w == 0) sel_owners(s_pfx, np, above, s_row, &s_own);
    unsigned long long pf[SEL_NS];
#pragma unroll
    for (int p = 0; p < SEL_NS; ++p) pf[p] = p < np ? s_pfx[p] : 0ull;
    __syncthreads();
    const unsigned own = s_own; /* positions that count (the same in every block: its
                                   rows of gh alone) */
    const bool cw = compact && k > 0 && k < npass - 1; /* this pass writes the warp's list */
    const int nt = len < 0 ? kt : (len + 31) >> 5;
    int nlen = 0;
    for (int j = 0; j < nt; ++j) { /* a warp's trips: whole-warp ballots */
      const int i = COOP_SLOT(j, w, lane);
      const bool in = len < 0 ? i < kc : (j << 5) + lane < len;
      const unsigned long long key = in ? s[i] : KEY_NONE;
      const bool fin = !(key >> 63);
      const unsigned dg = (unsigned)(key >> lo) & dmask;
      bool any = false; /* under some position's prefix (its owner's) */
#pragma unroll
      for (int p = 0; p < SEL_NS; ++p) {
        if (p >= np) break;
        if (!((own >> p) & 1u)) continue;
        const bool hit = fin && ((key ^ pf[p]) & above) == 0ull;
        any = any || hit;
        const unsigned hm = __ballot_sync(0xffffffffu, hit);
        if (hit) {
          const unsigned peers = __match_any_sync(hm, dg);
          if (lane == __ffs(peers) - 1) atomicAdd(&s_h[p][dg], (unsigned)__popc(peers));
        }
      }
      if (cw) { /* the keys kept, in order, to list positions nlen.. (<= 32 j + 31:
                   slots of this trip or earlier ones, every one read already) */
        const unsigned km = __ballot_sync(0xffffffffu, any);
        __syncwarp(); /* every lane's read of this trip's slot before any write */
        if (any) {
          const int d = nlen + __popc(km & ((1u << lane) - 1u));
          s[COOP_SLOT(d >> 5, w, d & 31)] = key;
        }
        nlen += __popc(km);
      }
    }
    if (cw) len = nlen;
    __syncthreads();
    unsigned *g = gh + (size_t)k * SEL_NS * 256;
    for (int i = t; i < np * 256; i += ST) {
      const unsigned c = (&s_h[0][0])[i];
      if (c) atomicAdd(g + i, c);
    }
    grid.sync();
    if (k == npass - 1 && !lead) return npass; /* the answers: block 0's alone */
    if (w < np) { /* warp w: position w's digit from the grid's counts, as fin_select */
      const int rw = s_row[w];
      const uint4 v0 = __ldcg(reinterpret_cast<const uint4 *>(g + rw * 256 + 8 * lane));
      const uint4 v1 = __ldcg(reinterpret_cast<const uint4 *>(g + rw * 256 + 8 * lane + 4));
      const unsigned v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      sel_digit_take(v, lo, &s_pfx[w], &s_rem[w]);
    }
  }
  __syncthreads();
  if (t < np) out[t] = s_pfx[t];
  __syncthreads();
  return npass;
}

/* The grid's summary of its finite keys for coop_select, from each thread's
 * count fc, AND ka and OR ko of the finite keys it loaded (bit 63 clear):
 * the block's into its slot, one grid barrier (which also orders whatever
 * the grid wrote before it: the keys in shared memory, zeroed histograms),
 * then the grid's from every slot.  Every thread of every block calls it,
 * once a kernel; *gand, *gor, *gnf are the same in every thread (~0, 0, 0
 * when no key is finite).  k_sel_coop's and k_sel_cbuf's. */
__device__ void coop_grid_keys(cg::grid_group &grid, CoopSlot *slot, unsigned fc,
                               unsigned long long ka, unsigned long long ko,
                               unsigned long long *gand, unsigned long long *gor,
                               unsigned long long *gnf) {
  __shared__ unsigned long long s_and, s_or, s_gand, s_gor, s_gnf;
  __shared__ unsigned s_nf;
  const int t = (int)threadIdx.x, lane = t & 31;
  if (t == 0) {
    s_nf = 0u;
    s_and = s_gand = ~0ull;
    s_or = s_gor = 0ull;
    s_gnf = 0ull;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    fc += __shfl_xor_sync(0xffffffffu, fc, o);
    ka &= __shfl_xor_sync(0xffffffffu, ka, o);
    ko |= __shfl_xor_sync(0xffffffffu, ko, o);
  }
  __syncthreads(); /* the initialisation before any warp's atomics */
  if (lane == 0 && fc) {
    atomicAdd(&s_nf, fc);
    atomicAnd(&s_and, ka);
    atomicOr(&s_or, ko);
  }
  __syncthreads();
  if (t == 0) {
    slot[blockIdx.x].kand = s_and;
    slot[blockIdx.x].kor = s_or;
    slot[blockIdx.x].nf = s_nf;
  }
  grid.sync(); /* every slot (and what the grid wrote before) visible */
  unsigned long long ga = ~0ull, go = 0ull, gn = 0ull;
  for (int i = t; i < (int)gridDim.x; i += ST) {
    ga &= __ldcg(&slot[i].kand);
    go |= __ldcg(&slot[i].kor);
    gn += __ldcg(&slot[i].nf);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ga &= __shfl_xor_sync(0xffffffffu, ga, o);
    go |= __shfl_xor_sync(0xffffffffu, go, o);
    gn += __shfl_xor_sync(0xffffffffu, gn, o);
  }
  if (lane == 0 && gn) {
    atomicAnd(&s_gand, ga);
    atomicOr(&s_gor, go);
    atomicAdd(&s_gnf, gn);
  }
  __syncthreads();
  *gand = s_gand;
  *gor = s_gor;
  *gnf = s_gnf;
}

template <int DA, int DE>
__global__ void __launch_bounds__(ST, 1) k_sel_coop(const __grid_constant__ CArgs C) {
  typedef vg_chunk<DA, DE> G;
  static_assert(2 * VGCT_MAX_QUANTILES <= 4 * 32, "the ranks: four warps' ballots");
  extern __shared__ __align__(16) unsigned long long coop_sm[]; /* cpb x G::CH keys */
  __shared__ vgct_acc s_rec;
  __shared__ long long s_all[2 * VGCT_MAX_QUANTILES], s_r[2 * VGCT_MAX_QUANTILES];
  __shared__ unsigned long long s_out[SEL_NS];
  __shared__ int s_wcnt[4];
  const TArgs &A = C.t;
  const int t = (int)threadIdx.x;
  const bool lead = blockIdx.x == 0;
  /* 1. every block: the record (its copy in the workspace) and the ranks --
     the same in every block */
  int64_t nf;
  const int nr = chain_ranks(A, s_rec, s_all, s_r, s_wcnt, &nf);
  const int64_t c0 = (int64_t)blockIdx.x * C.cpb;
  const int64_t c1 = c0 + C.cpb < A.nchunk ? c0 + C.cpb : A.nchunk;
  const int kc = c1 > c0 ? (int)((c1 - c0) * G::CH) : 0;
  const int bad = C.cpb * G::CH > COOP_KEYS; /* the host's condition (the same in every block) */
  if (nr == 0 || bad) {
    /* 2'. nothing to select (the record answers every rank, n_finite is 0) or
       no room: the inputs are not read and there is no grid barrier; the last
       block to arrive -- after every block's reads of the record -- answers
       and leaves the reduction's counter zero again */
    if (vg_last_block(C.arrive) && t == 0) {
      *C.arrive = 0u;
      chain_answer(A, 0ull, nr, 0, nr > 0, 0, 0, 0);
    }
    return;
  }
  cg::grid_group grid = cg::this_grid();
  /* 2. every block: batch 0's histograms zeroed (batch b + 1's during batch b);
     its keys, their AND, OR and count into its slot; 3. the grid's finite
     count, AND and OR (coop_grid_keys: its barrier also makes the zeroed
     histograms visible) */
  for (int i = (int)blockIdx.x * ST + t; i < COOP_HIST_WORDS; i += (int)gridDim.x * ST) C.hist[i] = 0u;
  unsigned long long gand, gor, gnf;
  {
    unsigned fc = 0u;
    unsigned long long ka = ~0ull, ko = 0ull;
    sel_key_chunks<DA, DE>(A, c0 + t, c1, ST,
                           [&](int64_t c, const VgChunkPos &cp, const unsigned long long *keys) {
#pragma unroll
                             for (int q = 0; q < G::CH; ++q) {
                               const unsigned long long k = q < cp.cnt ? keys[q] : KEY_NONE;
                               coop_sm[(c - c0) * G::CH + q] = k;
                               if (!(k >> 63)) {
                                 ++fc;
                                 ka &= k;
                                 ko |= k;
                               }
                             }
                           });
    coop_grid_keys(grid, C.slot, fc, ka, ko, &gand, &gor, &gnf);
  }
  const unsigned long long total = gnf - (A.plant == 1 ? 1ull : 0ull); /* (a planted fault:
                                                                           an input changed) */
  const int changed = total != (unsigned long long)nf;
  int batches = 0, passes = 0;
  /* 4. the ranks, SEL_NS at a time (batch b + 1's histograms zeroed before
     batch b's first barrier, which precedes every add to them) */
  if (!changed)
    for (int b = 0; b < nr; b += SEL_NS) {
      const int np = nr - b < SEL_NS ? nr - b : SEL_NS;
      unsigned *gh = C.hist + (size_t)(b / SEL_NS) * COOP_HIST_WORDS;
      if (b + SEL_NS < nr)
        for (int i = (int)blockIdx.x * ST + t; i < COOP_HIST_WORDS; i += (int)gridDim.x * ST)
          gh[COOP_HIST_WORDS + i] = 0u;
      passes += coop_select(grid, coop_sm, kc, gand, gor, s_r + b, np, gh, lead, s_out,
                            b + SEL_NS >= nr);
      if (lead && t == 0)
        for (int k = 0; k < np; ++k) {
          A.out->rank[b + k] = s_r[b + k];
          A.out->key[b + k] = s_out[k];
        }
      ++batches;
    }
  /* no pass since the slots were read (an input changed, or one value): a
     barrier, so that block 0 answers after every block's last read */
  if (passes == 0) grid.sync();
  if (lead && t == 0) chain_answer(A, total, nr, changed, 0, batches, 1, passes);
}

/* k_sel_cbuf: coop_select over a buffer of keys -- the window plan's
 * sample (its order statistics at the windows' sample ranks) and a window's
 * stored keys past FIN_CAP -- in place of the histogram levels and the
 * finish after them (one launch, no histogram of 32768 bins to clear and
 * scan: at 2^22 bf16 pairs those were ~61 us of device time for the
 * 16384-key sample and ~63 us for a p99 window's region, ~50K keys; ncu,
 * docs/performance.md, 2026-12-04 17:50 UTC).  A cooperative grid of kpb
 * keys a block, at least COOP_MIN_KEYS, one block an SM at most (the last
 * block fewer): each block loads its keys into shared memory with their
 * AND, OR and finite count (a key with bit 63 set is not a finite pair's:
 * not counted, sorts above every finite key), the grid's totals after one
 * barrier, then the ranks -- sample: from the sample's finite count
 * (sel_sample_rank, as the level-0 scan computes them); else rank0 -- and
 * coop_select.  Writes the SelState the way the levels and the finish leave
 * it: total, prefix[s] = the key of slot s, srank[s] (the sample's ranks),
 * fin = 1 (the levels after it would return at once); bad = 1 and no
 * selection when a rank is not below the finite count (no finite key).
 * Returns at once when the sample's levels are skipped (SelState::skip,
 * win_early).  Leaves its slots and histograms (the selection's histogram
 * region: WS_COOP_SLOT, WS_COOP_HIST) dirty, the counters and FinState as
 * they were.  Exact: counts only, deterministic, the same order statistics
 * as the levels (the tests compare both ways). */
struct CBArgs {
  const unsigned long long *cand;
  long long nbuf;   /* keys in the buffer                                      */
  int kpb;          /* keys a block, at most COOP_KEYS                         */
  int ns, sample;   /* ranks (1..SEL_NS); 1: the sample's (wph, wz, wshift)   */
  long long rank0[SEL_NS];
  double wph[SEL_NS];
  double wz;
  long long wshift;
  SelState *st;
  CoopSlot *slot;   /* gridDim.x slots                                         */
  unsigned *hist;   /* COOP_HIST_WORDS, zeroed by the kernel                   */
};

__global__ void __launch_bounds__(ST, 1) k_sel_cbuf(const __grid_constant__ CBArgs A) {
  extern __shared__ __align__(16) unsigned long long cb_sm[]; /* kpb keys */
  __shared__ unsigned long long s_out[SEL_NS];
  __shared__ long long s_r[SEL_NS];
  SelState *st = A.st;
  if (st->skip) return; /* (the same in every block) */
  const int t = (int)threadIdx.x;
  const bool lead = blockIdx.x == 0;
  cg::grid_group grid = cg::this_grid();
  for (int i = (int)blockIdx.x * ST + t; i < COOP_HIST_WORDS; i += (int)gridDim.x * ST) A.hist[i] = 0u;
  const long long k0 = (long long)blockIdx.x * A.kpb;
  const long long k1 = k0 + A.kpb < A.nbuf ? k0 + A.kpb : A.nbuf;
  const int kc = k1 > k0 ? (int)(k1 - k0) : 0;
  unsigned long long gand, gor, total;
  {
    unsigned fc = 0u;
    unsigned long long ka = ~0ull, ko = 0ull;
    for (int i = t; i < kc; i += ST) {
      const unsigned long long k = __ldcg(A.cand + k0 + i);
      cb_sm[i] = k;
      if (!(k >> 63)) {
        ++fc;
        ka &= k;
        ko |= k;
      }
    }
    coop_grid_keys(grid, A.slot, fc, ka, ko, &gand, &gor, &total); /* the same in every block */
  }
  const int ns = A.ns;
  bool ok = ns >= 1 && ns <= SEL_NS;
  for (int q = 0; q < SEL_NS && q < ns; ++q) {
    const long long r = A.sample ? sel_sample_rank(A, q, total) : A.rank0[q];
    ok = ok && r >= 0 && (unsigned long long)r < total;
    if (t == q) s_r[q] = r;
  }
  __syncthreads();
  if (!ok) { /* no selection (the same in every block: no barrier follows) */
    if (lead && t == 0) {
      st->total = total;
      for (int q = 0; q < ns && q < SEL_NS; ++q) st->srank[q] = s_r[q];
      st->bad = 1;
    }
    return;
  }
  coop_select(grid, cb_sm, kc, gand, gor, s_r, ns, A.hist, lead, s_out, true);
  if (lead && t == 0) { /* every field the host and win_bounds read */
    st->total = total;
    for (int q = 0; q < ns; ++q) {
      st->prefix[q] = s_out[q];
      st->rank[q] = 0;
      st->srank[q] = s_r[q];
    }
    st->fin_ties = 0;
    st->fin_selected = ns;
    st->bad = 0;
    st->fin = 1;
  }
}

/* ---- the window plan's kernels --------------------------------------------- */

/* Whether the reduction's record (vgct_ranks_known: every rank below the
 * zero count n_finite - n_unequal is 0, rank n_finite - 1 is max_abs_err)
 * will most likely answer every rank of the fused window, from the sample's
 * counts -- z keys 0, f nonzero finite keys, none slots without a key -- and
 * window 0's sample ranks r0 <= r1 (spad: the sample's slots past the data's
 * end, sample_pad; ubmax: the largest rank other than m - 1, -1 when there is
 * none), for m pairs -- so that the reduction runs without the window
 * (k_sel_sample's last block decides, on the device, before the sample's
 * levels: win_early).  The window's bounds would be the sample's keys at r0
 * and r1 (win_bounds: lo = 0 when r0 <= 0, hi = +Inf's key when r1 is the
 * last; no window when the sample has no finite key), and the key at rank r
 * is 0 iff r < z, so whether each bound is 0 follows from the counts.
 * The window must reach the key 0 (lo == 0) and every rank lie below
 * the sample's estimate of the record's zero count, or be the last.  The
 * record's zero count is n_finite - n_unequal, and n_unequal counts the
 * unequal non-finite pairs too: the estimate takes every non-finite pair the
 * sample met (its empty slots less the padding) as one of them
 * (vgct_zero_count_estimate, csrc/vgct_stats.h: the one estimate of both
 * engines).  The ranks ub are
 * those at n_finite = m, at or above the true ones: both err towards the
 * window.  Two shapes pass: an identical pair or sparse differences (the
 * sample's keys at both of the window's ranks 0, hi == 0: skipped at once
 * when the sample met no non-finite pair), and a caching feature's output
 * (~1% of the outputs recomputed, many of them equal again: the p99's ranks
 * among the zeros, the sample's 6-sigma window reaching past them).  A
 * guess, never a result: when the record does not answer (the true zero count
 * just below the ranks: a band of about one sample sigma), the window plan's
 * own pass counts the window after the reduction -- exact, one pass dearer
 * than the fused window.  A window with lo == 0 and the ranks above the
 * estimate (the zeros fewer than the p99's rank) is fused: the sparse way
 * counts its zeros by number.  (The CPU engine's windows follow the same
 * rule: csrc/cpu_select.inc.) */
__device__ static bool win_record_answers(unsigned long long z, unsigned long long f,
                                          unsigned long long none, long long r0, long long r1,
                                          int64_t spad, int64_t ubmax, int64_t m) {
  const unsigned long long ns = z + f; /* finite keys (the level pass's total) */
  if (ns == 0) return false;           /* no window */
  const bool lo0 = r0 <= 0 || (unsigned long long)r0 < z;
  const bool hi0 = r1 < (long long)ns - 1 && (unsigned long long)r1 < z;
  const unsigned long long pad = spad > 0 ? (unsigned long long)spad : 0ull;
  const unsigned long long nonfin = none > pad ? none - pad : 0ull;
  if (hi0 && nonfin == 0) return true;
  if (!lo0) return false;
  const double zeros = vgct_zero_count_estimate(m, (int64_t)z, (int64_t)nonfin, (int64_t)(ns + nonfin));
  return ubmax < 0 || (double)ubmax < zeros;
}

/* What k_sel_sample's last block needs to leave the fused window to the
 * record (win_early): the window's ranks at n_finite = m, reduced to the
 * largest one other than m - 1 (win_record_answers), the sample's padding,
 * the hooks' override, and window 0's sample ranks as the level pass
 * computes them (sel_sample_rank: KArgs's sample fields for slots 0, 1). */
struct WinVerdict {
  int64_t ubmax, m, spad;
  int rule;       /* leaving the window to the record: 0 never, 1 win_record_answers, 2 always */
  double wph[2];  /* window 0's low and high ends, as sample quantiles */
  double wz;
  long long wshift;
};

struct SArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int64_t nsc, nruns, step, rem; /* step, rem: nchunk / nruns, nchunk % nruns */
  int full;
  unsigned long long *out;
  /* the fused window's early verdict (w != NULL: vgct_cuda_compare): the
     sample's keys counted (0, nonzero finite, none) and, in the last block,
     win_early */
  WinState *w;
  SelState *sst;
  unsigned *counter;
  WinVerdict V;
};

/* win_early: the fused window left to the record or not (win_record_answers),
 * from the sample's own counts (zero keys, nonzero finite keys, slots without
 * a key) and window 0's sample ranks as the level pass computes them
 * (sel_sample_rank) -- before the levels, which the verdict needs none of:
 * before 2026-12-02 k_win_count took it after them.  On a record verdict the
 * sample's levels, k_sel_fin, k_sel_cbuf and k_win_count return at once
 * (SelState::skip; the reduction runs without the window: WinState::mode);
 * when the record does not answer after all, the host runs the levels again
 * (win_resume) before the window plan's own pass. */
__device__ void win_early(const SArgs &A, unsigned long long nz, unsigned long long nnz,
                          unsigned long long nnone) {
  __shared__ unsigned long long s_c[WT / 32][3];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    nz += __shfl_down_sync(0xffffffffu, nz, o);
    nnz += __shfl_down_sync(0xffffffffu, nnz, o);
    nnone += __shfl_down_sync(0xffffffffu, nnone, o);
  }
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  if (lane == 0) {
    s_c[wp][0] = nz;
    s_c[wp][1] = nnz;
    s_c[wp][2] = nnone;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    unsigned long long t = 0;
    for (int w = 0; w < WT / 32; ++w) t += s_c[w][threadIdx.x];
    if (t) atomicAdd(&A.w->ecount[threadIdx.x], t);
  }
  if (!vg_last_block(A.counter)) return;
  if (threadIdx.x != 0) return;
  const WinVerdict &V = A.V;
  bool record = V.rule == 2;
  if (V.rule == 1) {
    const unsigned long long z = *(volatile unsigned long long *)&A.w->ecount[0];
    const unsigned long long f = *(volatile unsigned long long *)&A.w->ecount[1];
    const unsigned long long none = *(volatile unsigned long long *)&A.w->ecount[2];
    const unsigned long long ns = z + f; /* finite keys: the level pass's total */
    record = win_record_answers(z, f, none, sel_sample_rank(V, 0, ns), sel_sample_rank(V, 1, ns),
                                V.spad, V.ubmax, V.m);
  }
  if (record) {
    A.w->mode = VG_WIN_RECORD;
    A.sst->skip = 1;
  }
}

/* The sample: slot j (0 <= j < nsc) reads chunk c of the data pass's
 * iteration and writes its CH keys to out[j*CH ..] (KEY_NONE for a non-finite
 * pair and past a row's end).  full: every chunk (c = j); else nruns runs of
 * WIN_RUN consecutive chunks (one warp's coalesced read), run r starting at
 * floor(r * nchunk / nruns): evenly spaced, fixed by the shape (deterministic).
 * With w (the fused window) it also counts its keys for win_early. */
template <int DA, int DE>
__global__ void __launch_bounds__(WT) k_sel_sample(const __grid_constant__ SArgs A) {
  typedef vg_chunk<DA, DE> G;
  const IterSpec &it = A.it;
  const int64_t j = (int64_t)blockIdx.x * WT + threadIdx.x;
  unsigned long long nz = 0, nnz = 0, nnone = 0; /* this thread's keys (win_early) */
  if (j < A.nsc) {
    int64_t c = j;
    if (!A.full) {
      const int64_t r = j / WIN_RUN;
      c = r * A.step + (r * A.rem) / A.nruns + (j - r * WIN_RUN); /* r * rem < nruns^2: no overflow */
    }
    unsigned long long keys[G::CH];
#pragma unroll
    for (int q = 0; q < G::CH; ++q) keys[q] = KEY_NONE;
    if (c < A.nchunk) {
      const int K = it.k;
      const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1];
      const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
      const bool unit = G::TYPED && sai == 1 && sei == 1;
      const VgChunkPos cp = vg_chunk_pos<G::CH>(it, c, A.cpr, A.cprd, L, sai, sei);
      vg_raw_chunk<DA, DE> r;
      vg_chunk_fetch<DA, DE>(r, it.pa + cp.oa * isa, it.pe + cp.oe * ise, unit, cp.cnt);
      vg_chunk_keys_of<DA, DE>(it, r, sai, sei, isa, ise, keys);
#pragma unroll
      for (int q = 0; q < G::CH; ++q)
        if (q >= cp.cnt) keys[q] = KEY_NONE;
    }
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      A.out[j * G::CH + q] = keys[q];
      nz += keys[q] == 0;
      nnz += keys[q] != 0 && !(keys[q] >> 63);
      nnone += keys[q] == KEY_NONE;
    }
  }
  if (A.w) win_early(A, nz, nnz, nnone); /* (uniform: a kernel argument) */
}

/* The window pass: one read of the inputs.  Window g's bounds come from the
 * sample's order statistics (slot SLOT_SAMPLE, ranks 2g and 2g+1): lo = 0
 * when its sample rank is 0, hi = +Inf's key when its sample rank is the
 * sample's last (the window then reaches the end); a sample with no finite
 * key gives no window (WIN_SENT: nothing counted at it, nothing stored).
 * Per key and window: lt += key < lo, eql += key == lo, eqh += key == hi
 * (hi != lo), and a key with lo < key < hi is appended to the window's region
 * cand[off[g] .. off[g] + cap[g]) (staged per warp in shared memory by a
 * ballot, flushed 33..64 keys at a time with one integer atomic; a position
 * past cap is not written: pos > cap marks the overflow); nfin += finite.
 * Counters: 32-bit per thread (a lane counts at most 2 CH keys per chunk it
 * reads -- its own chunk whole, or one key a round of the warp's looked-at
 * pairs, at most CH rounds -- and the host bounds that below 2^32), 64-bit
 * warp and block sums, one atomicAdd per block and counter.
 * NW: 1 (the common single window: fewer registers) or WIN_MAXW (unused
 * windows get WIN_SENT bounds). */
struct WArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int nw;
  long long off[WIN_MAXW], cap[WIN_MAXW];
  const SelState *sst;
  WinState *w;
  unsigned long long *cand;
};

__device__ __forceinline__ void win_bounds(const WArgs &A, int g, unsigned long long &lo,
                                           unsigned long long &hi, unsigned long long &hq) {
  const SelState *s = A.sst;
  if (g >= A.nw || s->bad || s->skip) { /* skip: the levels did not run (win_early),
                                           so no bounds -- never the zeroed state's */
    lo = hi = hq = WIN_SENT;
    return;
  }
  const long long ns = (long long)s->total;
  lo = s->srank[2 * g] <= 0 ? 0ull : s->prefix[2 * g];
  hi = s->srank[2 * g + 1] >= ns - 1 ? INF_KEY : s->prefix[2 * g + 1];
  hq = hi == lo ? WIN_SENT : hi; /* ties at lo == hi are counted once, in eql */
}

/* Window g's keys staged by one warp (shared memory) go to its region: one
 * atomicAdd a flush (the same-address atomics of one append per key would
 * serialize in L2: a p99 window stores ~n/500 keys). */
#define WSTAGE 64 /* staged keys per warp and window (a flush at > 32) */
#define WIN_DIRECT 28 /* k_sel_window: lanes looking at their chunk from which each
                         lane keys its own chunk instead of staging (staged, a constant
                         offset, where every lane looks, took 836 us against 647 us at
                         2^28 fp32, docs/performance.md) */
__device__ __forceinline__ void win_flush(const WArgs &A, int g, const unsigned long long *stage,
                                          unsigned cnt, int lane) {
  __syncwarp(); /* the warp's staged keys visible to every lane */
  unsigned long long base = 0;
  if (lane == 0) base = atomicAdd(&A.w->pos[g], (unsigned long long)cnt);
  base = __shfl_sync(0xffffffffu, base, 0);
  for (unsigned i = lane; i < cnt; i += 32) {
    const unsigned long long pos = base + i;
    if (pos < (unsigned long long)A.cap[g]) A.cand[A.off[g] + (long long)pos] = stage[i];
  }
  __syncwarp(); /* read before the stage is reused */
}

/* A float32 pair in one 64-bit word (k_sel_window's buffer): a low, e high. */
__device__ __forceinline__ unsigned long long vg_pack_f32x2(float a, float e) {
  return (unsigned long long)__float_as_uint(a) | ((unsigned long long)__float_as_uint(e) << 32);
}

template <int DA, int DE, int NW>
__global__ void __launch_bounds__(WT, WIN_BPM(NW)) k_sel_window(const __grid_constant__ WArgs A) {
  typedef vg_chunk<DA, DE> G;
  const IterSpec &it = A.it;
  __shared__ unsigned long long s_stage[WT / 32][NW][WSTAGE];
  /* the chunks looked at: float32 pairs (NARROW) or keys, 8 bytes a pair */
  __shared__ unsigned long long s_buf[WT / 32][32 * G::CH];
  constexpr bool NARROW = vg_fast<DA, DE>::ok;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  const unsigned below = (1u << lane) - 1u;
  unsigned long long lo[NW], hi[NW], hq[NW];
  unsigned lt[NW], el[NW], eh[NW], wc[NW], nfin = 0; /* wc: staged keys (warp-uniform) */
#pragma unroll
  for (int g = 0; g < NW; ++g) {
    win_bounds(A, g, lo[g], hi[g], hq[g]);
    lt[g] = el[g] = eh[g] = wc[g] = 0;
  }
  unsigned long long lomin = WIN_SENT; /* the lowest window's lo */
#pragma unroll
  for (int g = 0; g < NW; ++g) lomin = lo[g] < lomin ? lo[g] : lomin;
  const float t32 = vg_win_t32_of(lomin); /* the narrow chunk test's bound (below) */
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (int g = 0; g < NW; ++g) {
      A.w->lo[g] = lo[g];
      A.w->hi[g] = hi[g];
    }
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const bool unit = G::TYPED && sai == 1 && sei == 1;
  constexpr int RU = G::NVA + G::NVE > 2 ? 1 : 2; /* as k_sel_data */
  const int64_t stride = (int64_t)gridDim.x * WT;
  /* one key per lane, every lane (ballots): the counts, and window g's keys
     strictly inside staged per warp (KEY_NONE: above every bound, counts nothing) */
  auto count_key = [&](unsigned long long key) {
    nfin += (unsigned)(key >> 63) ^ 1u;
#pragma unroll
    for (int g = 0; g < NW; ++g) {
      lt[g] += key < lo[g];
      el[g] += key == lo[g];
      eh[g] += key == hq[g];
      const bool in = key > lo[g] && key < hi[g];
      const unsigned b = __ballot_sync(0xffffffffu, in);
      if (b) { /* warp-uniform */
        if (in) s_stage[wp][g][wc[g] + __popc(b & below)] = key;
        wc[g] += __popc(b);
        if (wc[g] > WSTAGE - 32) { /* room for the next 32 */
          win_flush(A, g, s_stage[wp][g], wc[g], lane);
          wc[g] = 0;
        }
      }
    }
  };
  /* warp-uniform trips (the ballots below need every lane): a lane past the
     end reads nothing and its keys are KEY_NONE, which no counter counts */
  for (int64_t c0 = (int64_t)blockIdx.x * WT + threadIdx.x;
       __any_sync(0xffffffffu, c0 < A.nchunk); c0 += RU * stride) {
    vg_raw_chunk<DA, DE> r[RU];
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const int64_t c = c0 + u * stride;
      r[u].cnt = 0;
      r[u].v = false;
      if (c < A.nchunk) {
        const VgChunkPos cp = vg_chunk_pos<G::CH>(it, c, A.cpr, A.cprd, L, sai, sei);
        vg_chunk_fetch<DA, DE>(r[u], it.pa + cp.oa * isa, it.pe + cp.oe * ise, unit, cp.cnt);
      }
    }
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      /* the chunk test: every key finite and below every window (most chunks
         of a high quantile's window), or every key 0 -- counted whole; the
         other chunks go to the warp's buffer and their keys are counted 32 at
         a time, split over the warp (a per-lane loop over them would cost the
         warp the whole loop whenever one lane had such a chunk).  Narrow
         dtypes test the float32 differences (below t32 = vg_win_t32_of(lo):
         every key below lo, the proof there; exactly 0: every key 0) and
         stage the looked-at chunks as float32 pairs, so a key (two float64
         conversions and a subtraction) is made once per lane and round, for
         the looked-at pairs only; other dtypes make every key first. */
      const bool empty = r[u].cnt == 0; /* past the end: nothing to count */
      bool below_all, zero;
      [[maybe_unused]] unsigned long long keys[G::CH];
      [[maybe_unused]] float fa[G::CH], fe[G::CH];
      if constexpr (NARROW) {
        vg_chunk_f32<DA, DE>(r[u], sai, sei, isa, ise, fa, fe);
        bool b = true, z = true;
#pragma unroll
        for (int q = 0; q < G::CH; ++q) {
          const float d = fa[q] - fe[q]; /* NaN for a non-finite pair or past cnt */
          b &= fabsf(d) < t32;
          z &= d == 0.0f;
        }
        below_all = b;
        zero = z;
      } else {
        if (!empty) {
          vg_chunk_keys_of<DA, DE>(it, r[u], sai, sei, isa, ise, keys); /* KEY_NONE past cnt */
        } else {
#pragma unroll
          for (int q = 0; q < G::CH; ++q) keys[q] = KEY_NONE;
        }
        unsigned long long kmax = 0;
#pragma unroll
        for (int q = 0; q < G::CH; ++q) kmax = keys[q] > kmax ? keys[q] : kmax;
        below_all = kmax < lomin;
        zero = kmax == 0;
      }
      const bool whole = !empty && (below_all || zero), look = !empty && !whole;
      if (whole) {
        nfin += G::CH;
#pragma unroll
        for (int g = 0; g < NW; ++g) {
          if (!below_all && lo[g] == 0) el[g] += G::CH; /* keys 0 == lo */
          else lt[g] += G::CH;
        }
      }
      const unsigned need = __ballot_sync(0xffffffffu, look);
      if (__popc(need) >= WIN_DIRECT) { /* warp-uniform: nearly every lane looks */
        /* each lane its own chunk, pair by pair: CH rounds, no staging (ties
           at lo or a constant offset put a key >= lo in nearly every chunk) */
#pragma unroll
        for (int q = 0; q < G::CH; ++q) {
          unsigned long long key = KEY_NONE;
          if (look) {
            if constexpr (NARROW) key = vg_key_narrow(fa[q], fe[q]);
            else key = keys[q];
          }
          count_key(key);
        }
      } else if (need) { /* warp-uniform */
        if (look) {
          const int slot = __popc(need & below);
#pragma unroll
          for (int q = 0; q < G::CH; ++q) {
            if constexpr (NARROW) s_buf[wp][slot * G::CH + q] = vg_pack_f32x2(fa[q], fe[q]);
            else s_buf[wp][slot * G::CH + q] = keys[q];
          }
        }
        __syncwarp();
        const int nk = __popc(need) * G::CH;
        for (int k0 = 0; k0 < nk; k0 += 32) {
          unsigned long long key = KEY_NONE; /* above every bound */
          if (k0 + lane < nk) {
            const unsigned long long w = s_buf[wp][k0 + lane];
            if constexpr (NARROW) key = vg_key_narrow(__uint_as_float((unsigned)w),
                                                      __uint_as_float((unsigned)(w >> 32)));
            else key = w;
          }
          count_key(key);
        }
        __syncwarp(); /* the buffer read before the next chunk's are written */
      }
    }
  }
#pragma unroll
  for (int g = 0; g < NW; ++g)
    if (wc[g]) win_flush(A, g, s_stage[wp][g], wc[g], lane);
  /* block sums: warp shuffles, then one atomicAdd per counter */
  constexpr int NC = 1 + 3 * NW;
  __shared__ unsigned long long s_c[WT / 32][NC];
  unsigned long long v[NC];
  v[0] = nfin;
#pragma unroll
  for (int g = 0; g < NW; ++g) {
    v[1 + 3 * g] = lt[g];
    v[2 + 3 * g] = el[g];
    v[3 + 3 * g] = eh[g];
  }
#pragma unroll
  for (int i = 0; i < NC; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_down_sync(0xffffffffu, v[i], o);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < NC; ++i) s_c[wp][i] = v[i];
  __syncthreads();
  if (threadIdx.x < NC) {
    unsigned long long t = 0;
    for (int k = 0; k < WT / 32; ++k) t += s_c[k][threadIdx.x];
    const int i = threadIdx.x;
    if (t) {
      unsigned long long *dst = i == 0 ? &A.w->total
                                : (i - 1) % 3 == 0 ? &A.w->lt[(i - 1) / 3]
                                : (i - 1) % 3 == 1 ? &A.w->eql[(i - 1) / 3]
                                                   : &A.w->eqh[(i - 1) / 3];
      atomicAdd(dst, t);
    }
  }
}

/* ---- launchers ---------------------------------------------------------- */

template <int DA, int DE, int MODE>
static cudaError_t launch_sel_mode(int grid, const KArgs &A, cudaStream_t s) {
  /* the compaction keeps no histogram: no shared memory */
  const int smem = MODE == SEL_COMPACT ? 0 : SEL_SMEM;
  static int done[64];
  if (smem) {
    const cudaError_t e = vg_smem_optin(k_sel_data<DA, DE, MODE>, done, smem);
    if (e != cudaSuccess) return e;
  }
  k_sel_data<DA, DE, MODE><<<grid, ST, smem, s>>>(A);
  return cudaGetLastError();
}

template <int DA, int DE>
static cudaError_t launch_sel_data(int grid, const KArgs &A, cudaStream_t s) {
  if (A.compact) return launch_sel_mode<DA, DE, SEL_COMPACT>(grid, A, s);
  if (A.store_all) return launch_sel_mode<DA, DE, SEL_HIST_STORE>(grid, A, s);
  return launch_sel_mode<DA, DE, SEL_HIST>(grid, A, s);
}

static cudaError_t dispatch_sel_data(int grid, const KArgs &A, cudaStream_t s) {
  const int da = A.it.da, de = A.it.de;
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return launch_sel_data<X, Y>(grid, A, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_sel_data<-1, -1>(grid, A, s);
}

static cudaError_t launch_sel_buf(int grid, const KArgs &A, cudaStream_t s) {
  static int done[64];
  const cudaError_t e = vg_smem_optin(k_sel_buf, done, SEL_SMEM);
  if (e != cudaSuccess) return e;
  BArgs B;
  memset(&B, 0, sizeof B);
  B.level = A.level;
  B.ns = A.ns;
  B.sample = A.sample;
  memcpy(B.rank0, A.rank0, sizeof B.rank0);
  B.nbuf = A.nbuf;
  memcpy(B.wph, A.wph, sizeof B.wph);
  B.wz = A.wz;
  B.wshift = A.wshift;
  B.st = A.st;
  B.hist = A.hist;
  B.cand = A.cand;
  B.counter = A.counter;
  k_sel_buf<<<grid, ST, SEL_SMEM, s>>>(B);
  return cudaGetLastError();
}

/* k_sel_fin after level `level` (0 or 1) of A's buffer (A.nbuf keys; direct
 * = 0, grid blocks), or one block over the whole buffer at the ranks A.rank0
 * (direct = 1, A.nbuf <= FIN_CAP). */
static cudaError_t launch_sel_fin(DevWS *ws, int grid, const KArgs &A, int direct, int level,
                                  cudaStream_t s) {
  static int done[64];
  const cudaError_t e = vg_smem_optin(k_sel_fin, done, FIN_SMEM);
  if (e != cudaSuccess) return e;
  FinArgs F;
  memset(&F, 0, sizeof F);
  F.ns = A.ns;
  F.direct = direct;
  F.pshift = sel_shift(level);
  F.nbuf = A.nbuf;
  memcpy(F.rank0, A.rank0, sizeof F.rank0);
  F.st = A.st;
  F.fs = (FinState *)(ws->d_ws + WS_SEL_FIN);
  F.cand = A.cand;
  F.reg = (unsigned long long *)(ws->d_ws + WS_SEL_FREG);
  F.counter = (unsigned *)(ws->d_ws + WS_SEL_CNT) + CNT_FIN;
  k_sel_fin<<<direct ? 1 : grid, ST, FIN_SMEM, s>>>(F);
  return cudaGetLastError();
}

template <int DA, int DE>
static cudaError_t launch_sel_tiny(const TArgs &A, cudaStream_t s) {
  static int done[64], checked = 0;
  if (!checked) { /* the host's smem condition counts TINY_STATIC for the static part */
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, k_sel_tiny<DA, DE>);
    if (e != cudaSuccess) return e;
    if (fa.sharedSizeBytes > TINY_STATIC) return cudaErrorInvalidConfiguration; /* (internal) */
    checked = 1;
  }
  const cudaError_t e = vg_smem_optin(k_sel_tiny<DA, DE>, done, TINY_SMEM);
  if (e != cudaSuccess) return e;
  /* the m keys' bytes (m <= TINY_CAP: the host's condition) */
  const size_t bytes = (size_t)(A.it.m > 0 ? A.it.m : 1) * 8u;
  k_sel_tiny<DA, DE><<<1, ST, bytes, s>>>(A);
  return cudaGetLastError();
}

/* VgChain::launch for vgct_cuda_compare's small call: ctx is its TArgs, to
 * which the reduction's record and completion word are added here. */
static cudaError_t chain_sel_tiny(void *ctx, const vgct_acc *rec, unsigned *done, unsigned seq,
                                  cudaStream_t s) {
  TArgs &A = *static_cast<TArgs *>(ctx);
  A.rec = rec;
  A.done = done;
  A.seq = seq;
  const int da = A.it.da, de = A.it.de;
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return launch_sel_tiny<X, Y>(A, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_sel_tiny<-1, -1>(A, s);
}

/* A cooperative selection kernel K's readiness (k_sel_coop's instantiations,
 * k_sel_cbuf) on the current device, once per kernel and device (each K has
 * its own cache): its static shared memory within COOP_STATIC, COOP_SMEM of dynamic
 * shared memory opted in, and at least one 1024-thread block resident per SM
 * with it (cudaOccupancyMaxActiveBlocksPerMultiprocessor) -- else the call
 * takes the plans after the record.  The CUDA calls' errors are not sticky;
 * they are cleared from cudaGetLastError (the launches' check reads it). */
template <auto K>
static bool coop_kernel_ready(int dev) {
  static signed char state[64]; /* 0 not known, 1 ready, -1 not (the same values from any thread) */
  if (dev < 0 || dev >= 64) return false;
  if (state[dev]) return state[dev] > 0;
  bool ok = false;
  cudaFuncAttributes fa;
  int nb = 0;
  if (cudaFuncGetAttributes(&fa, K) == cudaSuccess && fa.sharedSizeBytes <= COOP_STATIC &&
      cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, COOP_SMEM) == cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, K, ST, COOP_SMEM) == cudaSuccess)
    ok = nb >= 1;
  (void)cudaGetLastError();
  state[dev] = ok ? 1 : -1;
  return ok;
}

template <int DA, int DE>
static bool coop_ready_t(int dev) {
  return coop_kernel_ready<k_sel_coop<DA, DE>>(dev);
}

static bool coop_ready(int da, int de, int dev) {
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return coop_ready_t<X, Y>(dev);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return coop_ready_t<-1, -1>(dev);
}

template <int DA, int DE>
static cudaError_t launch_sel_coop(const CArgs &C, int grid, cudaStream_t s) {
  void *args[] = {(void *)&C};
  const size_t bytes = (size_t)C.cpb * (size_t)vg_chunk<DA, DE>::CH * 8u;
  return cudaLaunchCooperativeKernel((const void *)k_sel_coop<DA, DE>, dim3((unsigned)grid),
                                     dim3(ST), args, bytes, s);
}

extern "C" long long vgct_cuda_test_cbuf, vgct_cuda_test_fin; /* the hooks, below */

/* k_sel_cbuf over A's buffer (A.cand, nbuf keys, A.st) at A.ns ranks (A.rank0,
 * or the sample's: A.sample, A.wph, A.wz, A.wshift), when it can run: the
 * hooks leave it on (vgct_cuda_test_cbuf != 1, and the finish's knob at its
 * default: its tests keep the levels and the finish), a cooperative device
 * with COOP_SMEM of shared memory a block, and at most one block of COOP_KEYS
 * keys per SM (cbuf_can), and the device takes the grid when it is launched
 * (a refused cooperative launch, cudaErrorCooperativeLaunchTooLarge, is not
 * an error).  *ran: whether it was launched (else nothing was, and the caller
 * takes the levels). */
static bool cbuf_can(const DevWS *ws, int dev, long long nbuf, int ns) {
  return vgct_cuda_test_cbuf != 1 && vgct_cuda_test_fin == 0 && ws->coop && nbuf >= 1 &&
         ns >= 1 && ns <= SEL_NS && ws->smem_optin >= (size_t)COOP_SMEM + COOP_STATIC &&
         nbuf <= (long long)ws->sms * COOP_KEYS && coop_kernel_ready<k_sel_cbuf>(dev);
}

static cudaError_t launch_sel_cbuf(DevWS *ws, int dev, const KArgs &A, long long nbuf,
                                   cudaStream_t s, bool *ran) {
  *ran = false;
  if (!cbuf_can(ws, dev, nbuf, A.ns)) return cudaSuccess;
  long long kpb = (nbuf + ws->sms - 1) / ws->sms;
  if (kpb < COOP_MIN_KEYS) kpb = COOP_MIN_KEYS;
  const int grid = (int)((nbuf + kpb - 1) / kpb); /* <= sms: every block resident */
  CBArgs C;
  memset(&C, 0, sizeof C);
  C.cand = A.cand;
  C.nbuf = nbuf;
  C.kpb = (int)kpb;
  C.ns = A.ns;
  C.sample = A.sample;
  memcpy(C.rank0, A.rank0, sizeof C.rank0);
  memcpy(C.wph, A.wph, sizeof C.wph);
  C.wz = A.wz;
  C.wshift = A.wshift;
  C.st = A.st;
  C.slot = (CoopSlot *)(ws->d_ws + WS_COOP_SLOT);
  C.hist = (unsigned *)(ws->d_ws + WS_COOP_HIST);
  void *args[] = {(void *)&C};
  const cudaError_t e = vgct_cuda_test_cbuf == 2
                            ? cudaErrorCooperativeLaunchTooLarge /* the hook: a refusal */
                            : cudaLaunchCooperativeKernel((const void *)k_sel_cbuf,
                                                          dim3((unsigned)grid), dim3(ST), args,
                                                          (size_t)kpb * 8u, s);
  if (e == cudaErrorCooperativeLaunchTooLarge) {
    /* a grid the device cannot hold at once now (e.g. an MPS share of its SMs,
       which cbuf_can's count of the device's SMs does not see): nothing was
       queued -- the levels instead (as reduce.cu does for k_sel_coop) */
    (void)cudaGetLastError();
    return cudaSuccess;
  }
  *ran = e == cudaSuccess;
  return e;
}

/* The cooperative selection's context (VgChain::ctx): its arguments and grid. */
struct CoopChain {
  CArgs C;
  int grid;
};

/* VgChain::launch for a mid-size call (k_sel_coop). */
static cudaError_t chain_sel_coop(void *ctx, const vgct_acc *rec, unsigned *done, unsigned seq,
                                  cudaStream_t s) {
  CoopChain &X = *static_cast<CoopChain *>(ctx);
  X.C.t.rec = rec;
  X.C.t.done = done;
  X.C.t.seq = seq;
  const int da = X.C.t.it.da, de = X.C.t.it.de;
#define VG_CASE(X_, Y) \
  if (da == X_ && de == Y) return launch_sel_coop<X_, Y>(X.C, X.grid, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_sel_coop<-1, -1>(X.C, X.grid, s);
}

/* k_sel_coop's grid for m pairs in nchunk chunks of ch: at least COOP_MIN_KEYS
 * pairs a block, at most one block per SM (and COOP_MAX_GRID, and the test
 * hook's cap), cpb chunks a block; false when a block's keys would not fit
 * COOP_KEYS. */
static bool coop_plan(const DevWS *ws, int64_t m, int64_t nchunk, int ch, int *grid, int64_t *cpb);

template <int DA, int DE>
static cudaError_t launch_sel_sample(int grid, const SArgs &A, cudaStream_t s) {
  k_sel_sample<DA, DE><<<grid, WT, 0, s>>>(A);
  return cudaGetLastError();
}

static cudaError_t dispatch_sel_sample(int grid, const SArgs &A, cudaStream_t s) {
  const int da = A.it.da, de = A.it.de;
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return launch_sel_sample<X, Y>(grid, A, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_sel_sample<-1, -1>(grid, A, s);
}

template <int DA, int DE>
static cudaError_t launch_sel_window(int grid, const WArgs &A, cudaStream_t s) {
  if (A.nw == 1)
    k_sel_window<DA, DE, 1><<<grid, WT, 0, s>>>(A);
  else
    k_sel_window<DA, DE, WIN_MAXW><<<grid, WT, 0, s>>>(A);
  return cudaGetLastError();
}

static cudaError_t dispatch_sel_window(int grid, const WArgs &A, cudaStream_t s) {
  const int da = A.it.da, de = A.it.de;
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return launch_sel_window<X, Y>(grid, A, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_sel_window<-1, -1>(grid, A, s);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- test hooks -------------------------------------------------------------
 * Not an API: the GPU tests (tests/unittest/_torch/visual_gen/vgct/test_gpu.py)
 * reach them through ctypes on vgct_ext._C (exported despite
 * -fvisibility=hidden) to force each plan at small n and to see which one ran.
 * Zero (the default) leaves every decision to the code above.
 *   vgct_cuda_test_sel[0]  plan: 0 automatic; 1 the window plan at any n;
 *                          2 no window plan (store-all for n <= SEL_CAP, else
 *                          the radix path); 3 the radix path only
 *   vgct_cuda_test_sel[1]  > 0: sample keys (instead of n/256 in [2^14, 2^20])
 *   vgct_cuda_test_sel[2]  > 0: each window's region holds at most this many
 *                          keys (forces an overflow)
 *   vgct_cuda_test_sel[3]  added to every window's sample ranks on the device
 *                          (a planted misprediction)
 *   vgct_cuda_test_sel_kpt > 0: keys per thread of the buffer passes' grids
 *                          (instead of SEL_BUF_KPT; bench/bench_selbuf.py)
 *   vgct_cuda_test_fin     1: no k_sel_fin (the four histogram levels always;
 *                          the tests compare both ways, bench/gpu_kernels.py);
 *                          2: k_sel_fin on, but a small call (n <= TINY_CAP)
 *                          takes the store-all level 0 and the finish after
 *                          it, not k_sel_tiny behind the reduction (the tests
 *                          of that finish at small n); 1 sends it there too
 * vgct_cuda_test_fin_last (the last call's finishes, written by every call):
 *   [0] k_sel_fin launches after the store-all level 0 (whose state the host reads)
 *   [1] their slots answered by a one-key bucket (ties)
 *   [2] their slots answered by the selection among the wanted buckets' keys
 *   [3] of those launches, the ones that left the slots to the levels
 *   [4] window selections finished by one direct k_sel_fin (no levels)
 *   [5] window selections answered by k_sel_fin after their level 1 (levels
 *       2-4 returned at once)
 *   [6] a small call's batches of SEL_NS ranks answered by k_sel_tiny, the
 *       selection chained behind the reduction (n <= TINY_CAP; fin_select
 *       calls: the distinct ranks the record does not decide, by SEL_NS)
 * vgct_cuda_test_sel_last (the last call's plan, written by every call):
 *   [0] windows read by the window pass (0: no window pass)
 *   [1] ranks answered by a window's pivot counts (lo, hi)
 *   [2] ranks answered by a selection over a window's stored keys
 *   [3] windows that overflowed their region
 *   [4] ranks left to the radix path (store-all or the data histograms)
 *   [5] the radix path's plan: 0 not run, 1 store-all, 2 data histograms,
 *       3 k_sel_tiny (a small call; [4] its ranks), 4 k_sel_coop (a
 *       mid-size call; [4] its ranks)
 * vgct_cuda_test_win_last (written by every window answer): window 0's counts
 *   -- keys below lo, == lo, == hi (hi != lo), stored strictly inside -- the
 *   same whichever pass counted them (the window pass, the fused sparse way, every
 *   pair classified: the tests compare the three) */
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_win_last[4] = {-1, -1, -1, -1};
__attribute__((visibility("default"))) long long vgct_cuda_test_sel[4] = {0, 0, 0, 0};
__attribute__((visibility("default"))) long long vgct_cuda_test_sel_last[6] = {0, 0, 0, 0, 0, 0};
__attribute__((visibility("default"))) long long vgct_cuda_test_sel_kpt = 0;
__attribute__((visibility("default"))) long long vgct_cuda_test_fin = 0;
__attribute__((visibility("default"))) long long vgct_cuda_test_fin_last[7] = {0, 0, 0, 0, 0, 0, 0};
/* vgct_cuda_test_tiny_plant = 1: k_sel_tiny counts one finite key less than
   it keyed (a planted fault: the input-changed error's test) */
__attribute__((visibility("default"))) long long vgct_cuda_test_tiny_plant = 0;
/* vgct_cuda_test_coop[0]: 0 automatic; 1 no k_sel_coop (k_sel_tiny up to
   TINY_CAP pairs, the plans after the record above); 2 k_sel_coop from one
   pair on (instead of k_sel_tiny); 3 past TINY_CAP a launch of 65535 blocks,
   which the device refuses (cudaErrorCooperativeLaunchTooLarge: the call
   selects after the record instead).  [1] > 0: k_sel_coop's blocks at most.
   vgct_cuda_test_coop_last, written by every call: [0] k_sel_coop's blocks
   (0: not launched), [1] its radix passes, [2] its batches of SEL_NS ranks.
   (vgct_cuda_test_tiny_plant plants k_sel_coop's count too.) */
__attribute__((visibility("default"))) long long vgct_cuda_test_coop[2] = {0, 0};
__attribute__((visibility("default"))) long long vgct_cuda_test_coop_last[3] = {0, 0, 0};
/* vgct_cuda_test_cbuf: 0 automatic; 1 no k_sel_cbuf (the histogram levels and
   the finish for the window plan's sample and its regions past FIN_CAP, as
   before it; vgct_cuda_test_fin != 0 turns it off too); 2 every launch of it
   refused as a device that cannot hold the grid refuses it (not launched:
   the levels instead).
   vgct_cuda_test_cbuf_last, written by every call: [0] k_sel_cbuf launches
   for the window plan's sample (win_levels: one that returns at once on
   SelState::skip counts too), [1] its window batches by k_sel_cbuf */
__attribute__((visibility("default"))) long long vgct_cuda_test_cbuf = 0;
__attribute__((visibility("default"))) long long vgct_cuda_test_cbuf_last[2] = {0, 0};
/* vgct_cuda_test_counter[0] = 1: every vgct_cuda_compare reads the reduction's
   last-block counter (WS_COUNTER) back into [1] right after its reduction and
   chained kernel (before any selection plan after the record; not on an
   error) -- zero, unless a kernel that arrived at it (the reduction's blocks,
   k_sel_coop's with nothing to select) did not leave it so */
__attribute__((visibility("default"))) long long vgct_cuda_test_counter[2] = {0, -1};
/* vgct_cuda_test_gate_words[0] = 1: the same, for the whole-tensor gate
   thresholds' three words (WS_GATE) into [1..3] -- zero after every call: a
   word left raised would gate the next call's pairs with this call's maxima */
__attribute__((visibility("default"))) long long vgct_cuda_test_gate_words[4] = {0, -1, -1, -1};
/* the host round trips (runtime.cu vgct_cuda_test_syncs) the last vgct_cuda_compare made
   before its reduction's launch: 0 since the fused window's way is chosen on the device */
__attribute__((visibility("default"))) long long vgct_cuda_test_syncs_pre_last = -1;
/* vgct_cuda_compare: vgct_cuda_test_known = 1 sends every rank to the
   selection (the tests of the selection's plans), 0 (default) lets the
   reduction's record answer the ranks it decides (vgct_rank_known);
   vgct_cuda_test_known_last, written by every call: [ranks the record
   answered, ranks left to the selection] */
__attribute__((visibility("default"))) long long vgct_cuda_test_known = 0;
__attribute__((visibility("default"))) long long vgct_cuda_test_known_last[2] = {0, 0};
/* vgct_cuda_compare, written by every call: 1 when a fused plan's reduction did
   not count its window and ranks were left to the selection, so the sample's
   levels ran again after it (win_resume: the record left to answer did not
   answer every rank -- or the ring kernel did not run, when the host cannot
   tell whether the levels were skipped and reruns them) */
__attribute__((visibility("default"))) long long vgct_cuda_test_resume_last = 0;
}
static bool fin_on(void) { return vgct_cuda_test_fin != 1; }
static bool fin_tiny_on(void) { return vgct_cuda_test_fin == 0; }

static bool coop_plan(const DevWS *ws, int64_t m, int64_t nchunk, int ch, int *grid, int64_t *cpb) {
  if (vgct_cuda_test_coop[0] == 3) { /* planted: a grid no device holds at once (never runs) */
    *cpb = 1;
    *grid = 65535;
    return true;
  }
  int64_t g = cdiv(m, COOP_MIN_KEYS);
  int64_t cap = ws->sms < COOP_MAX_GRID ? ws->sms : COOP_MAX_GRID;
  if (vgct_cuda_test_coop[1] > 0 && vgct_cuda_test_coop[1] < cap) cap = vgct_cuda_test_coop[1];
  if (g > cap) g = cap;
  if (g < 1) g = 1;
  if (nchunk < 1) return false;
  const int64_t c = cdiv(nchunk, g);
  if (c * ch > COOP_KEYS) return false;
  *cpb = c;
  *grid = (int)cdiv(nchunk, c); /* no empty block */
  return true;
}
extern "C" long long vgct_cuda_test_fuse, vgct_cuda_test_fuse_last; /* reduce.cu's hooks */
extern "C" long long vgct_cuda_test_syncs;                          /* runtime.cu's */

/* k_sel_buf's grid over nbuf keys: SEL_BUF_KPT keys a thread (fewer blocks:
 * fewer shared histograms to clear and flush into the global one), at most
 * one block per SM. */
#define SEL_BUF_KPT 8
static int sel_buf_grid(const DevWS *ws, int64_t nbuf) {
  const int64_t kpt = vgct_cuda_test_sel_kpt > 0 ? (int64_t)vgct_cuda_test_sel_kpt : SEL_BUF_KPT;
  const int64_t gb = cdiv(nbuf > 0 ? nbuf : 1, (int64_t)ST * kpt);
  return (int)(gb < ws->sms ? gb : ws->sms);
}

/* ---- the window plan, host side ------------------------------------------ */

struct WinPlan {
  int nw;
  double z;                   /* margin in standard deviations of a sample rank */
  double phl[WIN_MAXW], phh[WIN_MAXW]; /* the lowest and highest rank's fraction */
  double pred[WIN_MAXW];      /* predicted keys inside (ranks of the data)       */
};

/* Windows for the distinct ascending ranks ub[0..nu) of nf finite pairs,
 * from an expected ns finite sample keys: rank r is at fraction ph = r/(nf-1)
 * of the sorted keys, its sample ranks [floor(at - mg), ceil(at + 1 + mg)]
 * (at = ph (ns-1), the CPU engine's margin with z sigmas); windows that
 * overlap merge; at most WIN_MAXW (later ranks get none). */
static void win_build(const int64_t *ub, int nu, int64_t nf, double ns, double z, WinPlan *W) {
  W->nw = 0;
  W->z = z;
  double ilo[WIN_MAXW], ihi[WIN_MAXW];
  for (int j = 0; j < nu; ++j) {
    if (ub[j] >= nf) break; /* out of range (ascending): the radix path reports it */
    const double ph = nf > 1 ? (double)ub[j] / (double)(nf - 1) : 0.0;
    const double at = ph * (ns - 1.0), mg = z * sqrt(ns * ph * (1.0 - ph)) + 16.0 + ns / 2048.0;
    double lo = floor(at - mg), hi = ceil(at + 1.0 + mg);
    if (lo < 0.0) lo = 0.0;
    if (hi > ns - 1.0) hi = ns - 1.0;
    const int k = W->nw;
    if (k > 0 && lo <= ihi[k - 1]) {
      W->phh[k - 1] = ph;
      if (hi > ihi[k - 1]) ihi[k - 1] = hi;
      continue;
    }
    if (k == WIN_MAXW) break;
    W->phl[k] = W->phh[k] = ph;
    ilo[k] = lo;
    ihi[k] = hi;
    W->nw = k + 1;
  }
  for (int g = 0; g < W->nw; ++g) W->pred[g] = (ihi[g] - ilo[g] + 1.0) / ns * (double)nf;
}

/* candidate keys the first k windows ask for: 1.25 x predicted + 4096 each */
static double win_need(const WinPlan *W, int k) {
  double t = 0.0;
  for (int g = 0; g < k; ++g) t += 1.25 * W->pred[g] + 4096.0;
  return t;
}

#define WIN_CK(call, what)                  \
  do {                                      \
    if (!cx.check((call), what)) {          \
      rc = cx.rc;                           \
      goto wout;                            \
    }                                       \
  } while (0)

/* Levels 0..4 of k_sel_buf over A's buffer (A.cand, A.nbuf keys, A.st,
 * A.rank0 or the sample ranks): afterwards A.st->prefix[s] is the key of
 * rank s.  With the finish on, k_sel_fin runs after level `fin_at` (0 or 1)
 * and, when it answers every slot, the later levels return at once
 * (no host round trip decides it).  Level 0 for the sample (its p99 bucket:
 * a few thousand keys); level 1 for a window's region of more than FIN_CAP
 * keys, whose values span a narrow range -- one or two level-0 buckets, but
 * its rank's level-1 bucket (2^-16 of an octave: a ~0.5% wide window of noise
 * spreads over a few hundred) holds a few thousand.  The histograms, the
 * counters and the FinState must be zero (k_sel_fin leaves its FinState
 * zero). */
static cudaError_t buf_levels(DevWS *ws, KArgs &A, int fin_at, cudaStream_t s) {
  const int grid = sel_buf_grid(ws, A.nbuf);
  for (int lv = 0; lv <= 4; ++lv) {
    A.level = lv;
    A.hist = (unsigned long long *)(ws->d_ws + WS_SEL_HIST + (size_t)lv * SEL_BINS * 8);
    A.counter = (unsigned *)(ws->d_ws + WS_SEL_CNT) + lv;
    cudaError_t e = launch_sel_buf(grid, A, s);
    if (e != cudaSuccess) return e;
    if (lv == fin_at && fin_on() && (e = launch_sel_fin(ws, grid, A, 0, lv, s)) != cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

/* A window plan: its windows (W), the window pass's arguments (WA, grid gw),
 * the sample's (S, skeys keys); fused: the reduction counted window 0
 * (vgct_cuda_compare), so no window pass runs. */
struct WinRun {
  WinPlan W;
  WArgs WA;
  SArgs S;
  int64_t skeys, gw;
  int64_t spad; /* the sample's slots past a row's end (no pair, no key) */
  bool fused;
  bool copied; /* fused: its counts already at h_pin + VG_PIN_WIN (vg_reduce_run) */
};

/* The sample's slots that hold no pair (k_sel_sample writes KEY_NONE past
 * the data's end), for m pairs in ONE row of cpr chunks of CH: only the last
 * chunk can be partial, and only the last run reach it or past it.  Several
 * rows: 0 (win_record_answers then takes every empty slot for a non-finite
 * pair, which errs towards the window; the fused window's views are flat). */
static int64_t sample_pad(const SArgs &S, int64_t m, int64_t cpr, int CH) {
  if (cpr != S.nchunk) return 0;
  const int64_t short_by = S.nchunk * CH - m; /* the last chunk: CH - its pairs */
  if (S.full) return short_by;
  const int64_t r = S.nruns - 1, c0 = r * S.step + (r * S.rem) / S.nruns;
  int64_t p = 0;
  for (int64_t u = 0; u < WIN_RUN; ++u)
    p += c0 + u >= S.nchunk ? CH : (c0 + u == S.nchunk - 1 ? short_by : 0);
  return p;
}

/* The plan, on the host only: the sample, the windows for the ranks ub[j]
 * (distinct, ascending) of nf finite pairs, the regions.  run->W.nw == 0:
 * no window plan (nothing to launch). */
static void win_plan(DevWS *ws, const KArgs &B, int64_t nf, const int64_t *ub, int nu,
                     WinRun *run) {
  const long long *T = vgct_cuda_test_sel;
  const IterSpec &it = B.it;
  const int64_t m = it.m;
  char *d = ws->d_ws;
  unsigned long long *cand = (unsigned long long *)(d + WS_SEL_CAND);
  memset(run, 0, sizeof *run);
  WinPlan &W = run->W;
  W.nw = 0;
  if (nf <= 0 || nu <= 0) return;
  const int CH = vg_chunk_elems(it.da, it.de);

  /* the sample: nruns runs of WIN_RUN chunks, or every chunk */
  int64_t K = T[1] > 0 ? T[1] : m / 256;
  K = K < (T[1] > 0 ? 1 : WIN_SMIN) ? (T[1] > 0 ? 1 : WIN_SMIN) : (K > WIN_SMAX ? WIN_SMAX : K);
  SArgs &S = run->S;
  S.it = it;
  S.nchunk = B.nchunk;
  S.cpr = B.cpr;
  S.cprd = B.cprd;
  S.nruns = cdiv(K, (int64_t)WIN_RUN * CH);
  S.nsc = S.nruns * WIN_RUN;
  S.full = S.nsc >= S.nchunk;
  if (S.full) {
    S.nsc = S.nchunk;
    S.nruns = 1;
  }
  S.step = S.nchunk / S.nruns;
  S.rem = S.nchunk % S.nruns;
  S.out = cand;
  run->skeys = S.nsc * CH;
  if (run->skeys > (int64_t)SEL_CAP) return; /* not reached: K <= 2^20 */
  run->spad = sample_pad(S, m, B.cpr, CH);
  /* expected finite keys in the sample (a chunk at a row's end may hold fewer
     pairs: only the margins depend on it, never a result) */
  double ns = (S.full ? (double)m : (double)run->skeys) * (double)nf / (double)m;
  if (ns < 1.0) ns = 1.0;

  /* the windows: the widest margin whose windows all fit the buffer, else 3
     sigmas and as many windows as fit (a misprediction costs the fallback) */
  {
    static const double zs[4] = {6.0, 5.0, 4.0, 3.0};
    int fit = 0;
    for (int i = 0; i < 4 && !fit; ++i) {
      win_build(ub, nu, nf, ns, zs[i], &W);
      fit = win_need(&W, W.nw) <= (double)SEL_CAP;
    }
    while (W.nw > 0 && win_need(&W, W.nw) > (double)SEL_CAP) --W.nw;
  }
  if (W.nw == 0) return;
  WArgs &WA = run->WA;
  WA.it = it;
  WA.nchunk = B.nchunk;
  WA.cpr = B.cpr;
  WA.cprd = B.cprd;
  WA.nw = W.nw;
  WA.sst = (SelState *)(d + WS_SEL_STATE + SLOT_SAMPLE * SEL_SLOT);
  WA.w = (WinState *)(d + WS_SEL_STATE + SLOT_WIN * SEL_SLOT);
  WA.cand = cand;
  {
    double sw = 0.0;
    for (int g = 0; g < W.nw; ++g) sw += W.pred[g] + 4096.0;
    long long off = 0;
    for (int g = 0; g < W.nw; ++g) { /* the buffer shared in proportion: sum <= SEL_CAP */
      long long cap = (long long)floor((double)SEL_CAP * ((W.pred[g] + 4096.0) / sw));
      if (T[2] > 0 && cap > T[2]) cap = T[2];
      if (off + cap > (long long)SEL_CAP) cap = (long long)SEL_CAP - off;
      WA.off[g] = off;
      WA.cap[g] = cap;
      off += cap;
    }
  }
  /* the window pass's grid: every SM, several blocks each; a thread's 32-bit
     counters must not wrap (at most 2 CH keys per chunk it reads, < 2^32) */
  const int bpm = WIN_BPM(W.nw);
  int64_t gw = cdiv(B.nchunk, (int64_t)WT * 2);
  if (gw > (int64_t)ws->sms * bpm) gw = (int64_t)ws->sms * bpm;
  if (gw < 1) gw = 1;
  run->gw = gw;
  if (cdiv(B.nchunk, gw * WT) * 2 * CH >= (INT64_C(1) << 32)) W.nw = 0;
}

/* The fused pass's two ways (cuda/reduce.cu): the sparse way (VG_WIN_LOOK)
 * keys only the pairs whose float32 |d| does not prove their key below lo --
 * cheap while such keys are few (a p99 window: ~1% of the keys), dearer as
 * they grow (the warp's rounds are the most candidates one lane has); every
 * pair classified in the fold (VG_WIN_EVERY) costs the same whatever the data,
 * ~8 instructions a pair (vg_win_mark), far less than the sparse way or the own pass where
 * keys >= lo are many (bf16 ties: 3% of the keys at lo; a constant offset:
 * 27%).  WIN_FUSE_GE was set (2026-12-01, 22:25-23:38 UTC in
 * docs/performance.md) against the warp-wide look the sparse way replaced,
 * whose cost rose faster with the keys >= lo; the new crossover is not
 * measured yet, and 2% errs towards every pair (speed only: both ways give
 * the same counts).  Both ways forced on the p99 shapes of issue #13
 * (docs/performance.md, 2026-12-05 14:10 UTC, after e155deb): the choice
 * made here is the faster way on each.
 * k_win_count counts the sample's finite keys >= lo (sge) and its last block
 * picks every pair classified when they are more than WIN_FUSE_GE of the
 * sample's finite keys, else the sparse way (WinState::mode, which the
 * reduction's variants read). */
#define WIN_FUSE_GE 0.02
/* ...and only from WIN_FUSE_MIN pairs on.  Set when the host chose the way
 * (a round trip of ~20 us): at 2^24 fused and unfused were within 3%, at 2^22
 * the fused calls up to 20% slower.  Re-measured with the choice on the device
 * (docs/performance.md, 2026-12-02 15:35 UTC): at 2^24 the fused ways beat the
 * window pass by 5-14% on noisy data, but the shapes the record answers
 * (identical, caching) pay the sample before the reduction -- 0.17-0.24 ms
 * against 0.09-0.13 ms unfused, where the record answers after the
 * reduction with no sample at all -- so the threshold stays. */
#define WIN_FUSE_MIN (INT64_C(1) << 25)
#define CNT_WIN 6   /* k_win_count's last-block counter (index in WS_SEL_CNT) */
#define CNT_EARLY 7 /* k_sel_sample's (win_early) */
/* Window 0's bounds from the sample's order statistics (win_bounds) into the
 * WinState (block 0: the fused pass reads them at its start), and the
 * sample's keys at or above lo counted; the last block chooses the
 * reduction's way (WinState::mode): every pair classified when they are
 * dense (WIN_FUSE_GE), else the sparse way -- force (the hooks): 0 by the sample, 1 every
 * pair, 2 the sparse way.  Returns at once when k_sel_sample's last block
 * left the window to the record (SelState::skip, win_early). */
__global__ void __launch_bounds__(WT) k_win_count(const __grid_constant__ WArgs A, long long nkeys,
                                                  unsigned *counter, int force) {
  if (A.sst->skip) return; /* (the same in every block) */
  unsigned long long lo, hi, hq;
  win_bounds(A, 0, lo, hi, hq);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    A.w->lo[0] = lo;
    A.w->hi[0] = hi;
  }
  unsigned long long c = 0;
  /* keys >= lo, but not 0 == lo: the fused kernel's sparse way counts the
     pairs with d == 0 by number, without a key each */
  for (long long i = (long long)blockIdx.x * WT + threadIdx.x; i < nkeys; i += (long long)gridDim.x * WT) {
    const unsigned long long key = A.cand[i];
    c += key >= lo && key != KEY_NONE && key != 0;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31u) == 0 && c) atomicAdd(&A.w->sge, c);
  if (!vg_last_block(counter)) return;
  if (threadIdx.x == 0) {
    const unsigned long long sge = *(volatile unsigned long long *)&A.w->sge;
    const bool dense =
        force == 1 || (force == 0 && (double)sge > WIN_FUSE_GE * (double)A.sst->total);
    A.w->mode = dense ? VG_WIN_EVERY : VG_WIN_LOOK;
  }
}

/* The sample's order statistics at the windows' sample ranks, on the
 * device, no round trip: k_sel_cbuf where it runs, else the level passes over
 * the sample's keys (level 0, k_sel_fin, levels 1-4).  The select
 * workspace's counters, states and histograms must be clear (win_start;
 * win_resume).  vgct_cuda_test_cbuf_last[0] counts k_sel_cbuf's launches
 * here (one that returns at once on SelState::skip among them; a fused
 * plan's win_resume launches it again). */
static cudaError_t win_levels(DevWS *ws, int dev, const KArgs &B, const WinRun *run,
                              cudaStream_t s) {
  const WinPlan &W = run->W;
  KArgs A = B;
  A.store_all = 0;
  A.compact = 0;
  A.nbuf = run->skeys;
  A.cand = run->WA.cand;
  A.st = (SelState *)run->WA.sst;
  A.ns = 2 * W.nw;
  A.sample = 1;
  for (int g = 0; g < W.nw; ++g) {
    A.wph[2 * g] = W.phl[g];
    A.wph[2 * g + 1] = W.phh[g];
  }
  A.wz = W.z;
  A.wshift = vgct_cuda_test_sel[3];
  bool ran = false;
  const cudaError_t e = launch_sel_cbuf(ws, dev, A, A.nbuf, s, &ran);
  if (e != cudaSuccess) return e;
  if (ran) {
    ++vgct_cuda_test_cbuf_last[0]; /* (launches: see above) */
    return cudaSuccess;
  }
  return buf_levels(ws, A, 0, s);
}

/* The plan's first launches: the workspace cleared, the sample, its order
 * statistics at the windows' sample ranks (on the device, no round trip);
 * with V (the fused window): k_sel_sample's last block leaves the window to
 * the record or not (win_early: the levels then return at once), and
 * k_win_count writes window 0's bounds into the WinState (the fused pass's
 * input) and chooses the reduction's other ways (force: its hook). */
static int win_start(CallCtx &cx, const KArgs &B, WinRun *run, const WinVerdict *V, int force) {
  DevWS *ws = cx.ws;
  char *d = ws->d_ws;
  const WinPlan &W = run->W;
  int rc = VGCT_OK;
  WIN_CK(cudaMemsetAsync(d + WS_SEL_CNT, 0, WS_SEL_CLEAR_END - WS_SEL_CNT, cx.stream),
         "cudaMemsetAsync (select workspace)");
  {
    SArgs S = run->S;
    if (V) {
      S.w = run->WA.w;
      S.sst = (SelState *)run->WA.sst;
      S.counter = (unsigned *)(d + WS_SEL_CNT) + CNT_EARLY;
      S.V = *V;
      S.V.wph[0] = W.phl[0]; /* window 0's sample ranks as win_levels passes them */
      S.V.wph[1] = W.phh[0];
      S.V.wz = W.z;
      S.V.wshift = vgct_cuda_test_sel[3];
    }
    WIN_CK(dispatch_sel_sample((int)cdiv(S.nsc, WT), S, cx.stream), "k_sel_sample launch");
  }
  WIN_CK(win_levels(ws, cx.dev, B, run, cx.stream), "the sample's selection launch");
  if (V) {
    const int64_t gc = cdiv(run->skeys, (int64_t)WT * 16);
    k_win_count<<<(int)(gc < ws->sms ? (gc < 1 ? 1 : gc) : ws->sms), WT, 0, cx.stream>>>(
        run->WA, (long long)run->skeys, (unsigned *)(d + WS_SEL_CNT) + CNT_WIN, force);
    WIN_CK(cudaGetLastError(), "k_win_count launch");
  }
wout:
  return rc;
}

/* After a fused plan's reduction that did not count the window (the record
 * was left to answer and did not, or the ring kernel did not run): the
 * sample's levels again, which win_early may have skipped, from a cleared
 * select workspace -- the sample's keys lie above it (WS_SEL_CAND), and the
 * reduction without a window wrote nothing there; its block partials (in the
 * histograms) are merged already -- so that the window plan's own pass has
 * its bounds. */
static int win_resume(CallCtx &cx, const KArgs &B, const WinRun *run) {
  char *d = cx.ws->d_ws;
  int rc = VGCT_OK;
  WIN_CK(cudaMemsetAsync(d + WS_SEL_CNT, 0, WS_SEL_CLEAR_END - WS_SEL_CNT, cx.stream),
         "cudaMemsetAsync (select workspace)");
  WIN_CK(win_levels(cx.ws, cx.dev, B, run, cx.stream), "the sample's selection launch");
wout:
  return rc;
}

/* After win_start (and, when run->fused, the reduction that counted window
 * 0): the window pass unless fused, its counts to the host, and every rank
 * ub[j] (distinct, ascending) that falls inside a window answered: vals[j],
 * done[j]; the others are left to the radix path. */
static int win_answer(CallCtx &cx, const KArgs &B, const vgct_params *p, WinRun *run,
                      const int64_t *ub, int nu, double *vals, unsigned char *done, char *err,
                      size_t errlen) {
  DevWS *ws = cx.ws;
  long long *R = vgct_cuda_test_sel_last;
  char *d = ws->d_ws;
  const WinPlan &W = run->W;
  const WArgs &WA = run->WA;
  WinState *wst = WA.w;
  unsigned long long *cand = WA.cand;
  int rc = VGCT_OK;
  int64_t *irk = NULL;
  if (!run->fused)
    WIN_CK(dispatch_sel_window((int)run->gw, WA, cx.stream), "k_sel_window launch");
  if (!run->copied) { /* (a fused window's counts came back with the record) */
    WIN_CK(cudaMemcpyAsync(ws->h_pin, wst, sizeof(WinState), cudaMemcpyDeviceToHost, cx.stream),
           "cudaMemcpyAsync (window counts)");
    WIN_CK(cx.sync(), "cudaStreamSynchronize (select windows)");
    cx.mark("window pass");
  }
  {
    WinState h;
    memcpy(&h, ws->h_pin + (run->copied ? VG_PIN_WIN : 0u), sizeof h);
    R[0] = W.nw;
    if (run->fused) {
      /* the reduction's own pass: its finite count is the pass's; window 0's
         keys below lo are the rest of them */
      h.total = (unsigned long long)p->expect_finite;
      h.lt[0] = h.total - h.ge;
    } else if (p->expect_finite >= 0 && h.total != (unsigned long long)p->expect_finite) {
      snprintf(err, errlen,
               "input changed during compare: %lld finite pairs in the reduction, %llu in the "
               "quantile window pass (do not write into the inputs while compare() reads them)",
               (long long)p->expect_finite, h.total);
      rc = VGCT_ECHANGED;
      goto wout;
    }
    if (vgct_interrupted(p)) { /* Ctrl-C after the pass over the data */
      snprintf(err, errlen, "vgct_cuda_select: interrupted after the quantile window pass");
      rc = VGCT_EINTR;
      goto wout;
    }
    for (int g = 0; g < W.nw; ++g) R[3] += h.pos[g] > (unsigned long long)WA.cap[g];
    vgct_cuda_test_win_last[0] = (long long)h.lt[0];
    vgct_cuda_test_win_last[1] = (long long)h.eql[0];
    vgct_cuda_test_win_last[2] = (long long)h.eqh[0];
    vgct_cuda_test_win_last[3] = (long long)h.pos[0];
    /* each rank: a pivot's value, a rank among the window's stored keys, or
       not covered (left to the radix path) */
    irk = (int64_t *)malloc((sizeof(int64_t) + 2 * sizeof(int)) * (size_t)nu);
    if (!irk) {
      snprintf(err, errlen, "vgct_cuda_select: out of host memory");
      rc = VGCT_ENOMEM;
      goto wout;
    }
    int *iix = (int *)(irk + nu), *iwin = iix + nu;
    int nin = 0;
    for (int j = 0; j < nu; ++j) {
      if (done[j]) continue;
      const unsigned long long r = (unsigned long long)ub[j];
      for (int g = 0; g < W.nw; ++g) {
        const unsigned long long st = h.pos[g];
        if (st > (unsigned long long)WA.cap[g]) continue; /* overflowed */
        if (h.lo[g] > h.hi[g]) continue;                  /* not reached: lo <= hi */
        const unsigned long long a = h.lt[g], b = a + h.eql[g], c = b + st, e = c + h.eqh[g];
        if (r < a || r >= e) continue;
        if (r < b || r >= c) {
          vals[j] = vgct_f64_from_bits(r < b ? h.lo[g] : h.hi[g]);
          done[j] = 1;
          ++R[1];
        } else {
          irk[nin] = (int64_t)(r - b);
          iix[nin] = j;
          iwin[nin] = g;
          ++nin;
        }
        break;
      }
    }
    /* the stored ranks: per window, batches of SEL_NS ranks (one state slot
       each), NSLOT_WSEL batches a round, one host round trip a round */
    int g = 0, at = 0; /* the next entry: window g, scanning from entry `at` */
    while (g < W.nw) {
      int bg[NSLOT_WSEL], bn[NSLOT_WSEL], bix[NSLOT_WSEL][SEL_NS];
      int nb = 0;
      while (nb < NSLOT_WSEL && g < W.nw) {
        int cnt = 0;
        for (; at < nin && cnt < SEL_NS; ++at)
          if (iwin[at] == g) bix[nb][cnt++] = at;
        if (cnt > 0) {
          bg[nb] = g;
          bn[nb] = cnt;
          ++nb;
        }
        if (at >= nin) {
          ++g;
          at = 0;
        }
      }
      if (nb == 0) break;
      /* a region of at most FIN_CAP keys: one k_sel_fin block (direct); more:
         k_sel_cbuf (coopb) where it can run, else the levels */
      bool direct[NSLOT_WSEL], coopb[NSLOT_WSEL];
      for (int k = 0; k < nb; ++k) {
        direct[k] = fin_on() && h.pos[bg[k]] <= (unsigned long long)FIN_CAP;
        coopb[k] = !direct[k] && cbuf_can(ws, cx.dev, (long long)h.pos[bg[k]], bn[k]);
      }
      /* the batches' states and, when the first takes the levels, the histograms
         too: one memset (the slots between them, the window pass's WinState
         among them, were read above: not needed on the device any more) */
      bool hist_zero = !direct[0] && !coopb[0];
      WIN_CK(cudaMemsetAsync(d + WS_SEL_STATE + SLOT_WSEL * SEL_SLOT, 0,
                             hist_zero ? WS_SEL_CLEAR_END - (WS_SEL_STATE + SLOT_WSEL * SEL_SLOT)
                                       : NSLOT_WSEL * SEL_SLOT,
                             cx.stream),
             "cudaMemsetAsync (select states)");
      for (int k = 0; k < nb; ++k) {
        KArgs A = B;
        A.store_all = 0;
        A.compact = 0;
        A.sample = 0;
        A.cand = cand + WA.off[bg[k]];
        A.nbuf = (long long)h.pos[bg[k]];
        A.st = (SelState *)(d + WS_SEL_STATE + (SLOT_WSEL + k) * SEL_SLOT);
        A.ns = bn[k];
        for (int s = 0; s < SEL_NS; ++s) A.rank0[s] = s < bn[k] ? (long long)irk[bix[k][s]] : 0;
        bool ran = false; /* coopb: k_sel_cbuf launched */
        if (coopb[k])
          WIN_CK(launch_sel_cbuf(ws, cx.dev, A, A.nbuf, cx.stream, &ran), "k_sel_cbuf launch (window)");
        if (direct[k]) { /* few stored keys: selected among by one block */
          WIN_CK(launch_sel_fin(ws, 1, A, 1, 0, cx.stream), "k_sel_fin launch (window)");
          ++vgct_cuda_test_fin_last[4];
        } else if (ran) { /* more: one cooperative grid (it leaves the histograms dirty) */
          ++vgct_cuda_test_cbuf_last[1];
          hist_zero = false;
        } else {
          /* a region of more than FIN_CAP keys spans a narrow range of values (the
             window), so its level-0 bucket rarely fits the finish: levels 0 and 1,
             then the finish over the rank's level-1 bucket (buf_levels) */
          if (!hist_zero)
            WIN_CK(cudaMemsetAsync(d + WS_SEL_HIST, 0, WS_SEL_CLEAR_END - WS_SEL_HIST, cx.stream),
                   "cudaMemsetAsync (select histograms)");
          WIN_CK(buf_levels(ws, A, 1, cx.stream), "k_sel_buf launch (window)");
          hist_zero = false;
        }
      }
      WIN_CK(cudaMemcpyAsync(ws->h_pin, d + WS_SEL_STATE + SLOT_WSEL * SEL_SLOT,
                             (size_t)nb * SEL_SLOT, cudaMemcpyDeviceToHost, cx.stream),
             "cudaMemcpyAsync (window selections)");
      WIN_CK(cx.sync(), "cudaStreamSynchronize (select windows)");
      cx.mark("window selections");
      for (int k = 0; k < nb; ++k) {
        SelState hs;
        memcpy(&hs, ws->h_pin + (size_t)k * SEL_SLOT, sizeof hs);
        if (hs.bad) continue; /* not reached (ranks < stored): left to the radix path */
        vgct_cuda_test_fin_last[5] += !direct[k] && !coopb[k] && hs.fin;
        for (int s = 0; s < bn[k]; ++s) {
          const int j = iix[bix[k][s]];
          vals[j] = vgct_f64_from_bits(hs.prefix[s]);
          done[j] = 1;
          ++R[2];
        }
      }
      if (g < W.nw && vgct_interrupted(p)) { /* Ctrl-C between rounds */
        snprintf(err, errlen, "vgct_cuda_select: interrupted between quantile window selections");
        rc = VGCT_EINTR;
        goto wout;
      }
    }
  }
wout:
  free(irk);
  return rc;
}

/* The window plan (the header comment) within vgct_cuda_select: answers the
 * ranks ub[j] (distinct, ascending) that fall inside a window, setting
 * vals[j] and done[j]; the others are left to the radix path.  B: the call's
 * KArgs (iteration). */
static int sel_windows(CallCtx &cx, const KArgs &B, const vgct_params *p, const int64_t *ub, int nu,
                       double *vals, unsigned char *done, char *err, size_t errlen) {
  const int64_t nf = p->expect_finite >= 0 ? p->expect_finite : B.it.m; /* else: all finite, a guess */
  WinRun run;
  win_plan(cx.ws, B, nf, ub, nu, &run);
  if (run.W.nw == 0) return VGCT_OK;
  int rc = win_start(cx, B, &run, NULL, 0);
  if (rc != VGCT_OK) return rc;
  return win_answer(cx, B, p, &run, ub, nu, vals, done, err, errlen);
}
#undef WIN_CK

static int sel_run(CallCtx &cx, const vgct_view *a, const vgct_view *e, const vgct_params *p,
                   const int64_t *ranks, int nranks, double *values, WinRun *pre, char *err,
                   size_t errlen);

extern "C" int vgct_cuda_select(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                                uintptr_t stream, const int64_t *ranks, int nranks,
                                double *values, char *err, size_t errlen) {
  vgct_cuda_test_cbuf_last[0] = vgct_cuda_test_cbuf_last[1] = 0;
  static_assert(WS_SEL_CLEAR_END <= WS_SEL_CAND, "select workspace layout");
  static_assert(WS_SEL_FREG + (size_t)FIN_CAP * 8 <= VG_WS_BYTES, "select workspace size");
  static_assert(FIN_SMEM <= SEL_SMEM, "k_sel_fin's shared memory");
  static_assert(4 * (CNT_FIN + 1) <= 64 && WS_SEL_CNT + 64 <= WS_SEL_FIN &&
                WS_SEL_FIN + sizeof(FinState) <= WS_SEL_STATE, "k_sel_fin scratch in the zeroed range");
  static_assert(sizeof(SelState) <= SEL_SLOT && sizeof(WinState) <= SEL_SLOT, "state slot");
  static_assert(WS_SEL_STATE + 8 * SEL_SLOT <= WS_SEL_HIST && SLOT_WSEL + NSLOT_WSEL <= SLOT_WIN,
                "state slots");
  static_assert(2 * WIN_MAXW <= SEL_NS, "sample ranks");
  static_assert(WIN_SMAX + (int64_t)WIN_RUN * 16 <= (int64_t)SEL_CAP, "sample size");
  if (nranks <= 0) return VGCT_OK;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r] < 0) {
      snprintf(err, errlen, "vgct_cuda_select: rank %lld is negative", (long long)ranks[r]);
      return VGCT_EVALUE;
    }
  const int64_t n = vgct_numel(a);
  if (n == 0) {
    snprintf(err, errlen, "vgct_cuda_select: rank %lld out of range [0, 0)", (long long)ranks[0]);
    return VGCT_EVALUE;
  }
  CallCtx cx("vgct_cuda_select", a->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  return sel_run(cx, a, e, p, ranks, nranks, values, NULL, err, errlen);
}

/* The data passes' chunks: CH pairs along each inner row (cpr a row, its
 * FastDiv), nchunk in all. */
static void sel_chunks(const IterSpec &it, int64_t *nchunk, int64_t *cpr, FastDiv *cprd) {
  const int CH = vg_chunk_elems(it.da, it.de);
  const int64_t L = it.sh[it.k - 1];
  *cpr = cdiv(L, CH);
  *cprd = vg_make_div((uint64_t)*cpr);
  *nchunk = (it.m / L) * *cpr;
}

/* The KArgs of the selection's data passes over `it` (the whole tensor). */
static void sel_kargs(DevWS *ws, const IterSpec &it, KArgs *A) {
  memset(A, 0, sizeof *A);
  A->it = it;
  sel_chunks(it, &A->nchunk, &A->cpr, &A->cprd);
  A->st = (SelState *)(ws->d_ws + WS_SEL_STATE + SLOT_RADIX * SEL_SLOT);
  A->cand = (unsigned long long *)(ws->d_ws + WS_SEL_CAND);
  A->nbuf = -1;
}

/* vgct_cuda_select's body inside the caller's CallCtx (ranks checked, n > 0);
 * pre: a window plan started before the reduction (vgct_cuda_compare), whose
 * answers replace the window plan's own. */
static int sel_run(CallCtx &cx, const vgct_view *a, const vgct_view *e, const vgct_params *p,
                   const int64_t *ranks, int nranks, double *values, WinRun *pre, char *err,
                   size_t errlen) {
  IterSpec it;
  int rc = vg_prepare(a, e, -1, &it, err, errlen);
  if (rc) return rc;
  DevWS *ws = cx.ws;
  if (ws->smem_optin < SEL_SMEM) {
    snprintf(err, errlen, "vgct_cuda_select: device %d allows %zu bytes of shared memory per block, "
             "%d needed", cx.dev, ws->smem_optin, SEL_SMEM);
    return VGCT_ECUDA;
  }
  const long long plan = vgct_cuda_test_sel[0];
  long long *R = vgct_cuda_test_sel_last;
  for (int i = 0; i < 6; ++i) R[i] = 0;
  for (int i = 0; i < 7; ++i) vgct_cuda_test_fin_last[i] = 0;

  /* distinct ranks, ascending */
  int64_t uniq[2 * 64];
  int64_t *ubuf = nranks <= 128 ? uniq : (int64_t *)malloc(sizeof(int64_t) * (size_t)nranks);
  if (!ubuf) {
    snprintf(err, errlen, "vgct_cuda_select: out of host memory");
    return VGCT_ENOMEM;
  }
  const int nu = vg_distinct_ascending(ranks, nranks, ubuf);

  KArgs A;
  sel_kargs(ws, it, &A);
  /* the data passes: one block per SM (128 KiB of shared counters each), on
     every SM as soon as each thread has a chunk (zeroing and flushing a
     block's counters costs about as much as a few chunks a thread) */
  const int gdata = (int)(cdiv(A.nchunk, ST) < ws->sms ? cdiv(A.nchunk, ST) : ws->sms);
  const bool small = (uint64_t)it.m <= SEL_CAP && plan != 3;
  SelState hs;
  memset(&hs, 0, sizeof hs);
  /* vals[j], done[j] for ubuf[j]; rem/remi: the ranks left to the radix path */
  double *vals = (double *)malloc((sizeof(double) + 1 + sizeof(int64_t) + sizeof(int)) * (size_t)nu);
  if (!vals) {
    if (ubuf != uniq) free(ubuf);
    snprintf(err, errlen, "vgct_cuda_select: out of host memory");
    return VGCT_ENOMEM;
  }
  int64_t *rem = (int64_t *)(vals + nu);
  int *remi = (int *)(rem + nu);
  unsigned char *done = (unsigned char *)(remi + nu);
  memset(done, 0, (size_t)nu);
  int nrem = 0;

  if (pre) {
    rc = win_answer(cx, A, p, pre, ubuf, nu, vals, done, err, errlen);
    if (rc != VGCT_OK) goto out;
  } else if (plan == 1 || (plan == 0 && it.m >= SEL_WIN_MIN)) {
    rc = sel_windows(cx, A, p, ubuf, nu, vals, done, err, errlen);
    if (rc != VGCT_OK) goto out;
  }
  for (int j = 0; j < nu; ++j)
    if (!done[j]) {
      rem[nrem] = ubuf[j];
      remi[nrem++] = j;
    }
  R[4] = nrem;
  if (nrem > 0) R[5] = small ? 1 : 2;

#define SEL_CK(call, what)        \
  if (!cx.check((call), what)) {  \
    rc = cx.rc;                   \
    goto out;                     \
  }
  for (int b0 = 0; b0 < nrem; b0 += SEL_NS) {
    const int ns = nrem - b0 < SEL_NS ? nrem - b0 : SEL_NS;
    A.ns = ns;
    for (int s = 0; s < SEL_NS; ++s) A.rank0[s] = s < ns ? (long long)rem[b0 + s] : 0;
    /* the state, counters and histograms cleared */
    SEL_CK(cudaMemsetAsync(ws->d_ws + WS_SEL_CNT, 0, WS_SEL_CLEAR_END - WS_SEL_CNT, cx.stream),
           "cudaMemsetAsync (select workspace)");
    int level = 0;
    /* level 0 over the data (and, for small n, keep every key) */
    A.level = 0;
    A.store_all = small;
    A.compact = 0;
    A.nbuf = -1;
    A.hist = (unsigned long long *)(ws->d_ws + WS_SEL_HIST);
    A.counter = (unsigned *)(ws->d_ws + WS_SEL_CNT);
    SEL_CK(dispatch_sel_data(gdata, A, cx.stream), "k_sel_data launch (level 0)");
    cx.mark("level0");
    int64_t nbuf = small ? it.m : 0; /* keys the buffer passes read (upper bound) */
    if (!small) {
      /* decide on the host: compaction when the wanted buckets are small */
      for (;;) {
        SEL_CK(cudaMemcpyAsync(ws->h_pin, A.st, sizeof(SelState), cudaMemcpyDeviceToHost, cx.stream),
               "cudaMemcpyAsync (select state)");
        SEL_CK(cx.sync(), "cudaStreamSynchronize (select)");
        memcpy(&hs, ws->h_pin, sizeof hs);
        if (hs.bad || level == 4) break;
        if (vgct_interrupted(p)) { /* Ctrl-C between the passes over the data */
          snprintf(err, errlen, "vgct_cuda_select: interrupted at level %d", level);
          rc = VGCT_EINTR;
          goto out;
        }
        unsigned long long tot = 0;
        for (int g = 0; g < hs.ng; ++g)
          for (int s = 0; s < ns; ++s)
            if (hs.slot_group[s] == g) {
              tot += hs.count[s];
              break;
            }
        if (tot <= SEL_CAP) {
          A.level = -1;
          A.store_all = 0;
          A.compact = 1;
          A.clevel = level;
          SEL_CK(dispatch_sel_data(gdata, A, cx.stream), "k_sel_data launch (compaction)");
          A.compact = 0;
          nbuf = (int64_t)tot;
          break;
        }
        ++level; /* heavy ties: one more digit over the data */
        A.level = level;
        A.store_all = 0;
        A.compact = 0;
        A.hist = (unsigned long long *)(ws->d_ws + WS_SEL_HIST + (size_t)level * SEL_BINS * 8);
        A.counter = (unsigned *)(ws->d_ws + WS_SEL_CNT) + level;
        SEL_CK(dispatch_sel_data(gdata, A, cx.stream), "k_sel_data launch (narrowing)");
      }
    }
    bool levels = !(level == 4 || (!small && hs.bad));
    if (levels && small && fin_on()) {
      /* store-all: the finish after level 0, then the state (one round trip); the
         levels only when it could not answer every rank */
      A.nbuf = it.m;
      SEL_CK(launch_sel_fin(ws, sel_buf_grid(ws, it.m), A, 0, 0, cx.stream), "k_sel_fin launch");
      SEL_CK(cudaMemcpyAsync(ws->h_pin, A.st, sizeof(SelState), cudaMemcpyDeviceToHost, cx.stream),
             "cudaMemcpyAsync (select finish)");
      SEL_CK(cx.sync(), "cudaStreamSynchronize (select finish)");
      cx.mark("finish+memcpy+sync");
      memcpy(&hs, ws->h_pin, sizeof hs);
      long long *F = vgct_cuda_test_fin_last;
      ++F[0];
      F[1] += hs.fin_ties;
      F[2] += hs.fin_selected;
      if (!hs.fin && !hs.bad) ++F[3];
      levels = !hs.fin && !hs.bad;
    }
    if (levels) {
      const int gbuf = sel_buf_grid(ws, nbuf);
      A.nbuf = small ? it.m : -1; /* store-all: every key; else the compaction's count */
      for (int lv = level + 1; lv <= 4; ++lv) {
        A.level = lv;
        A.compact = 0;
        A.hist = (unsigned long long *)(ws->d_ws + WS_SEL_HIST + (size_t)lv * SEL_BINS * 8);
        A.counter = (unsigned *)(ws->d_ws + WS_SEL_CNT) + lv;
        SEL_CK(launch_sel_buf(gbuf, A, cx.stream), "k_sel_buf launch");
      }
      cx.mark("buf levels");
      SEL_CK(cudaMemcpyAsync(ws->h_pin, A.st, sizeof(SelState), cudaMemcpyDeviceToHost, cx.stream),
             "cudaMemcpyAsync (select result)");
      SEL_CK(cx.sync(), "cudaStreamSynchronize (select)");
      cx.mark("memcpy+sync");
      memcpy(&hs, ws->h_pin, sizeof hs);
    }
    if (p->expect_finite >= 0 && hs.total != (unsigned long long)p->expect_finite) {
      /* the reduction counted other finite pairs: an input was written meanwhile */
      snprintf(err, errlen,
               "input changed during compare: %lld finite pairs in the reduction, %llu in the "
               "quantile pass (do not write into the inputs while compare() reads them)",
               (long long)p->expect_finite, hs.total);
      rc = VGCT_ECHANGED;
      goto out;
    }
    if (hs.bad) {
      int64_t worst = rem[b0 + ns - 1];
      snprintf(err, errlen, "vgct_cuda_select: rank %lld out of range [0, %llu)", (long long)worst,
               hs.total);
      rc = VGCT_EVALUE;
      goto out;
    }
    for (int s = 0; s < ns; ++s) vals[remi[b0 + s]] = vgct_f64_from_bits(hs.prefix[s]);
    if (b0 + SEL_NS < nrem && vgct_interrupted(p)) { /* Ctrl-C between rank batches */
      snprintf(err, errlen, "vgct_cuda_select: interrupted after %d of %d ranks", nu - nrem + b0 + ns,
               nu);
      rc = VGCT_EINTR;
      goto out;
    }
  }
  for (int r = 0; r < nranks; ++r)
    for (int j = 0; j < nu; ++j)
      if (ubuf[j] == ranks[r]) values[r] = vals[j];
out:
#undef SEL_CK
  free(vals);
  if (ubuf != uniq) free(ubuf);
  return rc;
}

/* The chained selection's answers (k_sel_tiny's or, coop, k_sel_coop's
 * TinyOut, read after the one wait): values[i] = the key at ranks[i] (n >= 0
 * of them: the ranks the host left to the selection, from the same record the
 * kernel read; the kernel answered exactly their distinct values), or the
 * input-changed error (the kernel's finite count against the record's
 * n_finite), or an internal error when the kernel answered other ranks.
 * Sets the selection's test hooks. */
static int tiny_answer(const DevWS *ws, const vgct_params *p, const int64_t *ranks, int n, bool coop,
                       double *values, char *err, size_t errlen) {
  static_assert(VG_PIN_TINY + sizeof(TinyOut) <= VG_PIN_DONE, "h_pin: TinyOut below the words");
  const char *kn = coop ? "the mid-size call's selection (k_sel_coop)"
                        : "the small call's selection (k_sel_tiny)";
  TinyOut h;
  memcpy(&h, ws->h_pin + VG_PIN_TINY, sizeof h);
  vgct_cuda_test_fin_last[6] = coop ? 0 : h.batches;
  vgct_cuda_test_sel_last[4] = h.nr;
  vgct_cuda_test_sel_last[5] = h.keyed ? (coop ? 4 : 3) : 0;
  vgct_cuda_test_coop_last[0] = coop ? h.grid : 0;
  vgct_cuda_test_coop_last[1] = coop ? h.passes : 0;
  vgct_cuda_test_coop_last[2] = coop ? h.batches : 0;
  if (h.bad || h.nr < 0 || h.nr > 2 * VGCT_MAX_QUANTILES) {
    snprintf(err, errlen, "vgct_cuda_compare: %s came back bad (nr %d): an internal error", kn, h.nr);
    return VGCT_ECUDA;
  }
  if (h.changed) { /* the reduction counted other finite pairs: an input was written meanwhile */
    snprintf(err, errlen,
             "input changed during compare: %lld finite pairs in the reduction, %llu in the "
             "quantile pass (do not write into the inputs while compare() reads them)",
             (long long)p->expect_finite, h.total);
    return VGCT_ECHANGED;
  }
  int nd = 0; /* the distinct ranks: what the kernel must have answered */
  for (int i = 0; i < n; ++i) {
    int j = 0;
    while (j < i && ranks[j] != ranks[i]) ++j;
    nd += j == i;
  }
  if (nd != h.nr) {
    snprintf(err, errlen, "vgct_cuda_compare: %s answered %d ranks, %d asked: an internal error", kn,
             h.nr, nd);
    return VGCT_ECUDA;
  }
  for (int i = 0; i < n; ++i) {
    int j = 0;
    while (j < h.nr && h.rank[j] != ranks[i]) ++j;
    if (j == h.nr) {
      snprintf(err, errlen, "vgct_cuda_compare: %s did not answer rank %lld (%d ranks answered): an "
               "internal error", kn, (long long)ranks[i], h.nr);
      return VGCT_ECUDA;
    }
    values[i] = vgct_f64_from_bits(h.key[j]);
  }
  return VGCT_OK;
}

/* vgct_cuda_compare (vgct_engine.h): the reduction and the quantiles' order
 * statistics in one call holding the device.  When the window plan would run
 * (n >= SEL_WIN_MIN, one window) and the reduction runs k_reduce_bulk
 * (vg_reduce_can_fuse), the plan's sample and window bounds come first, and
 * the reduction counts the window in its own pass: the exact quantiles
 * without a pass over the inputs of their own.  The windows are predicted for
 * the ranks at n_finite = n (all finite, the usual case: the reduction's count
 * is not known yet); a rank they miss goes to the radix path, as always. */
extern "C" int vgct_cuda_compare(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                                 uintptr_t stream, const double *qs, int nq, vgct_acc *out,
                                 vgct_slice_acc *slices, double *values, char *err,
                                 size_t errlen) {
  static_assert(sizeof(WinState) <= SEL_SLOT, "state slot");
  static_assert(4 * (CNT_WIN + 1) <= 64 && 4 * (CNT_EARLY + 1) <= 64,
                "k_win_count's and win_early's counters in the zeroed counters");
  vgct_cuda_test_fuse_last = 0;
  vgct_cuda_test_resume_last = 0;
  vgct_cuda_test_known_last[0] = vgct_cuda_test_known_last[1] = 0;
  vgct_cuda_test_cbuf_last[0] = vgct_cuda_test_cbuf_last[1] = 0;
  if (nq < 0 || nq > VGCT_MAX_QUANTILES) {
    snprintf(err, errlen, "vgct_cuda_compare: %d quantiles (0 to %d)", nq, VGCT_MAX_QUANTILES);
    return VGCT_EVALUE;
  }
  if (vgct_numel(a) == 0) /* no device work: no finite pair, no quantile */
    return vgct_cuda_reduce(a, e, p, stream, out, slices, err, errlen);
  CallCtx cx("vgct_cuda_compare", a->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  const long long syncs0 = __atomic_load_n(&vgct_cuda_test_syncs, __ATOMIC_RELAXED);
  DevWS *ws = cx.ws;
  const int64_t m = vgct_numel(a);
  const long long plan = vgct_cuda_test_sel[0];
  WinRun run;
  KArgs B; /* the fused plan's (pre) */
  VgWinFuse wf;
  memset(&wf, 0, sizeof wf);
  bool pre = false, skip = false;
  int64_t grid = 0;
  int rc = VGCT_OK;
  if (nq > 0 && (plan == 1 || (plan == 0 && m >= SEL_WIN_MIN)) && ws->smem_optin >= SEL_SMEM &&
      (m >= WIN_FUSE_MIN || vgct_cuda_test_fuse >= 2) && vg_reduce_can_fuse(ws, a, e, p, &grid) &&
      (size_t)grid * sizeof(vgct_acc) <= WS_SEL_CLEAR_END - WS_SEL_HIST) {
    IterSpec it;
    if ((rc = vg_prepare(a, e, -1, &it, err, errlen)) != VGCT_OK) return rc;
    sel_kargs(ws, it, &B);
    int64_t rk[2 * VGCT_MAX_QUANTILES], ub[2 * VGCT_MAX_QUANTILES];
    for (int i = 0; i < nq; ++i) { /* the ranks at n_finite = m */
      double gm;
      vgct_quantile_ranks(m, qs[i], &rk[2 * i], &rk[2 * i + 1], &gm);
    }
    const int nu = vg_distinct_ascending(rk, 2 * nq, ub);
    win_plan(ws, B, m, ub, nu, &run);
    if (run.W.nw == 1) {
      /* the reduction's way chosen on the device (WinState::mode): a window
         that the reduction's record will most likely answer (win_record_answers:
         an identical pair, sparse differences) is left to it by k_sel_sample's
         last block, before the sample's levels, which then return at once --
         when the record does not answer after all, the levels run again and the
         window plan's own pass counts it (win_resume) -- else k_win_count picks
         the sparse way or every pair classified */
      WinVerdict V;
      memset(&V, 0, sizeof V);
      V.ubmax = -1;
      for (int j = 0; j < nu; ++j)
        if (ub[j] != m - 1 && ub[j] > V.ubmax) V.ubmax = ub[j];
      V.m = m;
      V.spad = run.spad;
      V.rule = vgct_cuda_test_fuse == 2 ? 2
               : (vgct_cuda_test_known == 0 && (vgct_cuda_test_fuse == 0 || vgct_cuda_test_fuse == 5))
                   ? 1 : 0;
      const int force = vgct_cuda_test_fuse == 4 ? 1 : vgct_cuda_test_fuse == 3 ? 2 : 0;
      if ((rc = win_start(cx, B, &run, &V, force)) != VGCT_OK) return rc;
      pre = true; /* the window plan is started either way; its pass runs after the reduce */
      wf.w = run.WA.w;
      wf.cand = run.WA.cand + run.WA.off[0];
      wf.cap = run.WA.cap[0];
      /* the reduce's block partials where the window plan has no live data during
         the reduction: the histograms (the selections after it clear them first) */
      wf.part = (vgct_acc *)(ws->d_ws + WS_SEL_HIST);
    }
  }
  /* a small or mid-size call: its selection chained behind the reduction
     (k_sel_tiny: one block, up to TINY_CAP pairs; k_sel_coop: a cooperative
     grid, each block's keys in its shared memory), so that the host waits
     once for the record and the quantiles */
  CoopChain X;
  TArgs &T = X.C.t;
  VgChain chain;
  memset(&chain, 0, sizeof chain);
  bool coop = false;
  if (nq > 0 && !pre && (plan == 0 || plan == 2) && fin_tiny_on() && ws->d_pin != NULL) {
    const long long cm = vgct_cuda_test_coop[0];
    const bool tiny_ok = m <= TINY_CAP && cm != 2 && ws->smem_optin >= (size_t)TINY_SMEM + TINY_STATIC;
    /* k_sel_coop past TINY_PREFER pairs (or where k_sel_tiny cannot), up to
       SEL_CAP: above it the window plan, as before (k_sel_coop's capacity, about
       sms x COOP_KEYS pairs, reaches past it on large devices: not measured) */
    const bool coop_try = plan == 0 && cm != 1 && ws->coop && m <= (int64_t)SEL_CAP &&
                          ws->smem_optin >= (size_t)COOP_SMEM + COOP_STATIC &&
                          (cm >= 2 || !tiny_ok || m > TINY_PREFER);
    if (tiny_ok || coop_try) {
      memset(&X, 0, sizeof X);
      if ((rc = vg_prepare(a, e, -1, &T.it, err, errlen)) != VGCT_OK) return rc;
      sel_chunks(T.it, &T.nchunk, &T.cpr, &T.cprd);
      T.nq = nq;
      T.known = vgct_cuda_test_known == 0;
      T.plant = vgct_cuda_test_tiny_plant == 1;
      for (int i = 0; i < nq; ++i) T.q[i] = qs[i];
      T.out = (TinyOut *)(ws->d_pin + VG_PIN_TINY);
      if (coop_try && coop_plan(ws, m, T.nchunk, vg_chunk_elems(T.it.da, T.it.de), &X.grid, &X.C.cpb) &&
          coop_ready(T.it.da, T.it.de, a->device_id)) {
        X.C.slot = (CoopSlot *)(ws->d_ws + WS_COOP_SLOT);
        X.C.arrive = (unsigned *)(ws->d_ws + WS_COUNTER);
        X.C.hist = (unsigned *)(ws->d_ws + WS_COOP_HIST);
        chain.launch = chain_sel_coop;
        chain.ctx = &X;
        coop = true;
      } else if (tiny_ok) {
        chain.launch = chain_sel_tiny;
        chain.ctx = &T;
      }
    }
  }
  vgct_cuda_test_coop_last[0] = vgct_cuda_test_coop_last[1] = vgct_cuda_test_coop_last[2] = 0;
  vgct_cuda_test_syncs_pre_last = __atomic_load_n(&vgct_cuda_test_syncs, __ATOMIC_RELAXED) - syncs0;
  rc = vg_reduce_run(cx, a, e, p, out, slices, pre ? &wf : NULL, chain.launch ? &chain : NULL, err,
                     errlen);
  if (rc != VGCT_OK) return rc;
  if (vgct_cuda_test_counter[0]) { /* test hook: the reduction's last-block counter after the call */
    unsigned c = 0xffffffffu;
    if (!cx.check(cudaMemcpyAsync(&c, ws->d_ws + WS_COUNTER, sizeof c, cudaMemcpyDeviceToHost, cx.stream),
                  "cudaMemcpyAsync (test hook: the counter)") ||
        !cx.check(cx.sync(), "cudaStreamSynchronize (test hook: the counter)"))
      return cx.rc;
    vgct_cuda_test_counter[1] = c;
  }
  if (vgct_cuda_test_gate_words[0]) { /* test hook: the gate words after the call */
    unsigned w[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
    if (!cx.check(cudaMemcpyAsync(w, ws->d_ws + WS_GATE, sizeof w, cudaMemcpyDeviceToHost, cx.stream),
                  "cudaMemcpyAsync (test hook: the gate words)") ||
        !cx.check(cx.sync(), "cudaStreamSynchronize (test hook: the gate words)"))
      return cx.rc;
    for (int i = 0; i < 3; ++i) vgct_cuda_test_gate_words[1 + i] = w[i];
  }
  if (chain.launched) { /* the hooks of the selection it replaces */
    for (int i = 0; i < 6; ++i) vgct_cuda_test_sel_last[i] = 0;
    for (int i = 0; i < 7; ++i) vgct_cuda_test_fin_last[i] = 0;
  }
  if (pre && wf.used) { /* the way the device chose, read with the record */
    WinState hv;
    memcpy(&hv, ws->h_pin + VG_PIN_WIN, sizeof hv);
    wf.mode = hv.mode;
    skip = hv.mode == VG_WIN_RECORD; /* the window not counted: its own pass counts it if needed */
  }
  vgct_cuda_test_fuse_last =
      pre ? (skip ? 2 : wf.used == 0 ? 0 : wf.mode == VG_WIN_EVERY ? 3 : 1) : 0;
  if (nq == 0 || out->n_finite == 0) return VGCT_OK;
  int64_t ranks[2 * VGCT_MAX_QUANTILES], sub[2 * VGCT_MAX_QUANTILES];
  double subv[2 * VGCT_MAX_QUANTILES];
  unsigned char known[2 * VGCT_MAX_QUANTILES];
  for (int i = 0; i < nq; ++i) {
    double gm;
    vgct_quantile_ranks(out->n_finite, qs[i], &ranks[2 * i], &ranks[2 * i + 1], &gm);
  }
  /* the ranks the record decides (zeros, the maximum): no selection for them */
  int left = 2 * nq;
  if (vgct_cuda_test_known == 0) left = vgct_ranks_known(out, ranks, 2 * nq, values, known);
  else memset(known, 0, sizeof known);
  vgct_cuda_test_known_last[0] = 2 * nq - left;
  vgct_cuda_test_known_last[1] = left;
  if (left == 0 && !chain.launched) return VGCT_OK;
  int k = 0;
  for (int j = 0; j < 2 * nq; ++j)
    if (!known[j]) sub[k++] = ranks[j];
  vgct_params p2 = *p;
  p2.expect_finite = out->n_finite; /* a different count: the inputs changed */
  if (chain.launched) {
    rc = tiny_answer(ws, &p2, sub, left, coop, subv, err, errlen);
    if (rc != VGCT_OK) return rc;
    k = 0;
    for (int j = 0; j < 2 * nq; ++j)
      if (!known[j]) values[j] = subv[k++];
    return VGCT_OK;
  }
  if (pre) {
    run.fused = !skip && wf.used != 0;
    run.copied = run.fused && wf.copied != 0;
    if (!run.fused) { /* the sample's levels may have been skipped (win_early): when
                         the ring kernel did not run (wf.used == 0) the host cannot
                         tell, and reruns them (redundant then; not reached while
                         vg_reduce_can_fuse and vg_reduce_run agree) */
      if ((rc = win_resume(cx, B, &run)) != VGCT_OK) return rc;
      vgct_cuda_test_resume_last = 1;
    }
  }
  rc = sel_run(cx, a, e, &p2, sub, left, subv, pre ? &run : NULL, err, errlen);
  if (rc != VGCT_OK) return rc;
  k = 0;
  for (int j = 0; j < 2 * nq; ++j)
    if (!known[j]) values[j] = subv[k++];
  return VGCT_OK;
}
