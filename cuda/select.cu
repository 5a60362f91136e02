/*
 * select.cu -- vgct_cuda_select: exact order statistics of |a_i - e_i| over
 * the finite pairs, by radix selection over the uint64 keys of
 * vgct_absdiff_key (vgct_stats.h; bit 63 is always 0).  No sort of the data,
 * extra memory bounded (the 16 MiB workspace): histograms and a candidate
 * buffer of at most SEL_CAP keys.
 *
 * Digits: level 0 = key bits 62..48 (15 bits: the exponent and 4 mantissa
 * bits, a 1/16-octave bucket), levels 1..4 = 12 bits each (47..36, 35..24,
 * 23..12, 11..0).  After level L every wanted rank knows the bucket (key
 * prefix) holding it and its rank inside that bucket; after level 4 the
 * prefix is the key.  Ranks sharing a prefix share a histogram ("group").
 *
 * Kernels:
 *   k_sel_data<DA,DE,MODE>  one pass over the inputs (same iteration model
 *                      and loaders as the reduce; float16/bfloat16/float32
 *                      keys by vg_key_narrow): per key, by MODE, one of
 *                      - histogram of the level's digit for keys in a group
 *                        (block-private shared-memory counters, flushed to
 *                        global with integer atomics; a run-length cache
 *                        absorbs the common runs of equal digits, e.g. |d|=0),
 *                      - store every key in place (n <= SEL_CAP: the inputs
 *                        are read once, later levels read the buffer),
 *                      - append keys of the wanted buckets to the candidate
 *                        buffer (warp-aggregated integer atomic).
 *   k_sel_buf          the same histogram over the candidate buffer (L2-
 *                      resident, small).
 *   Each kernel's last block (integer counter) scans the histogram and moves
 *   every rank one level down (vg_sel_scan), so consecutive levels need no
 *   host round trip.
 * Plan: n <= SEL_CAP: data pass (level 0 + store keys), 4 buffer passes, one
 * copy to the host.  Larger n: data pass (level 0), then a compaction pass
 * when the wanted buckets hold <= SEL_CAP keys (the usual case: a 1/16-octave
 * bucket), else one more data histogram level first (heavy ties); then the
 * buffer passes.  So 2 passes over the inputs normally, at most 6.
 * Trade-off: integer atomics make the candidate order nondeterministic, but
 * an order statistic does not depend on order: results are exact and
 * repeatable.
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
   calls are serialised by the device lock) */
#define WS_SEL_CNT 64                    /* 5 last-block counters             */
#define WS_SEL_STATE 4096
#define WS_SEL_HIST 8192                 /* 5 levels x SEL_BINS x u64        */
#define WS_SEL_CAND (2u << 20)
#define WS_SEL_CLEAR_END (WS_SEL_HIST + 5u * SEL_BINS * 8u)

struct SelState {
  unsigned long long total;   /* finite keys (level-0 count)          */
  unsigned long long ncand;   /* keys in the candidate buffer         */
  int ng, bad;                /* groups; a rank >= total was asked    */
  unsigned long long gprefix[SEL_NS];
  int slot_group[SEL_NS];
  unsigned long long prefix[SEL_NS];
  long long rank[SEL_NS];
  unsigned long long count[SEL_NS];
};

__host__ __device__ __forceinline__ int sel_shift(int L) { return L == 0 ? 48 : 48 - 12 * L; }
__host__ __device__ __forceinline__ int sel_bits(int L) { return L == 0 ? 15 : 12; }
__host__ __device__ __forceinline__ int sel_pshift(int L) { return L == 0 ? 63 : sel_shift(L - 1); }

struct KArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int level;      /* histogram level, -1 none                            */
  int store_all;  /* store every key at its position (n <= SEL_CAP)      */
  int compact;    /* append keys whose prefix at level `clevel` is wanted */
  int clevel;
  int ns;
  long long rank0[SEL_NS];
  SelState *st;
  unsigned long long *hist; /* this level's histograms                  */
  unsigned long long *cand;
  unsigned *counter;        /* this level's last-block counter          */
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

