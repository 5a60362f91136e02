/*
 * reduce.cu -- vgct_cuda_reduce: every whole-tensor statistic (and the
 * per-slice ones for compare(dim=k)) in ONE pass over both inputs.
 *
 * What each kernel computes: every thread folds its pairs, in float64, into
 * a register accumulator (HotAcc: vgct_acc_update's finite branch statement
 * by statement, vgct_cuda_internal.cuh) and sends non-finite pairs (and the
 * scaled float64 update) through vgct_acc_update itself into its vgct_acc;
 * float16/bfloat16/float32 pairs go a chunk at a time through the fast path
 * (vg_fast_chunk: float64 sums and exact counts, the same whatever follows,
 * and float32 bounds that prove the chunk cannot change a maximum held in
 * the warp or -- thresholds shared by the grid, vg_gate_exchange -- anywhere;
 * else the maxima part of the definition, vgct_acc_maxima, pair by pair);
 * every VG_FLUSH pairs the registers are merged into that vgct_acc with
 * vgct_acc_merge -- in the fast path, whose registers hold no maximum, their
 * sums and counters added (vg_hot_flush_sums: the same record) -- two-level
 * sums.  The block folds its threads' vgct_acc with a fixed binary tree in
 * shared memory, each block writes one partial, and the last block to finish
 * (integer counter, vg_last_block) folds the partials in block order and
 * writes the result record (a whole-tensor
 * launch: straight into the mapped pinned host buffer, so the host reads it
 * after the stream's synchronisation with no copy launched, and into the
 * workspace too when a kernel chained behind it reads it there, VgChain;
 * with slices: the workspace, copied back).  No floating-point
 * atomics and a fixed element->thread->block assignment: bitwise repeatable.
 * Per-slice accumulators come from vgct_slice_from_acc (vgct_stats.h): a
 * block (row mode) or a thread (column mode) only ever sees one slice, and
 * the projection of its vgct_acc is that slice's vgct_slice_acc bit for bit
 * -- the slice statistics cost no extra arithmetic.
 *
 * Kernels (one template over (dtype_a, dtype_e, scaled); dtypes as
 * compile-time constants so vgct_load folds to one conversion):
 *   k_reduce_bulk  a typed pair whose rows are memory runs, on a device of
 *                  compute capability 9+: both inputs unit-stride after the
 *                  host's reordering (contiguous, or reversed), both bases
 *                  16-byte aligned (RL = 0); or (RL = 1, ring_layout) two
 *                  inner axes whose rows, 16-byte aligned, hold a multiple of
 *                  64 chunks (32 for pairs read as RB 1) -- a transposed matrix, rows
 *                  apart in memory, the slices of row mode (per-channel
 *                  statistics) -- a warp step copied one bulk copy a row it
 *                  touches (vg_ring_load; one copy when the rows are back to
 *                  back in memory, a transposed matrix, or when every block
 *                  lies inside one row: A.rrun), each chunk's
 *                  flat index stepped along its row (VgRowCur).
 *                  Each warp streams its own runs of chunks through a ring of 2
 *                  or 3 shared-memory stages filled by the copy engine
 *                  (cp.async.bulk + mbarrier; while a warp folds one stage,
 *                  the copies of the next are in flight; vg_bulk; before lane 0
 *                  refills a stage every lane fences its reads of it against
 *                  the copy's async-proxy writes, vg_stage_release).  Trade-off:
 *                  fastest (no registers for the bytes in flight), only for
 *                  those layouts; 36-48 KiB of ring on top of the 58 KiB of
 *                  per-thread records (vg_bulk::SMEM, ~94-106 KiB a block).
 *                  WIN = 1 or 2 (float16/bfloat16/float32 pairs): it also counts
 *                  the exact quantiles' key window (select.cu's window plan,
 *                  "the fused key window" below): two (WIN 1) or three
 *                  (WIN 2) chunks a lane and step for 16-bit pairs; +3 KiB
 *                  of stages.
 *   k_reduce_flat  the same layout otherwise (a misaligned base such as
 *                  bf16 x[1:], or a generic dtype pair): scalar loads, or
 *                  16-byte vector loads into registers, RU chunks in flight
 *                  per thread.  Trade-off: any alignment, fewer bytes in flight.
 *   k_reduce_gen   any strides (the layouts the ring does not take): per
 *                  chunk of CH elements along the inner
 *                  axis one row decomposition (FastDiv, no divides), vector
 *                  loads where the inner axis is unit-stride and the chunk
 *                  aligned; also per-slice "row mode" (slice axis outermost,
 *                  >= VG_ROW_MIN elements per slice, each block inside one
 *                  slice).  Trade-off: a few integer ops per chunk more.
 *   k_reduce_col   per-slice "column mode" (few elements per slice, e.g. the
 *                  channel axis innermost): one thread per slice, loads
 *                  coalesced across neighbouring slices.  Trade-off: only as
 *                  much parallelism as there are slices.
 *   k_reduce_lean  small unscaled inputs (at most VG_LEAN_MAX pairs, any
 *                  layout but column mode): every pair through the register
 *                  update (vg_pair), scalar loads, nothing unrolled, no gate.
 *                  Trade-off: ~70 instructions a pair, but no warm-up (the fast
 *                  path's first chunks of every warp fall back to the definition
 *                  until its gate holds maxima: 42% of the instructions of a
 *                  2^20 bf16 call, ncu 2026-12-01) and a smaller code path;
 *                  0.97-1.23x the fast path's speed up to 2^20 pairs (1.06 at
 *                  2^20), 0.84-0.93x at 2^22 (bench/bench_lean.py).
 * Dtype pairs outside the typed list (fp8, ints, bool, mixed rare pairs) run
 * the same kernels with run-time dtypes (DA = DE = -1): scalar loads through
 * the same vgct_load.  The block reduction: vg_block_merge (the field-parallel
 * merge for unscaled accumulators, the vgct_acc_merge tree for scaled ones;
 * cuda/vgct_cuda_internal.cuh).  Measured speed and its limits:
 * docs/performance.md.
 */
#include <stdio.h>
#include <string.h>
#include "vgct_cuda_internal.cuh"

#define RT 256       /* threads per block                               */
#define RU 2         /* chunks in flight per thread (4: slower, 2026-11-29) */

#define VG_ROW_MIN 4096 /* row mode when a slice has at least this many */
/* k_reduce_bulk counts a block's steps and whole chunks in 32 bits: the ring
   takes a launch only when its blocks hold fewer chunks than this */
#define VG_RING_CPB (INT64_C(1) << 30)

struct RArgs {
  IterSpec it;
  int64_t nchunk; /* chunks per slice                                   */
  int64_t cpr;    /* chunks per inner row (gen)                         */
  FastDiv cprd;
  int64_t rows;   /* inner rows per slice (col)                         */
  int64_t cpb;    /* chunks per block                                   */
  int64_t bpj;    /* blocks per slice (row mode)                        */
  double rtol, atol;
  float r32;      /* vg_f32_down(rtol), made by the host: the fast path's HotGate::r32 */
  int vec;        /* flat: both bases 16-byte aligned                   */
  int rrun;       /* k_reduce_bulk over rows (RL 1): each block's chunks one
                     memory run an operand (vg_ring_load) -- the rows back
                     to back in both (a row's stride cpr * CH elements), or
                     each block inside one row (cpb divides cpr)            */
  int slice_mode; /* 0 none, 1 row mode (gen), 2 column mode (col)      */
  vgct_acc *part;
  unsigned *counter;
  unsigned *gate;  /* the grid's shared gate thresholds (3 words), or NULL */
  unsigned *sgate; /* row mode: 3 words per slice (zeroed before the launch), or NULL */
  vgct_acc *res;
  vgct_acc *res_dev; /* NULL, or a device copy of *res for a chained kernel (VgChain) */
  vgct_slice_acc *sres;
  VgWinFuse wf;    /* k_reduce_bulk<..., WIN = 1 or 2>: the fused key window */
  const int *wsel; /* k_reduce_bulk: the device's choice of WIN (WinState::mode), or
                      NULL; a variant whose WIN is not the one chosen returns at once */
  unsigned *done;  /* the completion word (mapped pinned memory) or NULL, and */
  unsigned seq;    /* the value to write there last (vg_signal_done)          */
};

/* A diagnostic build only (nvcc -DVGCT_PHASE_TRACE; never in a release
 * build): thread 0 of every k_reduce_lean block stamps %globaltimer (ns) at
 * its entry (0), after its own last flush (1), after the block's merge (2)
 * and after writing its partial, just before its arrival at the counter (3;
 * the arrival's release makes it visible to the last block); the last block
 * of a grid of several blocks prints, per launch, the grid's spread of each
 * stamp and its own fold's and signal's times (bench/phase_trace.py reads
 * the lines). */
#ifdef VGCT_PHASE_TRACE
#define VG_PT_BLOCKS 4096
__device__ unsigned long long vg_pt[VG_PT_BLOCKS][4];
/* k_reduce_bulk (diagnostic): per warp its entry and loop-end stamps and
 * (SM << 40 | slow steps << 20 | steps); the grid's last block prints them
 * (bench/phase_trace.py --ring) */
__device__ unsigned long long vg_pw[VG_PT_BLOCKS * (RT / 32)][3];
__device__ unsigned vg_pw_done;
__device__ __forceinline__ unsigned long long vg_gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define VG_PT_STAMP(k)                                          \
  do {                                                          \
    if (threadIdx.x == 0 && blockIdx.x < VG_PT_BLOCKS)          \
      vg_pt[blockIdx.x][k] = vg_gtimer();                       \
  } while (0)
__device__ __noinline__ void vg_pt_report(unsigned long long t_fold, unsigned long long t_sig) {
  const unsigned nb = min(gridDim.x, (unsigned)VG_PT_BLOCKS);
  unsigned long long lo[4], hi[4];
  for (int k = 0; k < 4; ++k) { lo[k] = ~0ull; hi[k] = 0; }
  for (unsigned b = 0; b < nb; ++b)
    for (int k = 0; k < 4; ++k) {
      const unsigned long long t = __ldcg(&vg_pt[b][k]);
      lo[k] = min(lo[k], t);
      hi[k] = max(hi[k], t);
    }
  const unsigned long long z = lo[0];
  printf("VGPT grid %u entry %.3f %.3f flushed %.3f %.3f merged %.3f %.3f arrived %.3f %.3f "
         "folded %.3f signalled %.3f\n", gridDim.x, 0.0, (hi[0] - z) * 1e-3,
         (lo[1] - z) * 1e-3, (hi[1] - z) * 1e-3, (lo[2] - z) * 1e-3, (hi[2] - z) * 1e-3,
         (lo[3] - z) * 1e-3, (hi[3] - z) * 1e-3, (t_fold - z) * 1e-3, (t_sig - z) * 1e-3);
}
#else
#define VG_PT_STAMP(k) \
  do {                 \
  } while (0)
#endif

/* The grid's last store: seq into the host's completion word, after the
 * result record and the workspace's reset words (counter, gate thresholds),
 * fenced at system scope so that the host -- and any kernel launched after
 * the host saw the word -- sees them (CallCtx::wait_signal).  Thread 0 of
 * the block that wrote the record, after it wrote it. */
__device__ __forceinline__ void vg_signal_done(const RArgs &A) {
  if (A.done) {
    __threadfence_system();
    *reinterpret_cast<volatile unsigned *>(A.done) = A.seq;
  }
}

template <int DA, int DE>
struct VChunk {
  uint4 va[vg_chunk<DA, DE>::NVA];
  uint4 ve[vg_chunk<DA, DE>::NVE];
};

/* Block partial, then (last block) the fixed-order fold of all partials.
 * sm: the block's per-thread accumulators (thread t's at sm[t]).  A grid of
 * one block (small inputs; not row mode, whose slices read the partials) has
 * its result already: no partial, no counter, no second merge (that merge of
 * one record with 255 empty ones was about a third of a one-block launch). */
template <int SC>
__device__ __forceinline__ void vg_reduce_finish(const RArgs &A, VAcc *sm) {
  vg_block_merge<RT, SC>(sm);
  if (SC == VG_MODE_LEAN) VG_PT_STAMP(2);
  if (gridDim.x == 1 && A.slice_mode != 1) {
    if (threadIdx.x == 0) {
      *A.res = sm[0].a;
      if (A.res_dev) *A.res_dev = sm[0].a;
      if (A.gate) A.gate[0] = A.gate[1] = A.gate[2] = 0u;
      vg_signal_done(A);
    }
    return;
  }
  if (threadIdx.x == 0) A.part[blockIdx.x] = sm[0].a;
  if (SC == VG_MODE_LEAN) VG_PT_STAMP(3); /* before the arrival: its release orders the stamp */
  if (!vg_last_block(A.counter)) return;
  if (!VG_SCALED(SC) && gridDim.x <= RT) {
    /* the partials, word by word (coalesced L2 reads, all in flight at once),
       into the block's records, then one field-parallel merge of those
       records alone: the same result, bit for bit, as merging each partial
       into an empty record and all RT records after (x + 0 is x), without
       that vgct_acc_merge in every thread (docs/performance.md, 2026-12-02
       20:55 UTC: the fold was ~7.6 us of a 2^20 bf16 call's 25 us).  Larger
       grids (more blocks than records: the ring kernel's 2 a SM) keep the
       merges below. */
    static_assert(sizeof(VAcc) == sizeof(vgct_acc), "records: 64-bit words, back to back");
    const unsigned long long *src = reinterpret_cast<const unsigned long long *>(A.part);
    unsigned long long *dst = reinterpret_cast<unsigned long long *>(sm);
    const int words = (int)gridDim.x * (int)(sizeof(vgct_acc) / 8);
    for (int i = threadIdx.x; i < words; i += RT) dst[i] = __ldcg(src + i);
    vg_block_merge_fields<RT>(sm, (int)gridDim.x); /* (it opens with a block barrier) */
  } else {
    vgct_acc *m = &sm[threadIdx.x].a;
    vgct_acc_init(m, VG_SCALED(SC));
    for (unsigned i = threadIdx.x; i < gridDim.x; i += RT) {
      vgct_acc p = vg_ldcg(&A.part[i]);
      vgct_acc_merge(m, &p);
    }
    vg_block_merge<RT, SC>(sm);
  }
  if (threadIdx.x == 0) {
#ifdef VGCT_PHASE_TRACE
    const unsigned long long t_fold = vg_gtimer();
#endif
    *A.res = sm[0].a;
    if (A.res_dev) *A.res_dev = sm[0].a;
    *A.counter = 0;
    if (A.gate) A.gate[0] = A.gate[1] = A.gate[2] = 0u; /* every block is done with them */
    vg_signal_done(A); /* (not in row mode: never signalled, below) */
#ifdef VGCT_PHASE_TRACE
    if (SC == VG_MODE_LEAN) vg_pt_report(t_fold, vg_gtimer());
#endif
  }
  if (A.slice_mode == 1) {
    for (int64_t j = threadIdx.x; j < A.it.S; j += RT) {
      vgct_slice_acc s;
      vgct_slice_init(&s, VG_SCALED(SC));
      for (int64_t g = 0; g < A.bpj; ++g) {
        vgct_acc p = vg_ldcg(&A.part[j * A.bpj + g]);
        vgct_slice_acc ps;
        vgct_slice_from_acc(&p, &ps);
        vgct_slice_merge(&s, &ps);
      }
      A.sres[j] = s;
    }
  }
}

__device__ __noinline__ void vg_cold_update(vgct_acc *s, double a, double e, int64_t idx,
                                            double rtol, double atol, int scaled) {
  vgct_acc_update(s, a, e, idx, rtol, atol, scaled);
}

/* An integer pair (vgct_pair_is_int64: both integers, one 64-bit) by the
 * exact integer definition, vgct_acc_update_at (csrc/vgct_stats.h), into the
 * thread's vgct_acc: only the generic instantiation (run-time dtypes) sees
 * integer pairs, and they are never scaled. */
__device__ __noinline__ void vg_cold_update_int(vgct_acc *s, const char *pa, int da,
                                                const char *pe, int de, int64_t idx, double rtol,
                                                double atol) {
  vgct_acc_update_at(s, pa, da, pe, de, idx, rtol, atol, 0);
}

/* A chunk of narrow-dtype pairs as float32 (exact), and the definition's
 * folds of it: the fast path's rare fallbacks, out of line so that their
 * registers do not weigh on the hot loop, and not unrolled (code size). */
template <int CH> struct vg_f32chunk { float a[CH], e[CH]; };

/* VG_CHUNK_DEFINE (and partial chunks): vgct_acc_update on the first cnt pairs. */
template <int CH>
__device__ __noinline__ void vg_slow_chunk(vgct_acc *acc, const vg_f32chunk<CH> c, int64_t f,
                                           int64_t sf, double rtol, double atol, int cnt = CH) {
#pragma unroll 1
  for (int q = 0; q < CH; ++q)
    if (q < cnt) vgct_acc_update(acc, (double)c.a[q], (double)c.e[q], f + q * sf, rtol, atol, 0);
}

/* VG_CHUNK_MAXIMA: the maxima of each pair (vgct_acc_maxima); the chunk's
 * sums and counters are already in the HotAcc. */
template <int CH>
__device__ __noinline__ void vg_slow_maxima(vgct_acc *acc, const vg_f32chunk<CH> c, int64_t f,
                                            int64_t sf, double rtol, double atol) {
#pragma unroll 1
  for (int q = 0; q < CH; ++q)
    vgct_acc_maxima(acc, (double)c.a[q], (double)c.e[q], f + q * sf, rtol, atol);
}

/* The first cnt pairs of a partial chunk (unit stride, typed pair) by the
 * definition, vgct_acc_update, into the thread's vgct_acc (scaled: its
 * local one); out of line and not unrolled: one chunk per launch. */
template <int DA, int DE, int SC>
__device__ __noinline__ void vg_fold_tail(vgct_acc *acc, const char *qa, const char *qe, int cnt,
                                          int64_t f, int64_t sf, double rtol, double atol) {
  typedef vg_chunk<DA, DE> G;
#pragma unroll 1
  for (int q = 0; q < cnt; ++q)
    vgct_acc_update(acc, vgct_load(qa + q * G::ISA, DA), vgct_load(qe + q * G::ISE, DE),
                    f + q * sf, rtol, atol, VG_SCALED(SC));
}

/* The fast path's gate of this warp: thresholds in registers, the held
 * maxima in shared memory (one GateHeld per warp, written by lane 0), and
 * the shared thresholds: the grid's three words, or in row mode the three
 * words of the warp's slice (a slice's maxima must come from its own pairs);
 * NULL for none. */
struct FastGate {
  HotGate g;
  GateHeld *held;
  unsigned *glob;
  unsigned k; /* the warp's steps so far (vg_gate_refresh's poll) */
  /* the grid's words lane 0 asked for at the last refresh (vg_gate_ask) and
     the next refresh takes (vg_gate_take): pend, warp-uniform, says one is
     in flight; q0..q2 (lane 0's; 0 elsewhere, and 0 raises nothing) */
  uint32_t q0, q1, q2;
  bool pend;
};

/* The grid's shared thresholds: three words in the workspace (bits of the
 * non-negative float32 thresholds mxb, crel, wx32 of vg_gate_derive, whose
 * integer order is their numeric order), raised with integer atomicMax by
 * every warp that derived stronger ones and reset by the last block.  Every
 * published threshold derives from a maximum held by some thread's vgct_acc
 * of this grid, all of which are merged into the result, so any warp may
 * gate its chunks with them (vg_gate_max).  A warp publishes and reads when
 * one of its lanes fell back (then it needs stronger thresholds, and it may
 * have new ones to give), and only reads at its start and after its steps
 * 0, 1, 3, 7, 15, ... without a fallback (vg_gate_refresh's poll).  Timing
 * changes which path a chunk takes, never a result (VG_CHUNK_MAXIMA folds the
 * same sums). */
__device__ __forceinline__ unsigned vg_ld_relaxed(const unsigned *p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* Lane 0's half of an exchange: it publishes the warp's thresholds g
 * (atomicMax, whose old words it keeps) or reads the words (relaxed
 * device-scope loads: other blocks raise them meanwhile) into m0..m2; the
 * other lanes' stay as they are. */
__device__ __forceinline__ void vg_gate_words(const HotGate &g, unsigned *glob, bool publish,
                                              uint32_t &m0, uint32_t &m1, uint32_t &m2) {
  if ((threadIdx.x & 31u) == 0) {
    if (publish) {
      m0 = atomicMax(glob + 0, g.mxb);
      m1 = atomicMax(glob + 1, vgct_bits_from_f32(g.crel));
      m2 = atomicMax(glob + 2, vgct_bits_from_f32(g.wx32));
    } else {
      m0 = vg_ld_relaxed(glob + 0);
      m1 = vg_ld_relaxed(glob + 1);
      m2 = vg_ld_relaxed(glob + 2);
    }
  }
}

/* The other half: lane 0's words to every lane, taken into g. */
__device__ __forceinline__ void vg_gate_bcast(HotGate &g, uint32_t m0, uint32_t m1, uint32_t m2) {
  m0 = __shfl_sync(0xffffffffu, m0, 0);
  m1 = __shfl_sync(0xffffffffu, m1, 0);
  m2 = __shfl_sync(0xffffffffu, m2, 0);
  vg_gate_max(g, m0, m1, m2);
}

/* The whole exchange at once: the warp waits for the L2 round trip. */
__device__ __forceinline__ void vg_gate_exchange(HotGate &g, unsigned *glob, bool publish) {
  uint32_t m0 = 0, m1 = 0, m2 = 0;
  vg_gate_words(g, glob, publish, m0, m1, m2);
  vg_gate_bcast(g, m0, m1, m2);
}

/* The exchange in two halves a step apart (k_reduce_bulk, DEFER), so that no
 * warp waits for the L2 round trip (an atomic's or a load's: ~1 us, against
 * a step's ~2.5 us; ncu's stall samples put ~3% of the ring kernel's on the
 * shuffle that waited for it, docs/performance.md 2026-12-05): vg_gate_ask,
 * lane 0's words into fg.q0..q2, not used yet; vg_gate_take, at the warp's
 * next refresh, broadcasts and takes them (vg_gate_max: a threshold only
 * rises, and one taken a step late changes a chunk's path, never a result).
 * The other kernels keep vg_gate_exchange: the three words live across
 * their loops made k_reduce_gen and k_reduce_flat spill (ptxas sm_90). */
__device__ __forceinline__ void vg_gate_ask(FastGate &fg, bool publish) {
  vg_gate_words(fg.g, fg.glob, publish, fg.q0, fg.q1, fg.q2);
  fg.pend = true;
}

__device__ __forceinline__ void vg_gate_take(FastGate &fg) {
  vg_gate_bcast(fg.g, fg.q0, fg.q1, fg.q2);
  fg.pend = false;
}

/* r32: vg_f32_down(rtol), which the host computed into RArgs::r32 -- the same
 * value vg_gate_init sets, but read from the kernel's parameters: the
 * compiler then uses it where vg_fast_chunk needs it instead of redoing the
 * rounding (a widening, a float64 compare and a select) in every chunk to
 * spare a register (ptxas sm_90: 4-5 instructions a chunk). */
template <int DA, int DE, int SC, bool DEFER = false>
__device__ __forceinline__ void vg_gate_start(FastGate &fg, GateHeld *warp_held, unsigned *glob,
                                              double rtol, float r32) {
  if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok) {
    GateHeld none;
    vg_gate_init(fg.g, none, rtol);
    fg.g.r32 = r32;
    fg.held = warp_held;
    fg.glob = glob;
    fg.k = 0u;
    fg.q0 = fg.q1 = fg.q2 = 0u;
    fg.pend = false;
    if ((threadIdx.x & 31u) == 0) *warp_held = none;
    __syncwarp();
    if (glob) {
      if (DEFER) vg_gate_ask(fg, false); /* taken after the first step */
      else vg_gate_exchange(fg.g, glob, false);
    }
  }
}

/* After each step of RU chunks: when any lane of the warp folded a chunk by
 * the definition (into its vgct_acc), the lanes take the best maxima their
 * vgct_acc hold, lane 0 publishes them, and every lane derives its
 * thresholds (then exchanges them with the grid's); otherwise, after steps
 * 0, 1, 3, 7, 15, ..., the warp reads the grid's thresholds (the poll,
 * below).  The loops below are warp-uniform (all 32 lanes run the same
 * number of steps, so fg.k is the same in every lane), so the full mask is
 * exact. */
template <int DA, int DE, int SC, bool DEFER = false>
__device__ __forceinline__ void vg_gate_refresh(FastGate &fg, const vgct_acc *acc, bool slow) {
  if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok) {
    const unsigned k = fg.k++; /* the step just folded: 0, 1, 2, ... */
    if (DEFER && fg.pend) vg_gate_take(fg); /* the words asked for a step ago */
    if (__any_sync(0xffffffffu, slow)) {
      GateHeld m;
      vg_held_from_acc(m, acc);
      vg_held_warp(m);
      __syncwarp(); /* every lane is done reading the previous maxima */
      if ((threadIdx.x & 31u) == 0) *fg.held = m;
      __syncwarp();
      if (DEFER) {
        /* the warp's own thresholds, kept above the grid's words taken before
           (vg_gate_max: each is some held maximum's; the words asked for now
           come a step later) */
        HotGate own = fg.g;
        vg_gate_derive(own, m);
        vg_gate_max(fg.g, own.mxb, vgct_bits_from_f32(own.crel), vgct_bits_from_f32(own.wx32));
      } else {
        vg_gate_derive(fg.g, m); /* (raised to the grid's words just below) */
      }
      if (fg.glob) {
        if (DEFER) vg_gate_ask(fg, true);
        else vg_gate_exchange(fg.g, fg.glob, true);
      }
    } else if (fg.glob && (k & (k + 1u)) == 0u) {
      /* the poll: the grid's thresholds read again without a fallback,
         after steps 0, 1, 3, 7, 15, ... (k & (k + 1) == 0): a threshold the
         grid raised is taken at most k + 2 steps after step k (its
         words come a step after they are asked for: vg_gate_ask).  Warps
         typically fall back in their first step (no maximum held yet) and
         publish and read the grid's words at about the same time; a warp
         whose read came before the few warps holding the largest |d|
         published keeps a threshold below the grid's, and when no later
         chunk of its own beats its held maxima, nothing else would raise
         it: every chunk at that threshold then runs the exact check
         (vg_fast_chunk's chk_mx / chk_wx).  On bf16 rounding (ties: |d|
         takes a few values, the second largest in ~2% of the chunks) such
         warps ran ~35% slower than the others to the kernel's end
         (docs/performance.md, 2026-12-04 20:50-21:45 UTC).  Read every
         fourth step instead, the words made float32 pairs at 2^28
         1.07-1.13x slower (likely: a read stalls its warp for an L2 round
         trip while the ring streams); these reads are a few a warp.
         Measured (docs/performance.md, 2026-12-05): bf16 ties at 2^28
         0.80x, their default p99 0.87x, float32 pairs 0.95x. */
      if (DEFER) vg_gate_ask(fg, false);
      else vg_gate_exchange(fg.g, fg.glob, false);
    }
  }
}

/* After the warp's last step (DEFER): the words asked for at its last
 * refresh taken now.  What orders a pending atomicMax before the last
 * block's reset of the words for the next launch is the block barrier and
 * the arrival's release at the grid's counter (vg_last_block), which the
 * last block acquires -- as for every atomic before this change; the take
 * only adds that lane 0 has its old words (a review, 2026-12-05: a late
 * atomic would leave a threshold of this call's data to the next call).
 * Dropped, the grid's words still read zero after every call (test_gpu.py
 * test_gate_words_left_zero_after_every_call), but the 2^28 rows ran
 * 1.005-1.018x slower (H200, 2026-12-06 docs/performance.md): kept. */
template <int DA, int DE, int SC>
__device__ __forceinline__ void vg_gate_finish(FastGate &fg) {
  if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok)
    if (fg.pend) vg_gate_take(fg);
}

/* Finish a narrow-dtype chunk by vg_fast_chunk's outcome; true when it
 * needed a fallback (the caller refreshes the warp's gate). */
template <int CH, int P16 = 0>
__device__ __forceinline__ bool vg_fast_or_slow(HotAcc &h, const FastGate &g, vgct_acc *acc,
                                                const vg_f32chunk<CH> &x, int64_t f, int64_t sf,
                                                double rtol, double atol, VgLook *lk = nullptr,
                                                VgWinCnt *wc = nullptr,
                                                const uint32_t *wa = nullptr,
                                                const uint32_t *we = nullptr) {
  const int r =
      vg_fast_chunk<CH, P16>(h, g.g, *g.held, x.a, x.e, f, sf, rtol, atol, lk, wc, wa, we);
  if (r == VG_CHUNK_DONE) return false;
  if (r == VG_CHUNK_MAXIMA) vg_slow_maxima<CH>(acc, x, f, sf, rtol, atol);
  else vg_slow_chunk<CH>(acc, x, f, sf, rtol, atol);
  return true;
}

/* Fold CH elements held in registers (vector path), converted by THE loader:
 * narrow dtypes go through the chunk fast path (vg_fast_or_slow), the others
 * pair by pair (vg_pair).  Returns true when a narrow-dtype chunk took a
 * fallback (the caller refreshes the warp's gate). */
template <int DA, int DE, int SC>
__device__ __forceinline__ bool vg_fold_vec(HotAcc &h, const FastGate &g, vgct_acc *acc,
                                            const VChunk<DA, DE> &c, int64_t f, int64_t sf,
                                            double rtol, double atol, VgLook *lk = nullptr,
                                            VgWinCnt *wc = nullptr) {
  typedef vg_chunk<DA, DE> G;
  const char *ba = reinterpret_cast<const char *>(c.va);
  const char *be = reinterpret_cast<const char *>(c.ve);
  if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok) {
    vg_f32chunk<G::CH> x;
#pragma unroll
    for (int q = 0; q < G::CH; ++q) { /* (bfloat16: from the vector's words) */
      x.a[q] = DA == VGCT_BFLOAT16
                   ? vgct_bf16_of_word(reinterpret_cast<const uint32_t *>(c.va)[q >> 1], q & 1)
                   : vgct_load_f32(ba + q * G::ISA, DA);
      x.e[q] = DE == VGCT_BFLOAT16
                   ? vgct_bf16_of_word(reinterpret_cast<const uint32_t *>(c.ve)[q >> 1], q & 1)
                   : vgct_load_f32(be + q * G::ISE, DE);
    }
    /* two float16 or two bfloat16 operands: vg_fast_chunk also reads the words */
    constexpr int P16 = DA == DE && (DA == VGCT_BFLOAT16 || DA == VGCT_FLOAT16) ? DA : 0;
    return vg_fast_or_slow<G::CH, P16>(h, g, acc, x, f, sf, rtol, atol, lk, wc,
                                       reinterpret_cast<const uint32_t *>(c.va),
                                       reinterpret_cast<const uint32_t *>(c.ve));
  } else {
#pragma unroll
    for (int q = 0; q < G::CH; ++q)
      vg_pair<SC>(h, acc, vgct_load(ba + q * G::ISA, DA), vgct_load(be + q * G::ISE, DE),
                  f + q * sf, rtol, atol);
    return false;
  }
}