__device__ void vg_sel_scan(const KArgs &A, int level) {
  SelState *st = A.st;
  const int nb = level == 0 ? SEL_BINS : 4096, bits = sel_bits(level);
  const int per = nb / ST;
  __shared__ unsigned long long s_w[ST / 32];
  __shared__ unsigned long long s_below, s_cnt, s_tot;
  __shared__ int s_bin;
  __shared__ unsigned long long n_prefix[SEL_NS], n_count[SEL_NS];
  __shared__ long long n_rank[SEL_NS];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int s = 0; s < A.ns; ++s) {
    const int g = level == 0 ? 0 : st->slot_group[s];
    const long long rank = level == 0 ? A.rank0[s] : st->rank[s];
    const unsigned long long *h = A.hist + (size_t)g * nb;
    const int b0 = threadIdx.x * per;
    unsigned long long sum = 0;
#pragma unroll 8
    for (int b = 0; b < per; ++b) sum += __ldcg(h + b0 + b);
    /* block exclusive scan of the per-thread sums */
    unsigned long long inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane == 31) s_w[w] = inc;
    if (threadIdx.x == 0) s_bin = -1;
    __syncthreads();
    if (w == 0) {
      unsigned long long v = s_w[lane], iv = v;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, iv, o);
        if (lane >= o) iv += y;
      }
      s_w[lane] = iv - v; /* exclusive over warps */
      if (lane == 31) s_tot = iv;
    }
    __syncthreads();
    const unsigned long long excl = s_w[w] + inc - sum;
    if ((unsigned long long)rank >= excl && (unsigned long long)rank < excl + sum && rank >= 0) {
      /* no early exit: the loads are independent and issue together (a
         break after each would make `per` L2 round trips in a row) */
      unsigned long long c = excl;
      int fb = -1;
      unsigned long long fbelow = 0, fcnt = 0;
#pragma unroll 8
      for (int b = 0; b < per; ++b) {
        const unsigned long long hb = __ldcg(h + b0 + b);
        if (fb < 0 && (unsigned long long)rank < c + hb) {
          fb = b;
          fbelow = c;
          fcnt = hb;
        }
        c += hb;
      }
      s_bin = b0 + fb;
      s_below = fbelow;
      s_cnt = fcnt;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (level == 0) st->total = s_tot;
      const unsigned long long old = level == 0 ? 0ull : st->prefix[s];
      if (s_bin < 0) {
        st->bad = 1;
        n_prefix[s] = old << bits;
        n_rank[s] = 0;
        n_count[s] = 0;
      } else {
        n_prefix[s] = (old << bits) | (unsigned long long)s_bin;
        n_rank[s] = rank - (long long)s_below;
        n_count[s] = s_cnt;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int ng = 0;
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
      st->rank[s] = n_rank[s];
      st->count[s] = n_count[s];
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
  extern __shared__ unsigned sel_sm[];
  const IterSpec &it = A.it;
  SelState *st = A.st;
  HistCtx h;
  hist_begin(h, sel_sm, MODE == SEL_COMPACT ? -1 : A.level, st);
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
          if (MODE != SEL_COMPACT) hist_key(h, key);
          if (MODE == SEL_HIST_STORE) A.cand[pos0[u] + q] = key;
          if (MODE == SEL_COMPACT && sel_wanted(cshift, cng, cgp, clo, chi, key)) sel_append(A, st, key);
        }
      }
    }
  }
  if (MODE != SEL_COMPACT) {
    hist_end(h, A.hist);
    if (vg_last_block(A.counter)) vg_sel_scan(A, A.level);
  }
}