/* Fold up to CH elements read one by one (any alignment or stride); full
 * chunks of narrow dtypes go through the fast path, as above. */
template <int DA, int DE, int SC>
__device__ __forceinline__ bool vg_fold_scalar(HotAcc &h, const FastGate &g, vgct_acc *acc,
                                               const IterSpec &it, const char *qa, const char *qe,
                                               int64_t sa, int64_t se, int cnt, int64_t f,
                                               int64_t sf, double rtol, double atol) {
  typedef vg_chunk<DA, DE> G;
  const int64_t ba = sa * (G::TYPED ? (int64_t)G::ISA : (int64_t)it.isa);
  const int64_t be = se * (G::TYPED ? (int64_t)G::ISE : (int64_t)it.ise);
  const int da = it.da, de = it.de;
  if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok) {
    vg_f32chunk<G::CH> x;
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      x.a[q] = q < cnt ? vgct_load_f32(qa + q * ba, DA) : 0.0f;
      x.e[q] = q < cnt ? vgct_load_f32(qe + q * be, DE) : 0.0f;
    }
    if (cnt == G::CH) return vg_fast_or_slow<G::CH>(h, g, acc, x, f, sf, rtol, atol);
    /* a partial chunk (a row shorter than CH, or its tail) is always folded by
       the definition; refreshing the gate for it would cost the warp a
       reduction every step on short rows, and a stale gate only holds less */
    vg_slow_chunk<G::CH>(acc, x, f, sf, rtol, atol, cnt);
    return false;
  } else {
    if (!G::TYPED && vgct_pair_is_int64(da, de)) { /* exact integers: vgct_stats.h */
      for (int q = 0; q < cnt; ++q)
        vg_cold_update_int(acc, qa + q * ba, da, qe + q * be, de, f + q * sf, rtol, atol);
      return false;
    }
#pragma unroll
    for (int q = 0; q < G::CH; ++q)
      if (q < cnt)
        vg_pair<SC>(h, acc, vg_ld<DA>(qa + q * ba, da), vg_ld<DE>(qe + q * be, de), f + q * sf,
                    rtol, atol);
    return false;
  }
}

/* The kernels' per-thread state, set up and advanced by three helpers (the
 * variables stay the kernel's own locals, so the register accumulator never
 * shares an object with the local-memory one):
 *   vg_thread_start  the thread's vgct_acc (vsm[threadIdx.x]) and register
 *                    accumulator initialised, the warp's gate started
 *                    (warp_held: the warp's GateHeld; glob: the shared
 *                    thresholds or NULL), the scaled path's local vgct_acc;
 *   vg_thread_flush  the register (unscaled) or local (scaled) accumulator
 *                    merged into the thread's vgct_acc (the fast path's
 *                    kernels: its sums and counters added, vg_sums_only);
 *   vg_thread_step   the end of a warp-uniform step of `pairs` pairs a
 *                    thread: the gate refresh, and every VG_FLUSH pairs a
 *                    flush (two-level sums). */
template <int DA, int DE, int SC, bool DEFER = false>
__device__ __forceinline__ vgct_acc *vg_thread_start(VAcc *vsm, HotAcc &h, FastGate &gate,
                                                     GateHeld *warp_held, unsigned *glob,
                                                     double rtol, float r32, vgct_acc &part) {
  vgct_acc *acc = &vsm[threadIdx.x].a;
  vgct_acc_init(acc, VG_SCALED(SC));
  vg_hot_init(h);
  vg_gate_start<DA, DE, SC, DEFER>(gate, warp_held, glob, rtol, r32);
  vgct_acc_init(&part, VG_SCALED(SC));
  return acc;
}

/* SO ("sums only"): the kernel's register accumulator never holds a maximum,
 * so its flushes add sums and counters alone (vg_hot_flush_sums: the same
 * record).  True for the fast path's pairs (SC VG_MODE_FAST, vg_fast::ok) in
 * k_reduce_flat, k_reduce_bulk and k_reduce_gen, which fold them by
 * vg_fast_chunk and its fallbacks only; k_reduce_col folds every pair by
 * vg_pair (h's maxima), and passes false. */
template <int DA, int DE, int SC> struct vg_sums_only {
  static constexpr bool v = SC == VG_MODE_FAST && vg_fast<DA, DE>::ok;
};

template <int SC, bool SO>
__device__ __forceinline__ void vg_thread_flush(HotAcc &h, vgct_acc &part, vgct_acc *acc) {
  if (VG_SCALED(SC)) vg_part_flush(&part, acc);
  else if (SO) vg_hot_flush_sums(h, acc);
  else vg_hot_flush(h, acc);
}

template <int DA, int DE, int SC, bool SO, bool DEFER = false>
__device__ __forceinline__ void vg_thread_step(FastGate &gate, HotAcc &h, vgct_acc &part,
                                               vgct_acc *acc, bool slow, int &since, int pairs) {
  vg_gate_refresh<DA, DE, SC, DEFER>(gate, acc, slow);
  if ((since += pairs) >= VG_FLUSH) {
    since = 0;
    vg_thread_flush<SC, SO>(h, part, acc);
  }
}

template <int DA, int DE, int SC>
__global__ void __launch_bounds__(RT, 2) k_reduce_flat(const __grid_constant__ RArgs A) {
  typedef vg_chunk<DA, DE> G;
  extern __shared__ __align__(16) VAcc vsm[]; /* 16: the ring's bulk copies */
  const IterSpec &it = A.it;
  __shared__ GateHeld held[RT / 32];
  HotAcc h;
  FastGate gate;
  vgct_acc part; /* scaled path only (local memory) */
  vgct_acc *acc =
      vg_thread_start<DA, DE, SC>(vsm, h, gate, &held[threadIdx.x >> 5], A.gate, A.rtol, A.r32, part);
  vgct_acc *cold = VG_SCALED(SC) ? &part : acc; /* where vg_pair sends the definition path */
  int since = 0;                     /* pairs since the last flush */
  constexpr bool SO = vg_sums_only<DA, DE, SC>::v; /* (vg_thread_flush) */
  const int64_t c0 = (int64_t)blockIdx.x * A.cpb;
  const int64_t c1 = min(c0 + A.cpb, A.nchunk);
  const int64_t m = it.m, sf = it.sf[0];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  /* warp-uniform steps (vg_gate_refresh): lanes past c1 idle through the last one */
  for (int64_t cw = c0 + (threadIdx.x & ~31u); cw < c1; cw += (int64_t)RT * RU) {
    const int64_t c = cw + (threadIdx.x & 31u);
    bool slow = false;
    VChunk<DA, DE> ch[RU];
    bool v[RU];
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const int64_t cc = c + (int64_t)u * RT;
      v[u] = G::TYPED && A.vec && cc < c1 && (cc + 1) * G::CH <= m;
      if (v[u]) {
        const uint4 *pa = reinterpret_cast<const uint4 *>(it.pa + cc * G::CH * isa);
        const uint4 *pe = reinterpret_cast<const uint4 *>(it.pe + cc * G::CH * ise);
#pragma unroll
        for (int i = 0; i < G::NVA; ++i) ch[u].va[i] = __ldcs(pa + i);
#pragma unroll
        for (int i = 0; i < G::NVE; ++i) ch[u].ve[i] = __ldcs(pe + i);
      }
    }
#pragma unroll
    for (int u = 0; u < RU; ++u) {
      const int64_t cc = c + (int64_t)u * RT;
      if (cc < c1) {
        const int64_t i0 = cc * G::CH;
        if (v[u]) {
          slow |= vg_fold_vec<DA, DE, SC>(h, gate, cold, ch[u], it.f0 + i0 * sf, sf, A.rtol, A.atol);
        } else {
          const int cnt = (int)min((int64_t)G::CH, m - i0);
          slow |= vg_fold_scalar<DA, DE, SC>(h, gate, cold, it, it.pa + i0 * isa, it.pe + i0 * ise,
                                             1, 1, cnt, it.f0 + i0 * sf, sf, A.rtol, A.atol);
        }
      }
    }
    vg_thread_step<DA, DE, SC, SO>(gate, h, part, acc, slow, since, RU * G::CH);
  }
  vg_thread_flush<SC, SO>(h, part, acc);
  vg_reduce_finish<SC>(A, vsm);
}

/* ---- the fused key window (k_reduce_bulk<..., WIN = 1 or 2>) --------------
 * What k_sel_window (select.cu) counts for ONE window, in the reduction's own
 * pass, for float16/bfloat16/float32 pairs: keys >= lo (ge), == lo (eql), ==
 * hi (eqh, hi != lo), and the keys with lo < key < hi appended to the
 * window's region.  Two ways, picked per call from the sample (select.cu
 * k_win_count, WIN_FUSE_GE; the third variant, WIN = 0, runs when the sample
 * left the window to the record, select.cu win_early):
 *  WIN = 1, the sparse way (VG_WIN_LOOK), where few keys are >= lo (a p99
 *   window of noise: ~1% of them).  vg_fast_chunk's loop marks the pairs
 *   whose |d32| is not below t32 = the float32 below lo (1 - 2^-21), rounded
 *   down (VgLook; vg_win_t32_of: why |d32| < t32 puts a pair's key below lo),
 *   two instructions a pair; the lane then keys only its marked pairs
 *   (vg_win_sparse: each pair read again from the ring's stage, which is
 *   refilled only after the step's candidates -- a fourth stage to make up
 *   for it measured no gain, 2026-12-01 -- its |d| as a double compared with
 *   the bounds as WIN 2 does, counts in the thread's registers, inside keys
 *   to the warp's stage).  A chunk the definition
 *   folds (non-finite, float32 overflow) has every pair marked; in the other
 *   chunks pairs with d == 0 are not: their key 0 is below lo, or, when lo is
 *   0, counted == lo by number (a caching feature's output: most pairs
 *   identical, the p99 window's lo at 0).  Cost: ~2 instructions a pair, plus
 *   per warp step the most candidates one lane has (one or two keys for a
 *   p99 window).  (Until 2026-12-02 the warp looked at the chunks not proved
 *   below lo, re-read from the ring's stage with the keys split over the
 *   lanes and counted by ballots: ~300 us over the plain reduction of 2^28
 *   bf16-vs-float32 pairs, since nearly every warp step holds such a chunk.)
 *  WIN = 2, every pair classified (VG_WIN_EVERY), where many keys are >= lo
 *   (ties at lo, a constant offset): in vg_fast_chunk's own loop
 *   (VgWinCnt, vgct_cuda_internal.cuh), four float64 comparisons of the |d|
 *   the sums already compute with the bounds as doubles, counts in three
 *   registers a thread by predicated adds (vg_win_mark): ~8 instructions a
 *   pair whatever the data (12.5 with the counts as selects; 2026-12-05).  What a
 *   chunk leaves to its lane (vg_win_chunk): the keys strictly inside, to the
 *   warp's stage, and a chunk with a non-finite pair, keyed pair by pair.
 * Both: the last, partial chunk of the input is keyed by its own lane
 * (vg_win_keys: shared atomics, and past VG_WSTAGE staged keys straight to
 * the region with a global atomic).  The warp flushes its stage at its
 * warp-uniform step ends once it holds VG_WFLUSH keys (one global atomic a
 * flush).  Counters: 32-bit a thread or warp (vg_reduce_can_fuse bounds a
 * block's pairs below 2^31), one 64-bit atomic a warp and counter at the
 * end.  Counts and stored keys do not depend on order or on the way; the
 * region's order does, and the selection over it does not.  What each costs
 * on an H200: docs/performance.md. */
#define VG_WSTAGE 48 /* staged keys a warp (8 warps: 3 KiB next to the ring) */
#define VG_WFLUSH 16 /* a warp flushes its stage at a step end from this many */

/* Per warp: the staged keys and the counts of the pairs keyed one by one. */
struct VgWinSh {
  unsigned long long stage[RT / 32][VG_WSTAGE];
  unsigned cnt[RT / 32];                   /* staged keys                 */
  unsigned ge[RT / 32], el[RT / 32], eh[RT / 32]; /* keys >= lo, == lo, == hi */
};

/* One key inside the window: the warp's stage, or past it the region. */
__device__ __forceinline__ void vg_win_put(unsigned long long key, const VgWinFuse &wf,
                                           VgWinSh *sh, int w) {
  const unsigned i = atomicAdd(&sh->cnt[w], 1u);
  if (i < VG_WSTAGE) {
    sh->stage[w][i] = key;
  } else {
    const unsigned long long pos = atomicAdd(&wf.w->pos[0], 1ull);
    if (pos < (unsigned long long)wf.cap) wf.cand[pos] = key;
  }
}

/* The keys of the first cnt pairs of a chunk, one by one by its own lane,
 * into the warp's counts and stage (shared atomics: other lanes may do the
 * same): a chunk with a non-finite pair (WIN 2), and the input's last,
 * partial chunk. */
template <int CH>
__device__ __forceinline__ void vg_win_keys(const vg_f32chunk<CH> x, int cnt, const VgWinFuse wf,
                                         VgWinSh *sh, int w) {
  const unsigned long long lo = __ldg(&wf.w->lo[0]), hi = __ldg(&wf.w->hi[0]);
  const unsigned long long hq = hi == lo ? WIN_SENT : hi; /* ties at lo == hi: eql only */
  unsigned ge = 0, el = 0, eh = 0;
#pragma unroll 1
  for (int q = 0; q < cnt; ++q) {
    const unsigned long long key = vg_key_narrow(x.a[q], x.e[q]); /* VG_KEY_NONE: not finite */
    if (key < lo || key == VG_KEY_NONE) continue;
    ++ge;
    if (key == lo) ++el;
    else if (key < hi) vg_win_put(key, wf, sh, w);
    else if (key == hq) ++eh;
  }
  if (ge) atomicAdd(&sh->ge[w], ge);
  if (el) atomicAdd(&sh->el[w], el);
  if (eh) atomicAdd(&sh->eh[w], eh);
}

/* What vg_fast_chunk left of a whole chunk (wc.in != 0, per lane): its keys
 * strictly inside the window to the stage, or -- VG_WIN_DEFINE -- the whole
 * chunk keyed pair by pair.  Out of line: rare, and its registers must not
 * count against the hot loop's. */
template <int DA, int DE>
__device__ __noinline__ void vg_win_chunk(const VChunk<DA, DE> c, unsigned in, const VgWinFuse wf,
                                          VgWinSh *sh, int w) {
  typedef vg_chunk<DA, DE> G;
  const char *ba = reinterpret_cast<const char *>(c.va);
  const char *be = reinterpret_cast<const char *>(c.ve);
  vg_f32chunk<G::CH> x;
#pragma unroll
  for (int q = 0; q < G::CH; ++q) {
    x.a[q] = vgct_load_f32(ba + q * G::ISA, DA);
    x.e[q] = vgct_load_f32(be + q * G::ISE, DE);
  }
  if (in & VG_WIN_DEFINE) {
    vg_win_keys<G::CH>(x, G::CH, wf, sh, w);
    return;
  }
#pragma unroll 1
  for (int q = 0; q < G::CH; ++q)
    if ((in >> q) & 1u) vg_win_put(vg_key_narrow(x.a[q], x.e[q]), wf, sh, w);
}

/* The warp's staged keys to the region once it holds `thr` or more (1: the
 * kernel's end).  Warp-uniform: every lane reads the same count. */
__device__ __forceinline__ void vg_win_flush(const VgWinFuse &wf, VgWinSh *sh, int w, int lane,
                                             unsigned thr) {
  __syncwarp(); /* the lanes' staged keys and count visible to the warp */
  const unsigned c0 = __shfl_sync(0xffffffffu, *(volatile unsigned *)&sh->cnt[w], 0); /* one value */
  if (c0 < thr) return;
  const unsigned c = c0 < VG_WSTAGE ? c0 : VG_WSTAGE;
  unsigned long long base = 0;
  if (lane == 0) base = atomicAdd(&wf.w->pos[0], (unsigned long long)c);
  base = __shfl_sync(0xffffffffu, base, 0);
  for (unsigned i = lane; i < c; i += 32)
    if (base + i < (unsigned long long)wf.cap) wf.cand[base + i] = sh->stage[w][i];
  __syncwarp(); /* every lane read the stage */
  if (lane == 0) sh->cnt[w] = 0;
  __syncwarp();
}

/* max |d32| < vg_win_t32(w): every key of the chunk is below window 0's lo
 * (vg_win_t32_of, vgct_cuda_internal.cuh: the bound and why it holds). */
__device__ __forceinline__ float vg_win_t32(const WinState *w) {
  return vg_win_t32_of(__ldg(&w->lo[0]));
}

/* WIN 1: a folded chunk's keys at or above lo (vg_win_sparse), its pairs
 * read again from the ring's stage (sa, se: the chunk's vectors there),
 * counts into the thread's wc, the keys strictly inside to the warp's stage. */
template <int DA, int DE>
__device__ __forceinline__ void vg_win_cand(const uint4 *sa, const uint4 *se, const VgLook &lk,
                                            VgWinCnt &wc, const VgWinFuse &wf, VgWinSh *sh,
                                            int w) {
  vg_win_sparse<DA, DE>(reinterpret_cast<const char *>(sa), reinterpret_cast<const char *>(se), lk,
                        wc, [&](unsigned long long key) { vg_win_put(key, wf, sh, w); });
}

/* The kernel's start: the warp's counts cleared, the thread's classification
 * set up from window 0's bounds (win_bounds / k_win_count wrote them before the
 * launch). */
__device__ __forceinline__ void vg_win_begin(const VgWinFuse &wf, VgWinSh *sh, VgWinCnt &wc,
                                             int w, int lane) {
  if (lane == 0) sh->cnt[w] = sh->ge[w] = sh->el[w] = sh->eh[w] = 0;
  const unsigned long long lo = __ldg(&wf.w->lo[0]), hi = __ldg(&wf.w->hi[0]);
  wc.lo = vgct_f64_from_bits(lo);
  wc.hi = vgct_f64_from_bits(hi);
  wc.ge = wc.el = wc.eh = wc.in = 0;
  __syncwarp();
}

/* The kernel's end: the threads' counts into the warp's, the last flush, then
 * the warp's counts (one atomic each). */
__device__ __forceinline__ void vg_win_end(const VgWinFuse &wf, VgWinSh *sh, const VgWinCnt &wc,
                                           int w, int lane) {
  if (wc.ge) atomicAdd(&sh->ge[w], wc.ge);
  if (wc.el) atomicAdd(&sh->el[w], wc.el);
  /* hi == lo: the ties at lo are counted once, in el (eqh stays 0) */
  if (wc.eh && __ldg(&wf.w->hi[0]) != __ldg(&wf.w->lo[0])) atomicAdd(&sh->eh[w], wc.eh);
  vg_win_flush(wf, sh, w, lane, 1u); /* (its __syncwarp: the lanes' atomics done) */
  if (lane == 0) {
    if (sh->ge[w]) atomicAdd(&wf.w->ge, (unsigned long long)sh->ge[w]);
    if (sh->el[w]) atomicAdd(&wf.w->eql[0], (unsigned long long)sh->el[w]);
    if (sh->eh[w]) atomicAdd(&wf.w->eqh[0], (unsigned long long)sh->eh[w]);
  }
}

/* Geometry of k_reduce_bulk's shared-memory ring for a dtype pair, its WIN
 * and its RL.  RB chunks a lane and step, BP stages a warp, chosen so that
 * the ring of 16-bit pairs is 48 KiB a block in every variant (RB * BP = 6
 * warp steps of 32 chunks of 32 bytes) beside the 58 KiB of per-thread
 * records, two blocks an SM.  A step's fixed cost (the mbarrier wait, the refill's two
 * bulk copies, the loop's bookkeeping: ~150 warp instructions, ~1/5 of a
 * bfloat16 step's; ncu, docs/performance.md, 2026-12-03 12:55 UTC) is
 * spread over its RB chunks:
 *   RB 3, BP 2  16-bit pairs (one 16-byte vector an operand), the flat run
 *               without a window (RL 0, WIN 0) or with the every-pair window
 *               (WIN 2), and rows (RL 1: a step of 96 chunks may cross row
 *               ends, one bulk copy an operand and row -- vg_ring_load): while
 *               one stage is folded the other is in flight -- a step (48
 *               pairs a lane) lasts several microseconds, far beyond a copy's
 *               latency;
 *   RB 2, BP 3  16-bit pairs with the sparse window (WIN 1, which reads its
 *               stage again after the folds: RB 3 measured slower);
 *   RB 1, BP 3  pairs of wider elements (two vectors an operand or more).
 * With RB > 1 each chunk is read from its stage just before its fold (one
 * chunk's words in registers, not RB: the fused window's two chunks did not
 * fit beside its counters when read together -- ptxas sm_90, bfloat16 WIN 2
 * spilled 144 bytes; docs/performance.md, 2026-12-01 22:25-23:38 UTC), so
 * the stage is released after the step's folds; with RB 1 it is read first
 * and refilled before the fold.  Measured (docs/performance.md, 2026-12-05
 * 12:20 UTC, an H200 and an H100): 2^28 bfloat16 pairs 6-9% faster without
 * quantiles (RB 3 against 2), 1-6% with the default p99 (RB 2 against 1;
 * RB 3 with the window was slower on noise, the sparse way, which reads its
 * stage again after the fold).  WIN 2 at RB 3 (2026-12-05 14:10 UTC, an
 * H100): the every-pair way's bf16 ties p99 1.03x RB 2 alone, within the
 * noise of that A/B's unchanged rows (1.02-1.03x); 0.93x with vg_win_mark.  The element -> thread assignment
 * follows RB, so the sums of the same pair may differ within rounding
 * between variants (a call with quantiles against one without, a row
 * layout against a flat one): each is bitwise repeatable. */
#define VG_BP 3 /* stages a warp (RB 1 and 2): while one is folded, two are being filled */
template <int DA, int DE, int WIN = 0, int RL = 0> struct vg_bulk {
  typedef vg_chunk<DA, DE> G;
  static constexpr int RB = G::NVA + G::NVE > 2 ? 1 : WIN == 1 ? 2 : 3;
  static constexpr int BP = RB == 3 ? 2 : VG_BP;
  static constexpr int CW = 32 * RB;                        /* chunks per warp step     */
  /* RL 1: the rows ring_layout admits hold a multiple of ROWC chunks -- the
     rows the 64-chunk steps of RB 2 read whole before RB 3 came to rows */
  static constexpr int ROWC = RB == 1 ? 32 : 64;
  static constexpr int BA = CW * 16 * G::NVA;               /* bytes of `actual`        */
  static constexpr int BE = CW * 16 * G::NVE;               /* bytes of `expected`      */
  static constexpr int STAGE = BA + BE;
  static_assert(RB == 1 || BP * STAGE == 6 * 1024, "the 16-bit rings: 6 KiB a warp whatever RB");
  static constexpr int SMEM = (int)(RT * sizeof(VAcc)) + (RT / 32) * BP * STAGE;
  static constexpr int SMEM_W = SMEM + (int)sizeof(VgWinSh); /* with the fused window */
};

/* Where the ring's chunks are (the host's ring_layout): a slice's inner
 * space (the whole tensor, or slice j of a row-mode reduction) of unit inner
 * stride, read a warp step -- CW chunks -- at a time into a stage.  FLAT (RL
 * 0, and the fused window's variants: vg_reduce_can_fuse): one whole-tensor
 * run, one bulk copy an operand a step.  Otherwise (RL 1) exactly what
 * ring_layout admits: two inner axes (it.k == 2), rows of L elements, A.cpr
 * whole chunks a row (vg_bulk::ROWC divides it, so a row is at least that
 * long) -- a step's chunks are one memory run a row they touch.  A step
 * starts at a multiple of 32 chunks (a block's first chunk is a multiple of
 * RT: the host's A.cpb), so a 96-chunk step over rows of a multiple of 64
 * crosses at most one row end: two copies an operand (the loop takes any
 * number; a helper's simulation of every start, 2026-12-05: never three).
 *   vg_ring_load   start the copies of chunks [cb, cb + nf) into a stage,
 *                  chunk i at byte 16 NV i of the operand's part, whatever
 *                  row it is in; when the rows are back to back in both
 *                  operands (a row's stride is its length, as in a
 *                  transposed contiguous matrix, whose memory is one run read
 *                  in another logical order), or every block lies inside one
 *                  row (cpb divides cpr: row mode's channels), A.rrun, the
 *                  host's: one copy an
 *                  operand, as FLAT: lane 0's division and split a step
 *                  (~6% of the transposed row's time, H100, docs/
 *                  performance.md 2026-12-05 19:27 UTC) only for rows apart;
 *   fi             the flat logical index of chunk cc's first pair (i0 =
 *                  cc * CH): FLAT, f0 + i0 * sf; otherwise the row's flat
 *                  offset plus the chunk's column times the inner axis's
 *                  flat stride, each lane's stepped by a cursor (VgRowCur,
 *                  cuda/vgct_cuda_internal.cuh: a step's chunks cb + lane +
 *                  32 u, u < RB, cross one row end at most) instead of a
 *                  division a chunk (~25 instructions: 3% of the transposed
 *                  and latent rows' time, H100, docs/performance.md,
 *                  2026-12-05 19:05 UTC; vg_ring_load's division, once a
 *                  step by lane 0, is kept: a second cursor for it was
 *                  slower).  (Made once a step by lane 0 and read from shared
 *                  memory instead, the index ran more instructions, not
 *                  fewer: ncu, 2026-12-03 10:50-11:50 UTC.)
 * The row code is compiled out of FLAT (compiled in, it cost the fused
 * variants 8-byte spills, ptxas sm_90, and the flat run's bf16 row ~5%). */
template <int CH, int ISA, int ISE, int NVA, int NVE, int BA, bool FLAT>
__device__ __forceinline__ void vg_ring_load(const RArgs &A, const char *pa, const char *pe,
                                             const char *ra, const char *re, int64_t cb, int nf,
                                             char *st, uint64_t *b) {
  /* nf > 0 (the caller's test) */
  const IterSpec &it = A.it;
  if constexpr (FLAT) { /* one copy an operand, from the parameter's own pointers */
    const char *qa = it.pa + cb * CH * ISA, *qe = it.pe + cb * CH * ISE;
    vg_bulk_load(st, qa, (unsigned)(nf * 16 * NVA), b);
    vg_bulk_load(st + BA, qe, (unsigned)(nf * 16 * NVE), b);
  } else if (A.rrun) { /* the block's chunks one run an operand (rows back to back: a
                          transposed contiguous matrix, or its slices; or the block
                          inside one row): one copy an operand from the run's base
                          (ra, re: the kernel's), as FLAT */
    vg_bulk_load(st, ra + cb * CH * ISA, (unsigned)(nf * 16 * NVA), b);
    vg_bulk_load(st + BA, re + cb * CH * ISE, (unsigned)(nf * 16 * NVE), b);
  } else {
    const int64_t row = (int64_t)vg_div((uint64_t)cb, A.cprd);
    vg_ring_segments(row, cb - row * A.cpr, nf, A.cpr, /* one copy an operand a row touched */
                     [&](int i, int64_t r, int64_t col, int n) {
                       vg_bulk_load(st + i * 16 * NVA, pa + (r * it.sa[0] + col * CH) * ISA,
                                    (unsigned)(n * 16 * NVA), b);
                       vg_bulk_load(st + BA + i * 16 * NVE, pe + (r * it.se[0] + col * CH) * ISE,
                                    (unsigned)(n * 16 * NVE), b);
                     });
  }
}