__global__ void __launch_bounds__(ST, 1) k_sel_buf(const __grid_constant__ KArgs A) {
  extern __shared__ unsigned sel_sm[];
  SelState *st = A.st;
  HistCtx h;
  hist_begin(h, sel_sm, A.level, st);
  unsigned long long n = A.store_all ? (unsigned long long)A.it.m : st->ncand;
  if (n > SEL_CAP) n = SEL_CAP;
  for (unsigned long long i = (unsigned long long)blockIdx.x * ST + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * ST)
    hist_key(h, __ldcg(A.cand + i));
  hist_end(h, A.hist);
  if (vg_last_block(A.counter)) vg_sel_scan(A, A.level);
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
  k_sel_buf<<<grid, ST, SEL_SMEM, s>>>(A);
  return cudaGetLastError();
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

extern "C" int vgct_cuda_select(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                                uintptr_t stream, const int64_t *ranks, int nranks,
                                double *values, char *err, size_t errlen) {
  static_assert(WS_SEL_CLEAR_END <= WS_SEL_CAND, "select workspace layout");
  static_assert(WS_SEL_CAND + (size_t)SEL_CAP * 8 <= VG_WS_BYTES, "select workspace size");
  static_assert(sizeof(SelState) <= 4096, "state");
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
  IterSpec it;
  int rc = vg_prepare(a, e, -1, &it, err, errlen);
  if (rc) return rc;
  CallCtx cx("vgct_cuda_select", a->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  DevWS *ws = cx.ws;
  if (ws->smem_optin < SEL_SMEM) {
    snprintf(err, errlen, "vgct_cuda_select: device %d allows %zu bytes of shared memory per block, "
             "%d needed", cx.dev, ws->smem_optin, SEL_SMEM);
    return VGCT_ECUDA;
  }

  /* distinct ranks, ascending */
  int64_t uniq[2 * 64];
  int nu = 0;
  int64_t *ubuf = nranks <= 128 ? uniq : (int64_t *)malloc(sizeof(int64_t) * (size_t)nranks);
  if (!ubuf) {
    snprintf(err, errlen, "vgct_cuda_select: out of host memory");
    return VGCT_ENOMEM;
  }
  for (int r = 0; r < nranks; ++r) {
    int64_t v = ranks[r];
    int i = nu;
    bool dup = false;
    for (int j = 0; j < nu; ++j)
      if (ubuf[j] == v) dup = true;
    if (dup) continue;
    while (i > 0 && ubuf[i - 1] > v) {
      ubuf[i] = ubuf[i - 1];
      --i;
    }
    ubuf[i] = v;
    ++nu;
  }

  KArgs A;
  memset(&A, 0, sizeof A);
  A.it = it;
  const int CH = vg_chunk_elems(it.da, it.de);
  const int64_t L = it.sh[it.k - 1];
  A.cpr = cdiv(L, CH);
  A.cprd = vg_make_div((uint64_t)A.cpr);
  A.nchunk = (it.m / L) * A.cpr;
  A.st = (SelState *)(ws->d_ws + WS_SEL_STATE);
  A.cand = (unsigned long long *)(ws->d_ws + WS_SEL_CAND);
  /* at least 8 chunks per thread: each block zeroes and flushes 128 KiB of
     counters, which must not dominate small inputs */
  const int gdata = (int)(cdiv(A.nchunk, ST * 8) < ws->sms ? cdiv(A.nchunk, ST * 8) : ws->sms);
  const bool small = (uint64_t)it.m <= SEL_CAP;
  SelState hs;
  double *vals = (double *)malloc(sizeof(double) * (size_t)nu);
  if (!vals) {
    if (ubuf != uniq) free(ubuf);
    snprintf(err, errlen, "vgct_cuda_select: out of host memory");
    return VGCT_ENOMEM;
  }

#define SEL_CK(call, what)        \
  if (!cx.check((call), what)) {  \
    rc = cx.rc;                   \
    goto out;                     \
  }
  for (int b0 = 0; b0 < nu; b0 += SEL_NS) {
    const int ns = nu - b0 < SEL_NS ? nu - b0 : SEL_NS;
    A.ns = ns;
    for (int s = 0; s < SEL_NS; ++s) A.rank0[s] = s < ns ? (long long)ubuf[b0 + s] : 0;
    SEL_CK(cudaMemsetAsync(ws->d_ws + WS_SEL_CNT, 0, WS_SEL_CLEAR_END - WS_SEL_CNT, cx.stream),
           "cudaMemsetAsync (select workspace)");
    int level = 0;
    /* level 0 over the data (and, for small n, keep every key) */
    A.level = 0;
    A.store_all = small;
    A.compact = 0;
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
        SEL_CK(cudaStreamSynchronize(cx.stream), "cudaStreamSynchronize (select)");
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
    if (!(level == 4 || (!small && hs.bad))) {
      const int64_t gb = cdiv(nbuf > 0 ? nbuf : 1, (int64_t)ST * 8);
      const int gbuf = (int)(gb < ws->sms ? gb : ws->sms);
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
      SEL_CK(cudaStreamSynchronize(cx.stream), "cudaStreamSynchronize (select)");
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
      int64_t worst = ubuf[b0 + ns - 1];
      snprintf(err, errlen, "vgct_cuda_select: rank %lld out of range [0, %llu)", (long long)worst,
               hs.total);
      rc = VGCT_EVALUE;
      goto out;
    }
    for (int s = 0; s < ns; ++s) vals[b0 + s] = vgct_f64_from_bits(hs.prefix[s]);
    if (b0 + SEL_NS < nu && vgct_interrupted(p)) { /* Ctrl-C between rank batches */
      snprintf(err, errlen, "vgct_cuda_select: interrupted after %d of %d ranks", b0 + ns, nu);
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