template <int DA, int DE, int SC, int WIN = 0, int RL = 0>
__global__ void __launch_bounds__(RT, 2) k_reduce_bulk(const __grid_constant__ RArgs A) {
  typedef vg_chunk<DA, DE> G;
  typedef vg_bulk<DA, DE, WIN, RL> B;
  static_assert(!(WIN && RL), "the fused window reads one whole-tensor run");
  static_assert(!WIN || (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok), "fused window: fast pairs");
  static_assert(WIN >= 0 && WIN <= 2, "WIN: 0 none, 1 the sparse way, 2 every pair classified");
  /* the fused window's way chosen on the device (WinState::mode): the three
     variants are launched in a row and only the chosen one runs (a block of
     the others reads one word and exits: ~2 us of device time each against
     the host round trip that chose before, ~20-40 us) */
  if (A.wsel != nullptr && __ldg(A.wsel) != WIN) return;
  extern __shared__ __align__(16) VAcc vsm[]; /* 16: the ring's bulk copies */
  __shared__ uint64_t bar[RT / 32][B::BP];
  const IterSpec &it = A.it;
  const int w = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
  char *ring = reinterpret_cast<char *>(vsm + RT) + (size_t)w * B::BP * B::STAGE;
  /* the fused window's stages after the ring (SMEM_W) */
  VgWinSh *wsh = reinterpret_cast<VgWinSh *>(reinterpret_cast<char *>(vsm + RT) +
                                             (size_t)(RT / 32) * B::BP * B::STAGE);
  VgWinCnt wc; /* the fused window's bounds and this thread's counts */
  VgLook lk;   /* WIN 1: the pair test's threshold, the chunk's candidates */
  lk.t32 = 0.0f;
  lk.cand = 0u;
  if constexpr (WIN) vg_win_begin(A.wf, wsh, wc, w, lane);
  if constexpr (WIN == 1) lk.t32 = vg_win_t32(A.wf.w);
  if (lane == 0) {
    for (int p = 0; p < B::BP; ++p) vg_mbar_init(&bar[w][p], 1);
    vg_mbar_init_fence();
  }
  __syncwarp();
  __shared__ GateHeld held[RT / 32];
  /* RL 1 (the host's ring_layout: rows, slices, a run in another logical
     order): row mode's block = slice j's g-th (A.bpj blocks a slice), with
     the slice's own shared thresholds (its maxima are its pairs'); otherwise
     one slice.  FLAT (RL 0, and the fused window's variants): one
     whole-tensor run, the row code compiled out -- the flat case's code is
     what it was before the rows came (they cost its bf16 no-quantile row
     ~5% when compiled in: docs/performance.md, 2026-12-03 08:00 UTC) */
  constexpr bool FLAT = WIN != 0 || RL == 0;
  const int64_t j = !FLAT && A.slice_mode == 1 ? (int64_t)blockIdx.x / A.bpj : 0;
  const int64_t g = (int64_t)blockIdx.x - j * (!FLAT && A.slice_mode == 1 ? A.bpj : 0);
  HotAcc h;
  FastGate gate;
  vgct_acc part; /* scaled path only (local memory) */
  unsigned *const glob = !FLAT && A.slice_mode == 1 ? (A.sgate ? A.sgate + 3 * j : NULL) : A.gate;
  vgct_acc *acc = vg_thread_start<DA, DE, SC, true>(vsm, h, gate, &held[w], glob, A.rtol, A.r32, part);
  vgct_acc *cold = VG_SCALED(SC) ? &part : acc; /* where vg_pair sends the definition path */
  int since = 0;                     /* pairs since the last flush */
  constexpr bool SO = vg_sums_only<DA, DE, SC>::v; /* (vg_thread_flush) */
  const int64_t c0 = g * A.cpb;
  const int64_t c1 = min(c0 + A.cpb, A.nchunk);
  /* the slice's first elements and flat index; sf: the flat index's stride
     inside a chunk (the inner axis's) */
  const char *const pa = it.pa + j * it.ssa * G::ISA, *const pe = it.pe + j * it.sse * G::ISE;
  const int64_t jf = it.f0 + j * it.ssf;
  const int64_t m = it.m, sf = FLAT ? it.sf[0] : it.sf[1]; /* (RL 1: it.k == 2) */
  const int64_t cfull = min(c1, m / G::CH); /* chunks below it are whole */
  /* RL 1, A.rrun: the base of the block's run an operand -- chunk cb at
     ra + cb CH: the slice's base moved by r0 (sa[0] - L) elements, r0 the
     block's row, L = cpr CH the row's length (0 when the rows are back to
     back: any r0) */
  const char *ra = pa, *re = pe;
  if constexpr (!FLAT)
    if (A.rrun) {
      const int64_t r0 = (int64_t)vg_div((uint64_t)c0, A.cprd), L = A.cpr * G::CH;
      ra = pa + r0 * (it.sa[0] - L) * G::ISA;
      re = pe + r0 * (it.se[0] - L) * G::ISE;
    }
  constexpr int CSTEP = RT * B::RB; /* chunks of the block per step */
  /* step k of warp w: chunks [cb, cb + CW) with cb = c0 + k*RT*RB + w*CW; lane l
     folds chunks cb + l + 32u.  Lane 0 arms stage k % BP with the bytes of
     the whole chunks and starts their copies (none: the phase completes on the
     arrival alone).  The loop carries cb, rem = cfull - cb (the whole chunks
     from cb on: the step's are rem clamped to [0, CW]), the stage p = k % BP
     and its mbarrier phase (k / BP) & 1 instead of dividing k each step.
     The step counters are 32-bit: 0 <= cfull - c0 <= c1 - c0 <= A.cpb < 2^30
     (a block's first chunk is below m / CH + 1; the host's VG_RING_CPB), so
     nstep CSTEP < 2^30 + CSTEP, and rem and rem - BP CSTEP stay within
     (-2^31, 2^30). */
  const int nstep = (int)((c1 - c0 + CSTEP - 1) / CSTEP);
  auto whole = [](int rem) { return min(max(rem, 0), B::CW); };
  auto issue = [&](int64_t cb, int rem, int p) {
    const int nf = whole(rem);
    char *st = ring + p * B::STAGE;
    uint64_t *b = &bar[w][p];
    vg_mbar_arrive_tx(b, (unsigned)(nf * 16 * (G::NVA + G::NVE)));
    if (nf > 0)
      vg_ring_load<G::CH, G::ISA, G::ISE, G::NVA, G::NVE, B::BA, FLAT>(A, pa, pe, ra, re, cb, nf, st, b);
  };
  int64_t cb = c0 + (int64_t)w * B::CW;
  int rem = (int)(cfull - cb);
  /* RL 1: the flat index of this lane's chunks cb + lane + 32 u, stepped
     (a chunk 32 u <= ROWC <= cpr columns on crosses one row end at most) */
  static_assert(FLAT || 32 * (B::RB - 1) <= B::ROWC, "VgRowCur: one row end a chunk");
  VgRowCur rc;
  if constexpr (!FLAT)
    rc = vg_rowcur_init(cb + lane, A.cpr, A.cprd, jf, it.sf[0], G::CH * it.sf[1], CSTEP);
  if (lane == 0)
    for (int k = 0; k < B::BP && k < nstep; ++k) issue(cb + k * CSTEP, rem - k * CSTEP, k);
  int p = 0;
  unsigned phase = 0;
#ifdef VGCT_PHASE_TRACE
  const unsigned long long pt_t0 = vg_gtimer();
  int pt_slow = 0;
#endif
  for (int k = 0; k < nstep; ++k, cb += CSTEP, rem -= CSTEP) {
    const int nf = whole(rem);
    vg_mbar_wait(&bar[w][p], phase);
    const uint4 *sa = reinterpret_cast<const uint4 *>(ring + p * B::STAGE);
    const uint4 *se = reinterpret_cast<const uint4 *>(ring + p * B::STAGE + B::BA);
    /* the chunk being folded, read from the stage: with RB > 1 just before
       its fold (vg_bulk), with RB 1 here, before the stage is refilled */
    constexpr bool LAZY = B::RB > 1;
    VChunk<DA, DE> ch;
    auto read = [&](int j) {
#pragma unroll
      for (int i = 0; i < G::NVA; ++i) ch.va[i] = sa[j * G::NVA + i];
#pragma unroll
      for (int i = 0; i < G::NVE; ++i) ch.ve[i] = se[j * G::NVE + i];
    };
    if constexpr (!LAZY)
      if (lane < nf) read(lane);
    const int pc = p; /* this step's stage */
    if constexpr (WIN != 1 && !LAZY) { /* RB 1: refilled before the fold (the sparse
                                           way reads the stage again after it) */
      vg_stage_release(); /* the reads before the refill's async writes (write after read) */
      __syncwarp();       /* every lane has read stage p: lane 0 may refill it */
      if (lane == 0 && k + B::BP < nstep) issue(cb + B::BP * CSTEP, rem - B::BP * CSTEP, pc);
    }
    if (++p == B::BP) { p = 0; phase ^= 1u; }
    bool slow = false;
#pragma unroll
    for (int u = 0; u < B::RB; ++u) {
      const int j = lane + 32 * u;
      const int64_t cc = cb + j, i0 = cc * G::CH;
      if (j < nf) {
        if constexpr (LAZY) read(j);
        const int64_t fi = FLAT ? it.f0 + i0 * it.sf[0] : vg_rowcur_at(rc, 32 * u);
        if constexpr (WIN == 1) {
          slow |= vg_fold_vec<DA, DE, SC>(h, gate, cold, ch, fi, sf, A.rtol, A.atol, &lk);
          vg_win_cand<DA, DE>(sa + j * G::NVA, se + j * G::NVE, lk, wc, A.wf, wsh, w); /* per lane */
        } else if constexpr (WIN == 2) {
          slow |= vg_fold_vec<DA, DE, SC>(h, gate, cold, ch, fi, sf, A.rtol, A.atol, nullptr,
                                          &wc);
          if (wc.in) vg_win_chunk<DA, DE>(ch, wc.in, A.wf, wsh, w); /* rare, per lane */
        } else {
          slow |= vg_fold_vec<DA, DE, SC>(h, gate, cold, ch, fi, sf, A.rtol, A.atol);
        }
      } else if (cc < c1) { /* the last chunk, partial: the definition (a whole-tensor
                               run only: the host gives the ring rows or slices only when
                               the rows hold whole chunks) */
        const int cnt = (int)min((int64_t)G::CH, m - i0);
        vg_fold_tail<DA, DE, SC>(cold, (FLAT ? it.pa : pa) + i0 * G::ISA,
                                 (FLAT ? it.pe : pe) + i0 * G::ISE, cnt,
                                 (FLAT ? it.f0 : jf) + i0 * sf, sf, A.rtol, A.atol);
        if constexpr (WIN) { /* its keys one by one */
          vg_f32chunk<G::CH> x;
#pragma unroll 1
          for (int q = 0; q < G::CH; ++q) {
            x.a[q] = q < cnt ? vgct_load_f32(it.pa + (i0 + q) * G::ISA, DA) : 0.0f;
            x.e[q] = q < cnt ? vgct_load_f32(it.pe + (i0 + q) * G::ISE, DE) : 0.0f;
          }
          vg_win_keys<G::CH>(x, cnt, A.wf, wsh, w);
        }
      }
    }
    /* stage pc read after the folds (RB > 1, and the sparse way's second
       read): released and refilled now */
    if constexpr (WIN == 1 || LAZY) vg_stage_release(); /* (before the __syncwarp below) */
    if constexpr (WIN) vg_win_flush(A.wf, wsh, w, lane, VG_WFLUSH); /* warp-uniform; its
                                                                       first __syncwarp: every
                                                                       lane is done with stage pc */
    else if constexpr (LAZY) __syncwarp(); /* every lane is done with stage pc */
    if constexpr (WIN == 1 || LAZY)
      if (lane == 0 && k + B::BP < nstep) issue(cb + B::BP * CSTEP, rem - B::BP * CSTEP, pc);
#ifdef VGCT_PHASE_TRACE
    pt_slow += __any_sync(0xffffffffu, slow) ? 1 : 0;
#endif
    vg_thread_step<DA, DE, SC, SO, true>(gate, h, part, acc, slow, since, B::RB * G::CH);
    if constexpr (!FLAT) vg_rowcur_step(rc);
  }
#ifdef VGCT_PHASE_TRACE
  if (lane == 0 && blockIdx.x < VG_PT_BLOCKS) { /* per warp: entry, loop end (ns), SM, slow steps */
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long *r = vg_pw[blockIdx.x * (RT / 32) + w];
    r[0] = pt_t0;
    r[1] = vg_gtimer();
    r[2] = ((unsigned long long)smid << 40) | ((unsigned long long)pt_slow << 20) | (unsigned)nstep;
  }
#endif
  vg_gate_finish<DA, DE, SC>(gate);
  if constexpr (WIN) vg_win_end(A.wf, wsh, wc, w, lane);
  vg_thread_flush<SC, SO>(h, part, acc);
  vg_reduce_finish<SC>(A, vsm);
#ifdef VGCT_PHASE_TRACE
  if (threadIdx.x == 0) { /* the grid's last block here prints every warp's stamps */
    __threadfence();
    if (atomicAdd(&vg_pw_done, 1u) == gridDim.x - 1) {
      __threadfence();
      const unsigned nb = min(gridDim.x, (unsigned)VG_PT_BLOCKS);
      for (unsigned i = 0; i < nb * (RT / 32); ++i) {
        const unsigned long long x = __ldcg(&vg_pw[i][2]);
        printf("VGPW %u %u %u %llu %llu %u %u\n", i / (RT / 32), (unsigned)(x >> 40),
               i % (RT / 32), __ldcg(&vg_pw[i][0]), __ldcg(&vg_pw[i][1]),
               (unsigned)((x >> 20) & 0xfffffu), (unsigned)(x & 0xfffffu));
      }
      vg_pw_done = 0;
    }
  }
#endif
}

/* RG: chunks in flight per thread and step.  RU (2) for every pair and layout
 * but one: float32 pairs (two 16-byte vectors an operand) whose inner dimension
 * is strided run RG = 1 (launch_reduce).  With two 8-pair float32 chunks the
 * strided branch's inlined fast path (vg_fold_scalar) spills (ptxas sm_90:
 * 240/220 bytes of spill stores/loads; 4/4 with RG = 1) and mixed layouts ran
 * 13% slower than with 4-pair chunks; contiguous rows keep RU, whose two
 * chunks in flight are worth 8% there (H200, 2^27 pairs: 1.58 ms vs 1.71 ms
 * with RG = 1).  Results do not depend on RG: a thread folds the same chunks
 * (c0 + lane + k RT at its k-th fold) in the same order and flushes after the
 * same pairs (VG_FLUSH is a multiple of 2 CH). */
template <int DA, int DE, int SC, int RG = RU>
__global__ void __launch_bounds__(RT, 2) k_reduce_gen(const __grid_constant__ RArgs A) {
  typedef vg_chunk<DA, DE> G;
  extern __shared__ __align__(16) VAcc vsm[]; /* 16: the ring's bulk copies */
  const IterSpec &it = A.it;
  const int64_t j = (int64_t)blockIdx.x / A.bpj, g = (int64_t)blockIdx.x - j * A.bpj;
  __shared__ GateHeld held[RT / 32];
  HotAcc h;
  FastGate gate;
  vgct_acc part; /* scaled path only (local memory) */
  /* row mode: slice j's own shared thresholds (its maxima are its pairs') */
  vgct_acc *acc = vg_thread_start<DA, DE, SC>(
      vsm, h, gate, &held[threadIdx.x >> 5],
      A.slice_mode == 1 ? (A.sgate ? A.sgate + 3 * j : NULL) : A.gate, A.rtol, A.r32, part);
  vgct_acc *cold = VG_SCALED(SC) ? &part : acc; /* where vg_pair sends the definition path */
  int since = 0;                     /* pairs since the last flush */
  constexpr bool SO = vg_sums_only<DA, DE, SC>::v; /* (vg_thread_flush) */
  const int64_t c0 = g * A.cpb;
  const int64_t c1 = min(c0 + A.cpb, A.nchunk);
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1], sfi = it.sf[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const int64_t ja = j * it.ssa, je = j * it.sse, jf = it.f0 + j * it.ssf;
  const bool unit = G::TYPED && sai == 1 && sei == 1;
  /* warp-uniform steps (vg_gate_refresh): lanes past c1 idle through the last one */
  for (int64_t cw = c0 + (threadIdx.x & ~31u); cw < c1; cw += (int64_t)RT * RG) {
    const int64_t c = cw + (threadIdx.x & 31u);
    bool slow = false;
    VChunk<DA, DE> ch[RG];
    bool v[RG];
    const char *qa[RG], *qe[RG];
    int64_t fq[RG];
    int cnt[RG];
#pragma unroll
    for (int u = 0; u < RG; ++u) {
      const int64_t cc = c + (int64_t)u * RT;
      v[u] = false;
      cnt[u] = 0;
      if (cc < c1) {
        const uint64_t row = vg_div((uint64_t)cc, A.cprd);
        const int64_t col0 = (cc - (int64_t)row * A.cpr) * G::CH;
        int64_t oa, oe, of;
        vg_row_offsets(it, row, oa, oe, of);
        oa += ja + col0 * sai;
        oe += je + col0 * sei;
        fq[u] = jf + of + col0 * sfi;
        cnt[u] = (int)min((int64_t)G::CH, L - col0);
        qa[u] = it.pa + oa * isa;
        qe[u] = it.pe + oe * ise;
        v[u] = unit && cnt[u] == G::CH && ((reinterpret_cast<uintptr_t>(qa[u]) & 15) == 0) &&
               ((reinterpret_cast<uintptr_t>(qe[u]) & 15) == 0);
        if (v[u]) {
#pragma unroll
          for (int i = 0; i < G::NVA; ++i) ch[u].va[i] = __ldcs(reinterpret_cast<const uint4 *>(qa[u]) + i);
#pragma unroll
          for (int i = 0; i < G::NVE; ++i) ch[u].ve[i] = __ldcs(reinterpret_cast<const uint4 *>(qe[u]) + i);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < RG; ++u) {
      if (v[u])
        slow |= vg_fold_vec<DA, DE, SC>(h, gate, cold, ch[u], fq[u], sfi, A.rtol, A.atol);
      else if (cnt[u] > 0)
        slow |= vg_fold_scalar<DA, DE, SC>(h, gate, cold, it, qa[u], qe[u], sai, sei, cnt[u], fq[u],
                                           sfi, A.rtol, A.atol);
    }
    vg_thread_step<DA, DE, SC, SO>(gate, h, part, acc, slow, since, RG * G::CH);
  }
  vg_thread_flush<SC, SO>(h, part, acc);
  vg_reduce_finish<SC>(A, vsm);
}

template <int DA, int DE, int SC>
__global__ void __launch_bounds__(RT, 2) k_reduce_col(const __grid_constant__ RArgs A) {
  extern __shared__ __align__(16) VAcc vsm[]; /* 16: the ring's bulk copies */
  const IterSpec &it = A.it;
  HotAcc h;
  FastGate gate; /* unused: column mode runs the generic dtypes only (no fast path) */
  vgct_acc part; /* scaled path only (local memory) */
  vgct_acc *acc = vg_thread_start<DA, DE, SC>(vsm, h, gate, NULL, NULL, A.rtol, A.r32, part);
  vgct_acc *cold = VG_SCALED(SC) ? &part : acc; /* where vg_pair sends the definition path */
  int since = 0;                     /* pairs since the last flush */
  const int64_t j = (int64_t)blockIdx.x * RT + threadIdx.x;
  if (j < it.S) {
    const int K = it.k;
    const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1], sfi = it.sf[K - 1];
    const int64_t isa = it.isa, ise = it.ise;
    const int64_t ja = j * it.ssa, je = j * it.sse, jf = it.f0 + j * it.ssf;
    for (int64_t r = 0; r < A.rows; ++r) {
      int64_t oa, oe, of;
      vg_row_offsets(it, (uint64_t)r, oa, oe, of);
      const char *qa = it.pa + (ja + oa) * isa, *qe = it.pe + (je + oe) * ise;
      const int64_t f = jf + of;
      for (int64_t q = 0; q < L; ++q)
      {
        if (vgct_pair_is_int64(it.da, it.de)) /* exact integers (generic dtypes only here) */
          vg_cold_update_int(cold, qa + q * sai * isa, it.da, qe + q * sei * ise, it.de,
                             f + q * sfi, A.rtol, A.atol);
        else
          vg_pair<SC>(h, cold, vg_ld<DA>(qa + q * sai * isa, it.da),
                      vg_ld<DE>(qe + q * sei * ise, it.de), f + q * sfi, A.rtol, A.atol);
        vg_thread_step<DA, DE, SC, false>(gate, h, part, acc, false, since, 1);
      }
    }
  }
  vg_thread_flush<SC, false>(h, part, acc);
  if (j < it.S) vgct_slice_from_acc(acc, &A.sres[j]);
  vg_reduce_finish<SC>(A, vsm);
}

/* vg_hot_flush out of line: one copy of vgct_acc_merge for k_reduce_lean's two
 * flush sites (code size; the fast kernels keep theirs inline, see vg_merge).
 * The out-of-line merge gets a copy of the HotAcc, and the caller zeroes the
 * original's sums and counters itself (what vg_hot_flush leaves in it): were
 * h's own address passed, ptxas could keep h in local memory through the
 * whole pair loop (it did, once the loop's addresses were stepped: LDL/STL
 * on every pair, 2026-12-03). */
__device__ __noinline__ void vg_lean_flush_out(HotAcc &t, vgct_acc *s) { vg_hot_flush(t, s); }
__device__ __forceinline__ void vg_lean_flush(HotAcc &h, vgct_acc *s) {
  HotAcc t = h; /* the copy's address escapes, not h's: h stays in registers */
  vg_lean_flush_out(t, s);
  vg_hot_clear(h); /* what vg_hot_flush leaves in h */
}

/* The thread's last flush: h's record stored as it is when nothing was
 * folded into s yet (vg_lean_store_fresh: no copy to the stack, no call, no
 * merge), else vg_lean_flush. */
__device__ __forceinline__ void vg_lean_flush_last(HotAcc &h, vgct_acc *s) {
  if (!vg_lean_store_fresh(h, s)) vg_lean_flush(h, s);
}

/* k_reduce_lean: VG_MODE_LEAN, small unscaled inputs of any layout (the
 * flat, general and row-mode iterations of k_reduce_gen, chunk by chunk):
 * every pair through vg_pair / vg_pair_fin (the register update,
 * vgct_acc_update's finite branch) or, for integer pairs with a 64-bit
 * side, vgct_acc_update_at; no gate, no vector loads, nothing unrolled; a
 * typed pair's next elements loaded while the current pair is folded.  Trade-off: ~70 instructions a
 * pair against the fast path's ~50, but no warm-up (the fast path's first
 * chunks of every warp fall back to the definition until its gate holds
 * maxima), and a shorter executed path (67 KB of code against the ring
 * kernel's 97 KB for bf16, sm_90), which a short launch fetches cold.  A
 * typed pair's finiteness is tested on its float32 values, and a thread's
 * last flush stores its register record as it is when nothing was folded
 * into its vgct_acc yet (vg_lean_flush_last: the whole flush of a small
 * input).  Where the time goes (2^20 bf16 pairs, 256 blocks, 17.5 us;
 * bench/phase_trace.py, docs/performance.md 2026-12-03 06:05 UTC): the
 * pair loop to the last flush ~8-10 us (16 pairs a thread: per warp one
 * instruction every ~10 cycles, a chain of dependent steps), the block's
 * merge with its barrier ~2 us, the arrival ~0.8, the last block's fold
 * ~3 us, the record and the completion word ~0.8.  Measured slower and
 * not kept: more loads in flight (a whole chunk at once, 2026-12-02 23:05
 * UTC); a chunk's pairs folded as independent work without branches, and
 * the warp's best maxima shared after its first step (2026-12-03). */
template <int DA, int DE>
__global__ void __launch_bounds__(RT, 2) k_reduce_lean(const __grid_constant__ RArgs A) {
  typedef vg_chunk<DA, DE> G;
  static_assert(!G::TYPED || vg_fast<DA, DE>::ok, "the typed loop reads float32 values");
  constexpr int SC = VG_MODE_LEAN;
  extern __shared__ __align__(16) VAcc vsm[];
  VG_PT_STAMP(0);
  const IterSpec &it = A.it;
  /* row mode: block = slice j's g-th; otherwise one slice (A.bpj is 1 in the flat iteration) */
  const int64_t j = A.slice_mode == 1 ? (int64_t)blockIdx.x / A.bpj : 0;
  const int64_t g = (int64_t)blockIdx.x - j * (A.slice_mode == 1 ? A.bpj : 0);
  HotAcc h;
  FastGate gate; /* unused in this mode */
  vgct_acc part; /* unused in this mode */
  vgct_acc *acc = vg_thread_start<DA, DE, SC>(vsm, h, gate, NULL, NULL, A.rtol, A.r32, part);
  int since = 0; /* pairs since the last flush */
  const int64_t c0 = g * A.cpb;
  const int64_t c1 = min(c0 + A.cpb, A.nchunk);
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1], sfi = it.sf[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const int64_t ja = j * it.ssa, je = j * it.sse, jf = it.f0 + j * it.ssf;
  const int da = it.da, de = it.de;
  const bool ints = !G::TYPED && vgct_pair_is_int64(da, de);
#pragma unroll 1
  for (int64_t c = c0 + threadIdx.x; c < c1; c += RT) {
    const uint64_t row = vg_div((uint64_t)c, A.cprd);
    const int64_t col0 = (c - (int64_t)row * A.cpr) * G::CH;
    int64_t oa, oe, of;
    vg_row_offsets(it, row, oa, oe, of);
    const char *qa = it.pa + (oa + ja + col0 * sai) * isa;
    const char *qe = it.pe + (oe + je + col0 * sei) * ise;
    const int64_t f = jf + of + col0 * sfi;
    const int cnt = (int)min((int64_t)G::CH, L - col0);
    if constexpr (G::TYPED) {
      /* the next pair's elements are loaded while this pair is folded (cnt >=
         1: a chunk starts inside its row): at 2^20 bf16 pairs the first use
         of each load held ~11% of the kernel's stall samples (ncu,
         docs/performance.md, 2026-12-02 20:55 UTC) */
      typename vg_isz<DA>::T ra = vg_ld_raw<DA>(qa);
      typename vg_isz<DE>::T re = vg_ld_raw<DE>(qe);
      /* the addresses and the flat index stepped, not recomputed: the same
         values, ~17 fewer 64-bit integer instructions a pair (the loop was
         ~92 SASS instructions a pair on its common path, sm_90) */
      const int64_t stepa = sai * isa, stepe = sei * ise;
      int64_t idx = f;
#pragma unroll 1
      for (int q = 0; q < cnt; ++q) {
        /* float16/bfloat16/float32 (the typed pairs here): the float32 value
           (vgct_load_f32, exact) widened is vgct_load's float64 value, and
           the pair is finite exactly when both float32 values are: the test
           in float32, on the load's own result, instead of two float64
           compares after the conversions (vg_pair_fin) */
        const float fa = vgct_load_f32(&ra, DA), fe = vgct_load_f32(&re, DE);
        const bool fin = vg_finite32(fa) && vg_finite32(fe);
        const double xa = (double)fa, xe = (double)fe;
        if (q + 1 < cnt) {
          qa += stepa;
          qe += stepe;
          ra = vg_ld_raw<DA>(qa);
          re = vg_ld_raw<DE>(qe);
        }
        vg_pair_fin<SC>(h, acc, xa, xe, fin, idx, A.rtol, A.atol);
        idx += sfi;
      }
    } else if (ints) {
      for (int q = 0; q < cnt; ++q)
        vg_cold_update_int(acc, qa + q * sai * isa, da, qe + q * sei * ise, de, f + q * sfi,
                           A.rtol, A.atol);
    } else {
#pragma unroll 1
      for (int q = 0; q < cnt; ++q)
        vg_pair<SC>(h, acc, vg_ld<DA>(qa + q * sai * isa, da), vg_ld<DE>(qe + q * sei * ise, de),
                    f + q * sfi, A.rtol, A.atol);
    }
    if ((since += cnt) >= VG_FLUSH) {
      since = 0;
      vg_lean_flush(h, acc);
    }
  }
  vg_lean_flush_last(h, acc);
  VG_PT_STAMP(1);
  vg_reduce_finish<SC>(A, vsm);
}

/* ---- launchers ---------------------------------------------------------- */

#define RSMEM ((int)(RT * sizeof(VAcc)))

/* Test hook (not an API; ctypes, like the others below): the reduce kernel
 * the last reduction launched -- 1 k_reduce_flat, 2 k_reduce_gen, 3
 * k_reduce_col, 4 k_reduce_bulk (the ring), 5 k_reduce_lean -- so that a
 * test can tell which kernel its layout took. */
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_kernel_last = 0;
/* ... and how the last k_reduce_bulk launch copied a step: 0 the flat run, 1
 * over rows split at row ends, 2 over rows as one run (A.rrun) */
__attribute__((visibility("default"))) long long vgct_cuda_test_ring_run_last = 0;
}

/* One k_reduce_bulk variant (WIN 0: no window; 1, 2: the fused window's two
 * ways) launched with its dynamic shared memory opted in (done: its flags). */
template <int DA, int DE, int SC, int WIN, int RL = 0>
static cudaError_t launch_bulk(int grid, const RArgs &A, cudaStream_t s, int *done) {
  const int bytes = WIN ? vg_bulk<DA, DE, WIN>::SMEM_W : vg_bulk<DA, DE, 0, RL>::SMEM;
  cudaError_t e = vg_smem_optin(k_reduce_bulk<DA, DE, SC, WIN, RL>, done, bytes);
  if (e != cudaSuccess) return e;
  vgct_cuda_test_kernel_last = 4;
  vgct_cuda_test_ring_run_last = RL ? (A.rrun ? 2 : 1) : 0;
  k_reduce_bulk<DA, DE, SC, WIN, RL><<<grid, RT, bytes, s>>>(A);
  return cudaGetLastError();
}

/* kind: 0 flat, 1 general strides / row mode, 2 column mode, 3 through the
 * shared-memory ring (typed pairs): a flat run, both bases 16-byte aligned
 * (RL 0), or the rows and slices ring_layout accepts (RL 1).  With
 * the fused window (A.wf.w) the ring's three variants are launched in a row,
 * each reading the device's choice (WinState::mode, through RArgs::wsel --
 * set here and nowhere else, so no other launch returns at once) and
 * returning at its first statement unless it is the chosen one; *fused = 1. */
template <int DA, int DE, int SC>
static cudaError_t launch_reduce(int kind, int grid, const RArgs &A, cudaStream_t s,
                                 int *fused) {
  static int done[8][64]; /* per kernel: flat, gen, col, bulk, gen with RG = 1, bulk + window
                             (the sparse way, every pair classified), bulk over rows (RL 1) */
  cudaError_t e;
  if constexpr (DA >= 0 && DE >= 0) {
    if (kind == 3) {
      /* the ring needs code compiled for sm_90+ (a build for older targets only,
         run from its PTX on a newer device, has the helpers compiled out):
         ptxVersion is the virtual architecture the kernel was compiled for */
      static int ring_ok[64]; /* per device: 0 unknown, 1 yes, -1 no */
      int dev = 0;
      if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
      if (dev >= 0 && dev < 64 && ring_ok[dev] == 0) {
        cudaFuncAttributes fa;
        if ((e = cudaFuncGetAttributes(&fa, k_reduce_bulk<DA, DE, SC>)) != cudaSuccess) return e;
        ring_ok[dev] = fa.ptxVersion >= 90 ? 1 : -1;
      }
      if (dev >= 0 && dev < 64 && ring_ok[dev] > 0) {
        if constexpr (SC == VG_MODE_FAST && vg_fast<DA, DE>::ok) {
          if (A.wf.w) { /* the fused key window: the way chosen on the device */
            RArgs W = A;
            W.wsel = &A.wf.w->mode;
            if ((e = launch_bulk<DA, DE, SC, VG_WIN_RECORD>(grid, W, s, done[3])) != cudaSuccess ||
                (e = launch_bulk<DA, DE, SC, VG_WIN_LOOK>(grid, W, s, done[5])) != cudaSuccess ||
                (e = launch_bulk<DA, DE, SC, VG_WIN_EVERY>(grid, W, s, done[6])) != cudaSuccess)
              return e;
            *fused = 1;
            return cudaSuccess;
          }
        }
        if (A.it.k == 1 && A.slice_mode == 0) return launch_bulk<DA, DE, SC, 0>(grid, A, s, done[3]);
        return launch_bulk<DA, DE, SC, 0, 1>(grid, A, s, done[7]); /* rows, slices */
      }
    }
  }
  if (kind == 3) /* no ring here: the flat kernel, same layout; rows or slices
                    (ring_layout): the general kernel, whose grid they have */
    kind = A.it.k == 1 && A.slice_mode == 0 ? 0 : 1;
  if (kind == 0) {
    if ((e = vg_smem_optin(k_reduce_flat<DA, DE, SC>, done[0], RSMEM)) != cudaSuccess) return e;
    vgct_cuda_test_kernel_last = 1;
    k_reduce_flat<DA, DE, SC><<<grid, RT, RSMEM, s>>>(A);
  } else if (kind == 1) {
    if constexpr (vg_chunk<DA, DE>::NVA > 1 && vg_chunk<DA, DE>::NVE > 1) {
      const int K = A.it.k; /* a strided inner dimension: one chunk in flight (k_reduce_gen's RG) */
      if (A.it.sa[K - 1] != 1 || A.it.se[K - 1] != 1) {
        if ((e = vg_smem_optin(k_reduce_gen<DA, DE, SC, 1>, done[4], RSMEM)) != cudaSuccess) return e;
        vgct_cuda_test_kernel_last = 2;
        k_reduce_gen<DA, DE, SC, 1><<<grid, RT, RSMEM, s>>>(A);
        return cudaGetLastError();
      }
    }
    if ((e = vg_smem_optin(k_reduce_gen<DA, DE, SC>, done[1], RSMEM)) != cudaSuccess) return e;
    vgct_cuda_test_kernel_last = 2;
    k_reduce_gen<DA, DE, SC><<<grid, RT, RSMEM, s>>>(A);
  } else if constexpr (DA < 0 && DE < 0) { /* column mode reads scalars: generic dtypes only */
    if ((e = vg_smem_optin(k_reduce_col<DA, DE, SC>, done[2], RSMEM)) != cudaSuccess) return e;
    vgct_cuda_test_kernel_last = 3;
    k_reduce_col<DA, DE, SC><<<grid, RT, RSMEM, s>>>(A);
  } else {
    return launch_reduce<-1, -1, SC>(kind, grid, A, s, fused);
  }
  return cudaGetLastError();
}

template <int DA, int DE>
static cudaError_t launch_lean(int grid, const RArgs &A, cudaStream_t s) {
  static int done[64];
  cudaError_t e = vg_smem_optin(k_reduce_lean<DA, DE>, done, RSMEM);
  if (e != cudaSuccess) return e;
  vgct_cuda_test_kernel_last = 5;
  k_reduce_lean<DA, DE><<<grid, RT, RSMEM, s>>>(A);
  return cudaGetLastError();
}

/* lean: k_reduce_lean (VG_MODE_LEAN) for an unscaled pair in the flat or general
 * iteration (kind 0, 1, 3); column mode (kind 2) and the scaled update keep
 * their kernels. */
static cudaError_t dispatch_reduce(int da, int de, int scaled, int lean, int kind, int grid,
                                   const RArgs &A, cudaStream_t s, int *typed, int *fused) {
  if (lean && !scaled && kind != 2) {
#define VG_CASE(X, Y)                                                                \
    if constexpr (X != VGCT_FLOAT64 && Y != VGCT_FLOAT64)                            \
      if (da == X && de == Y) {                                                      \
        *typed = 1;                                                                  \
        return launch_lean<X, Y>(grid, A, s);                                        \
      }
    VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
    *typed = 0;
    return launch_lean<-1, -1>(grid, A, s);
  }
#define VG_CASE(X, Y)                                                                \
  if (da == X && de == Y) {                                                          \
    *typed = 1;                                                                      \
    return launch_reduce<X, Y, (X == VGCT_FLOAT64 || Y == VGCT_FLOAT64)>(kind, grid, A, s, fused); \
  }
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  *typed = 0;
  return scaled ? launch_reduce<-1, -1, 1>(kind, grid, A, s, fused)
                : launch_reduce<-1, -1, 0>(kind, grid, A, s, fused);
}

/* k_reduce_bulk's dynamic shared memory for a typed pair; 0 for the others
 * (they have no ring). */
static int bulk_smem(int da, int de) {
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return max(vg_bulk<X, Y>::SMEM, vg_bulk<X, Y, 0, 1>::SMEM);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return 0;
}

/* The same with the fused window's stages; 0 for pairs without the fast path
 * (they have no fused kernel). */
static int bulk_smem_w(int da, int de) {
#define VG_CASE(X, Y) if (da == X && de == Y && vg_fast<X, Y>::ok) return vg_bulk<X, Y>::SMEM_W;
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The largest input (pairs) reduced in VG_MODE_LEAN: VG_LEAN_MAX (the
 * crossover measured on an H200 by bench/bench_lean.py, docs/performance.md:
 * the lean kernel 0.97-1.23x the fast path's speed up to 2^20 bf16/fp32 pairs
 * (1.05-1.06x at 2^20), 0.84-0.93x at 2^22, 0.4-0.7x from 2^24; 2^21 itself
 * not measured), unless the test/bench hook
 * vgct_cuda_test_lean_max (not an API: tests/.../test_gpu.py and
 * bench/bench_lean.py set it through ctypes on vgct_ext._C, like select.cu's
 * hooks) is >= 0: then that (0 never, a huge value always). */
#define VG_LEAN_MAX (INT64_C(1) << 21)
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_lean_max = -1;
}
static int64_t vg_lean_max(void) {
  const long long h = vgct_cuda_test_lean_max;
  return h >= 0 ? (int64_t)h : VG_LEAN_MAX;
}
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* The row unit of k_reduce_bulk's rows (RL 1, vg_bulk::ROWC) for a typed pair. */
static int bulk_rowc(int da, int de) {
#define VG_CASE(X, Y) if (da == X && de == Y) return vg_bulk<X, Y, 0, 1>::ROWC;
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return 0;
}

/* Whether k_reduce_bulk can read the general iteration of `it` (a whole
 * tensor of two inner axes, or the slices of row mode; cpr chunks of ch
 * pairs a row) -- vg_ring_load's layout: a typed pair whose ring this device
 * runs, exactly two inner axes, a unit-stride inner axis whose rows hold
 * whole chunks, a multiple of vg_bulk::ROWC of them (64 for the pairs read
 * three chunks a lane, RB 3: one 16-byte vector an operand a chunk, as
 * bfloat16, float16 and float64 pairs; 32 for RB 1, float32 and mixed
 * pairs: a step crosses at most one row end), every row's and slice's
 * first element 16-byte aligned (the bulk copies' alignment).  Not
 * (k_reduce_gen keeps them): three or more inner axes (an NCHW tensor read as
 * NHWC), where the ring measured slower for float32 (+7-11%) and no faster
 * for bfloat16 (docs/performance.md, 2026-12-03 08:00 UTC); one inner axis
 * in row mode, and rows that are one memory run but not of ROWC's multiple
 * (a transposed 1024 x 1000 bf16 matrix: 125 chunks a row).
 * The kernel's RL 1 code (vg_ring_load, VgRowCur) assumes exactly this
 * layout: widen it here only together with that code. */
static bool ring_layout(const DevWS *ws, const IterSpec &it, int64_t cpr, int64_t ch) {
  const int bs = bulk_smem(it.da, it.de);
  if (bs <= 0 || (size_t)bs > ws->smem_optin || ws->cc_major < 9) return false;
  const int K = it.k;
  if (K != 2) return false;
  if (it.sa[K - 1] != 1 || it.se[K - 1] != 1 || it.sh[K - 1] % ch != 0) return false;
  if ((uintptr_t)it.pa % 16 != 0 || (uintptr_t)it.pe % 16 != 0) return false;
  for (int d = 0; d < K - 1; ++d)
    if ((it.sa[d] * it.isa) % 16 != 0 || (it.se[d] * it.ise) % 16 != 0) return false;
  if (it.S > 1 && ((it.ssa * it.isa) % 16 != 0 || (it.sse * it.ise) % 16 != 0)) return false;
  return cpr % bulk_rowc(it.da, it.de) == 0;
}

/* Test/bench hooks (not an API; ctypes on vgct_ext._C, like the others):
 * vgct_cuda_test_fuse: 0 automatic; 1 never fuse the key window into the
 * reduction (the window plan then makes its own pass, k_sel_window); 2 start
 * the fused plan but always skip the window in the reduction (the window
 * pass after it); 3 fuse with the sparse way (VG_WIN_LOOK) and never skip, not
 * even a window [0, 0]; 4 the same with every pair classified (VG_WIN_EVERY);
 * 5 the automatic choice (as 0) at any n (2 to 5 also below select.cu's
 * WIN_FUSE_MIN pairs: the sanitizer's and the tests' small inputs).
 * vgct_cuda_test_fuse_last: 1 when the last vgct_cuda_compare counted its
 * window in the reduction the sparse way, 3 with every pair classified, 2
 * when it started the fused plan and the device left the window to the
 * record (hook 2, or win_record_answers: an identical pair, a caching
 * feature's output), 0 otherwise -- also when the ring kernel did not run
 * (the window plan's own pass then counts the window, whatever the device
 * chose). */
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_fuse = 0;
__attribute__((visibility("default"))) long long vgct_cuda_test_fuse_last = 0;
}

/* Test/bench hook (not an API; ctypes, like the others): vgct_cuda_test_mapped
 * = 1 makes a whole-tensor reduction write its result record to the device
 * workspace and copy it back (cudaMemcpyAsync), as with slices or without a
 * mapped pinned buffer; 0 (default): the last block writes it straight into
 * the mapped pinned buffer (DevWS.d_pin), which the host reads after the
 * stream's synchronisation -- one operation and its wait fewer a call. */
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_mapped = 0;
}

/* How the host learns that a whole-tensor reduction of at most VG_SIGNAL_MAX
 * pairs, without a fused window, is done: its last block writes a completion
 * word into the mapped pinned buffer (vg_signal_done) and the host reads that
 * word (CallCtx::wait_signal) instead of synchronising the stream -- ~2 us
 * sooner on an H200 (docs/performance.md, 2026-12-02 23:05 UTC; a small
 * call's floor is ~10 us of launch and wait).  Larger inputs synchronise:
 * there the 2 us are nothing.  The fused window copies its counts after the
 * kernel, so it synchronises too.  (A long queue of earlier work on the
 * stream: wait_signal spins for at most VG_SPIN_US, then leaves the rest to
 * the driver's wait.)
 * Test/bench hook (not an API; ctypes, like the others):
 * vgct_cuda_test_signal = 1 makes every reduction synchronise instead; 2
 * plants a fault: the host waits for a word the kernel is not asked to
 * write (the wait must end in an error once the stream is done, not hang). */
#define VG_SIGNAL_MAX (INT64_C(1) << 22)
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_signal = 0;
}

/* workspace layout (bytes from d_ws) */
/* (WS_COUNTER 0, WS_GATE 16, WS_RES 4096: vgct_cuda_internal.cuh, used by the
   chained kernels and a test hook) */
#define WS_SRES (WS_RES + 256)
#define WS_PART (WS_SRES + (size_t)VG_SLICE_CHUNK * sizeof(vgct_slice_acc) + 256)
#define WS_SGATE (WS_PART + (size_t)VG_MAX_PARTS * sizeof(vgct_acc)) /* 3 words per slice */

#define VG_MIN_CHUNKS 4  /* chunks a thread at least (fast path)       */
#define VG_LEAN_CHUNKS 2 /* chunks a thread at least (VG_MODE_LEAN)    */

/* Bench hook (not an API; ctypes, like the others): vgct_cuda_test_bpsm > 0
 * sets the blocks a SM that a whole-tensor or row-mode grid of the fast or
 * scaled kernels aims at (default 2: one resident wave, __launch_bounds__);
 * more blocks are more waves of smaller blocks, which the hardware hands to
 * whichever SM is free (bench/bench_grid.py).  The lean kernel's grid keeps 2. */
extern "C" {
__attribute__((visibility("default"))) long long vgct_cuda_test_bpsm = 0;
}
static int64_t vg_grid_target(const DevWS *ws, int lean) {
  const long long h = vgct_cuda_test_bpsm;
  return (int64_t)ws->sms * (!lean && h > 0 && h <= 64 ? (int64_t)h : 2);
}

/* The whole-tensor grid of the flat iteration (kind 0 / 3 below) over nchunk
 * chunks: the blocks and the chunks a block folds. */
static void flat_grid(const DevWS *ws, int64_t nchunk, int lean, int64_t *grid, int64_t *cpb) {
  const int64_t target = vg_grid_target(ws, lean);
  const int64_t minch = lean ? VG_LEAN_CHUNKS : VG_MIN_CHUNKS;
  int64_t blocks = ceil_div(nchunk, (int64_t)RT * minch);
  if (blocks > target) blocks = target;
  if (blocks < 1) blocks = 1;
  *cpb = round_up(ceil_div(nchunk, blocks), RT);
  *grid = ceil_div(nchunk, *cpb);
}

int vg_reduce_can_fuse(const DevWS *ws, const vgct_view *a, const vgct_view *e,
                       const vgct_params *p, int64_t *grid_out) {
  if (vgct_cuda_test_fuse == 1 || vgct_needs_scaling(a, e)) return 0;
  const int64_t n = vgct_numel(a);
  if (n == 0 || n <= vg_lean_max()) return 0;
  if (p->dim >= 0 && a->shape[p->dim] > 1) return 0;
  if (bulk_smem_w(a->dtype, e->dtype) <= 0 || ws->cc_major < 9 ||
      (size_t)bulk_smem_w(a->dtype, e->dtype) > ws->smem_optin)
    return 0;
  IterSpec it;
  char err[16];
  if (vg_prepare(a, e, -1, &it, err, sizeof err) != 0) return 0;
  if (!(it.S == 1 && it.k == 1 && it.sa[0] == 1 && it.se[0] == 1)) return 0;
  if ((uintptr_t)it.pa % 16 != 0 || (uintptr_t)it.pe % 16 != 0) return 0;
  const int64_t CH = vg_chunk_elems(it.da, it.de);
  int64_t grid, cpb;
  flat_grid(ws, ceil_div(it.m, CH), 0, &grid, &cpb);
  if (cpb * CH >= (INT64_C(1) << 31)) return 0; /* the warps' 32-bit counters: a block's pairs */
  *grid_out = grid;
  return 1;
}

extern "C" int vgct_cuda_reduce(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                                uintptr_t stream, vgct_acc *out, vgct_slice_acc *slices,
                                char *err, size_t errlen) {
  const int scaled = vgct_needs_scaling(a, e);
  vgct_acc_init(out, scaled);
  if (vgct_numel(a) == 0) { /* no device work (vg_reduce_run: the same, and the slices) */
    const int64_t nsl = p->dim >= 0 ? a->shape[p->dim] : 0;
    for (int64_t j = 0; j < nsl; ++j) vgct_slice_init(&slices[j], scaled);
    return VGCT_OK;
  }
  CallCtx cx("vgct_cuda_reduce", a->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  return vg_reduce_run(cx, a, e, p, out, slices, NULL, NULL, err, errlen);
}

int vg_reduce_run(CallCtx &cx, const vgct_view *a, const vgct_view *e, const vgct_params *p,
                  vgct_acc *out, vgct_slice_acc *slices, VgWinFuse *wf, VgChain *chain,
                  char *err, size_t errlen) {
  static_assert(WS_SGATE + 12u * (size_t)VG_MAX_PARTS <= VG_WS_BYTES, "workspace");
  static_assert(sizeof(vgct_acc) + (size_t)VG_SLICE_CHUNK * sizeof(vgct_slice_acc) <= VG_PIN_BYTES,
                "pinned buffer");
  if (wf) wf->used = 0;
  if (chain) chain->launched = 0;
  const int scaled = vgct_needs_scaling(a, e);
  vgct_acc_init(out, scaled);
  const int dim = p->dim;
  const int64_t nsl = dim >= 0 ? a->shape[dim] : 0;
  for (int64_t j = 0; j < nsl; ++j) vgct_slice_init(&slices[j], scaled);
  if (vgct_numel(a) == 0) return VGCT_OK;

  IterSpec it;
  int rc = vg_prepare(a, e, nsl > 1 ? dim : -1, &it, err, errlen);
  if (rc) return rc;
  DevWS *ws = cx.ws;

  RArgs A;
  memset(&A, 0, sizeof A);
  A.rtol = p->rtol;
  A.r32 = vg_f32_down(p->rtol);
  A.atol = p->atol;
  A.counter = (unsigned *)(ws->d_ws + WS_COUNTER);
  unsigned *gate = (unsigned *)(ws->d_ws + WS_GATE);
  /* the result record: into the mapped pinned buffer for one launch without
     slices (nothing on the device reads it), else the workspace + a copy */
  const bool mapped = it.S == 1 && ws->d_pin != NULL && vgct_cuda_test_mapped == 0;
  A.res = mapped ? (vgct_acc *)ws->d_pin : (vgct_acc *)(ws->d_ws + WS_RES);
  A.sres = (vgct_slice_acc *)(ws->d_ws + WS_SRES);
  static_assert((WS_SRES - WS_RES) + (size_t)VG_SLICE_CHUNK * sizeof(vgct_slice_acc) <= VG_PIN_DONE &&
                    VG_PIN_WIN + sizeof(WinState) <= VG_PIN_DONE,
                "h_pin: the completion word past every record copied there");
  const bool signal = mapped && wf == NULL && vgct_numel(a) <= VG_SIGNAL_MAX &&
                      vgct_cuda_test_signal != 1;
  unsigned *flag = (unsigned *)(ws->h_pin + VG_PIN_DONE);
  if (signal) {
    A.done = vgct_cuda_test_signal == 2 ? NULL : (unsigned *)(ws->d_pin + VG_PIN_DONE);
    A.seq = ++ws->seq != 0u ? ws->seq : ++ws->seq; /* never 0, the word's reset value */
    /* reset before the launch (ordered before it): a stale word never matches */
    __atomic_store_n(flag, 0u, __ATOMIC_RELEASE);
  }
  A.part = (vgct_acc *)(ws->d_ws + WS_PART);
  const int CH = vg_chunk_elems(it.da, it.de);
  /* blocks per launch: one resident wave (2 blocks per SM, __launch_bounds__)
     for large inputs -- the most pairs per thread, so the fast path's gate
     (vg_fast_chunk) settles early -- but at least VG_MIN_CHUNKS chunks per
     thread (small inputs: the per-block merge would dominate) */
  /* small inputs (at most vg_lean_max() pairs, unscaled): VG_MODE_LEAN, at least
     VG_LEAN_CHUNKS chunks a thread (more blocks: the register update needs
     more warps to hide its float64 latencies than the fast path does) */
  const int lean = !scaled && vgct_numel(a) <= vg_lean_max();
  const int64_t target = vg_grid_target(ws, lean);
  const int64_t minch = lean ? VG_LEAN_CHUNKS : VG_MIN_CHUNKS;

  const int64_t S = it.S;
  int kind;
  int64_t per_launch;
  if (S == 1) {
    kind = (it.k == 1 && it.sa[0] == 1 && it.se[0] == 1) ? 0 : 1;
    per_launch = 1;
  } else if (it.m >= VG_ROW_MIN) {
    kind = 1;
    per_launch = VG_MAX_PARTS < VG_SLICE_CHUNK ? VG_MAX_PARTS : VG_SLICE_CHUNK;
  } else {
    kind = 2;
    per_launch = VG_SLICE_CHUNK;
  }
  /* Ctrl-C is polled between launches: bound one launch's pairs (whole slices,
     at least one), so a signal waits for at most ~VG_LAUNCH_PAIRS pairs.  The
     partition depends on the shape alone: repeated calls stay bitwise equal. */
  if (S > 1 && it.m > 0 && per_launch > 1) {
    const int64_t by_pairs = VG_LAUNCH_PAIRS / it.m;
    if (by_pairs < per_launch) per_launch = by_pairs < 1 ? 1 : by_pairs;
  }
  const char *pa0 = it.pa, *pe0 = it.pe;
  const int64_t f00 = it.f0;
  for (int64_t j0 = 0; j0 < S; j0 += per_launch) {
    const int64_t Sc = S - j0 < per_launch ? S - j0 : per_launch;
    it.pa = pa0 + j0 * it.ssa * it.isa;
    it.pe = pe0 + j0 * it.sse * it.ise;
    it.f0 = f00 + j0 * it.ssf;
    it.S = Sc;
    A.it = it;
    int64_t grid;
    int lk = kind; /* this launch's kernel: 3 (the ring) where its layout allows */
    if (kind == 0) {
      A.slice_mode = 0;
      A.nchunk = ceil_div(it.m, CH);
      flat_grid(ws, A.nchunk, lean, &grid, &A.cpb);
      A.bpj = 1;
      A.cpr = A.nchunk; /* one row: k_reduce_lean's chunk -> position decomposition */
      A.cprd = vg_make_div((uint64_t)A.cpr);
      A.vec = ((uintptr_t)it.pa % 16 == 0) && ((uintptr_t)it.pe % 16 == 0);
      const int bs = bulk_smem(it.da, it.de);
      if (A.vec && ws->cc_major >= 9 && bs > 0 && (size_t)bs <= ws->smem_optin &&
          A.cpb < VG_RING_CPB)
        lk = 3; /* the ring (typed pairs only: bulk_smem is 0 otherwise) */
      /* the fused window (vg_reduce_can_fuse said yes to the caller): the
         partials where the caller has room, the window to the ring kernel */
      if (wf && lk == 3 && !lean && !scaled && bulk_smem_w(it.da, it.de) > 0 &&
          (size_t)bulk_smem_w(it.da, it.de) <= ws->smem_optin) {
        A.wf = *wf;
        A.part = wf->part;
      }
    } else if (kind == 1) {
      A.slice_mode = S > 1 ? 1 : 0;
      const int64_t L = it.sh[it.k - 1];
      A.cpr = ceil_div(L, CH);
      A.cprd = vg_make_div((uint64_t)A.cpr);
      A.nchunk = (it.m / L) * A.cpr;
      int64_t bpj = target / Sc; /* Sc * bpj <= one resident wave when Sc <= target */
      if (bpj < 1) bpj = 1;
      const int64_t work = ceil_div(A.nchunk, (int64_t)RT * minch);
      if (bpj > work) bpj = work;
      if (bpj * Sc > VG_MAX_PARTS) bpj = VG_MAX_PARTS / Sc;
      if (bpj < 1) bpj = 1;
      A.cpb = round_up(ceil_div(A.nchunk, bpj), RT);
      A.bpj = ceil_div(A.nchunk, A.cpb);
      grid = Sc * A.bpj;
      /* the ring where the layout lets each warp step's chunks be a bulk
         copy an operand and row (ring_layout, vg_ring_load): a transposed
         matrix, rows apart in memory, the slices of row mode, two inner axes
         with rows of whole chunks, a multiple of ROWC; the grid above is the general kernel's, which
         the ring folds the same way (docs/performance.md 2026-12-03 08:00
         UTC: the transposed and latent rows) */
      if (!lean && A.cpb < VG_RING_CPB && ring_layout(ws, it, A.cpr, CH)) {
        lk = 3;
        /* (it.k == 2) one run an operand a block: the rows back to back, or
           every block inside one row (cpb, a multiple of RT, divides cpr:
           the latent's channels, two rows of 2^20 chunks apart) */
        A.rrun = (it.sa[0] == A.cpr * CH && it.se[0] == A.cpr * CH) || A.cpr % A.cpb == 0;
      }
    } else {
      A.slice_mode = 2;
      A.rows = it.m / it.sh[it.k - 1];
      A.bpj = 1;
      grid = ceil_div(Sc, RT);
    }
    A.gate = A.slice_mode == 0 ? gate : NULL; /* per-slice maxima: each slice its own */
    A.sgate = NULL;
    /* row mode with a narrow typed pair (the only kernels with a gate);
       Sc <= VG_MAX_PARTS in row mode (per_launch) */
    if (A.slice_mode == 1 && !scaled && !lean && vg_is_typed_pair(it.da, it.de)) {
      A.sgate = (unsigned *)(ws->d_ws + WS_SGATE);
      if (!cx.check(cudaMemsetAsync(A.sgate, 0, 12u * (size_t)Sc, cx.stream),
                    "cudaMemsetAsync (per-slice gate thresholds)"))
        return cx.rc;
    }
    const size_t bytes = S > 1 ? (WS_SRES - WS_RES) + (size_t)Sc * sizeof(vgct_slice_acc) : sizeof(vgct_acc);
    /* a kernel chained behind this launch (below): one launch covering every
       slice (a small call), its record and slices below the chained kernel's
       answers in the pinned buffer, no fused window; it reads the record in
       device memory (VgChain), a copy when the host's is the mapped one */
    bool chained = chain != NULL && wf == NULL && j0 == 0 && Sc == S && ws->d_pin != NULL &&
                   bytes <= VG_PIN_TINY;
    vgct_acc *rec_dev = (vgct_acc *)(ws->d_ws + WS_RES);
    A.res_dev = chained && mapped ? rec_dev : NULL;
    int typed = 0, fused = 0;
    if (!cx.check(dispatch_reduce(it.da, it.de, scaled, lean, lk, (int)grid, A, cx.stream, &typed,
                                  &fused),
                  lk == 0 ? "k_reduce_flat launch"
                  : lk == 1 ? "k_reduce_gen launch"
                  : lk == 2 ? "k_reduce_col launch" : "k_reduce_bulk launch"))
      return cx.rc;
    if (wf && fused) wf->used = 1;
    cx.mark("launch");
    if (!mapped) {
      if (!cx.check(cudaMemcpyAsync(ws->h_pin, ws->d_ws + WS_RES, bytes, cudaMemcpyDeviceToHost,
                                    cx.stream),
                    "cudaMemcpyAsync (result record to host)"))
        return cx.rc;
      cx.mark("memcpy");
    }
    /* the chained kernel behind the reduction (and the record's copy) */
    unsigned *flag2 = (unsigned *)(ws->h_pin + VG_PIN_DONE2), seq2 = 0;
    if (chained) {
      /* its word: asked of it when the reduction's own is (the same rules), else
         the stream's synchronisation; reset before the launch, as the reduction's */
      unsigned *done2 = NULL;
      if (signal) {
        seq2 = ++ws->seq != 0u ? ws->seq : ++ws->seq;
        __atomic_store_n(flag2, 0u, __ATOMIC_RELEASE);
        done2 = vgct_cuda_test_signal == 2 ? NULL : (unsigned *)(ws->d_pin + VG_PIN_DONE2);
      }
      const cudaError_t ce = chain->launch(chain->ctx, rec_dev, done2, seq2, cx.stream);
      if (ce == cudaErrorCooperativeLaunchTooLarge) {
        /* a cooperative grid the device cannot hold at once now (e.g. an MPS share of
           its SMs): not launched, nothing queued -- the caller selects after the record */
        (void)cudaGetLastError();
        chained = false;
      } else if (!cx.check(ce, "the kernel chained behind the reduction (launch)")) {
        return cx.rc;
      } else {
        chain->launched = 1;
        cx.mark("chain");
      }
    }
    if (wf && fused) { /* the window's counts in this round trip (select.cu win_answer) */
      static_assert(sizeof(vgct_acc) <= VG_PIN_WIN && VG_PIN_WIN + sizeof(WinState) <= VG_PIN_BYTES,
                    "h_pin: the record, then the fused window's counts");
      if (!cx.check(cudaMemcpyAsync(ws->h_pin + VG_PIN_WIN, wf->w, sizeof(WinState),
                                    cudaMemcpyDeviceToHost, cx.stream),
                    "cudaMemcpyAsync (fused window counts to host)"))
        return cx.rc;
      wf->copied = 1;
    }
    if (signal && chained) {
      /* the chained kernel's word: it ran after the reduction, whose own word
         (written last, after a system-scope fence) is then there too */
      const cudaError_t we = cx.wait_signal(flag2, seq2);
      if (!cx.check(we, we == cudaErrorUnknown
                            ? "waiting for the chained kernel's completion word (the stream "
                              "finished without it: an internal error)"
                            : "waiting for the chained kernel's completion word (after reduce)"))
        return cx.rc;
      if (A.done != NULL && __atomic_load_n(flag, __ATOMIC_ACQUIRE) != A.seq &&
          !cx.check(cudaErrorUnknown, "reading the reduction's completion word after the chained "
                                      "kernel's (not written: an internal error)"))
        return cx.rc;
    } else if (signal) {
      /* cudaErrorUnknown from the wait: the stream finished and the word never came */
      const cudaError_t we = cx.wait_signal(flag, A.seq);
      if (!cx.check(we, we == cudaErrorUnknown
                            ? "waiting for the reduction's completion word (the stream finished "
                              "without it: an internal error)"
                            : "waiting for the reduction's completion word (after reduce)"))
        return cx.rc;
    } else if (!cx.check(cx.sync(), "cudaStreamSynchronize (after reduce)")) {
      return cx.rc;
    }
    cx.mark("sync");
    vgct_acc part;
    memcpy(&part, ws->h_pin, sizeof part);
    vgct_acc_merge(out, &part);
    if (S > 1)
      memcpy(&slices[j0], ws->h_pin + (WS_SRES - WS_RES), (size_t)Sc * sizeof(vgct_slice_acc));
    if (j0 + per_launch < S && vgct_interrupted(p)) { /* Ctrl-C between chunked launches */
      snprintf(err, errlen, "vgct_cuda_reduce: interrupted after %lld of %lld slices",
               (long long)(j0 + Sc), (long long)S);
      return VGCT_EINTR;
    }
  }
  if (nsl == 1) vgct_slice_from_acc(out, &slices[0]);
  return cx.rc;
}
