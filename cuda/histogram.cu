/*
 * histogram.cu -- vgct_cuda_histogram (contract: csrc/vgct_engine.h, the CUDA
 * twin of vgct_cpu_histogram): one radix digit of the selection keys
 * (vgct_absdiff_key, vgct_stats.h) of the finite pairs whose top prefix_bits
 * bits equal one of the given prefixes, for the distributed radix selection
 * of compare_sharded ([E], vgct_ext/core/sharded.py).
 *
 * The same iteration model and loaders as k_sel_data (select.cu); one data
 * pass per batch of prefixes; block-private 32-bit shared-memory counters with
 * a run-length cache when the batch's bins fit (widths <= 15 for one prefix,
 * <= 12 for up to 8), else 64-bit global atomics; counts copied to the host
 * row by row.  Integer counts: the result is exact and does not depend on the
 * schedule.
 *
 * Variants: shared-memory counters (one atomic per run of equal bins, then one
 * global atomic per nonzero bin per block) when the batch's bins fit the
 * block's shared memory; else one 64-bit global atomic per key (slower, any
 * width up to 16).  Memory: 8 MiB of the device workspace (2-10 MiB region),
 * nothing the size of the inputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vgct_cuda_internal.cuh"

#define HT 1024                          /* threads per block                    */
#define H_SMEM_MAX (128u << 10)          /* shared counters per block, bytes     */
#define H_WS_OFF (2u << 20)              /* workspace region for the histogram   */
#define H_WS_BYTES (8u << 20)

struct HArgs {
  IterSpec it;
  int64_t nchunk, cpr;
  FastDiv cprd;
  int all, pshift, dshift, np, smem;
  unsigned long long dmask;
  unsigned long long pre[VGCT_HIST_MAX_PREFIXES]; /* ascending */
  unsigned long long *hist;                       /* np << width, u64 */
};

__device__ __forceinline__ int h_row(const HArgs &A, unsigned long long key) {
  if (A.all) return 0;
  const unsigned long long p = key >> A.pshift;
  int lo = 0, hi = A.np - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (A.pre[mid] < p) lo = mid + 1; else hi = mid;
  }
  return A.pre[lo] == p ? lo : -1;
}

template <int DA, int DE>
__global__ void __launch_bounds__(HT, 1) k_hist(const __grid_constant__ HArgs A) {
  typedef vg_chunk<DA, DE> G;
  extern __shared__ unsigned hsm[];
  const IterSpec &it = A.it;
  const unsigned nbins = (unsigned)A.np * (unsigned)(A.dmask + 1);
  if (A.smem) {
    for (unsigned i = threadIdx.x; i < nbins; i += HT) hsm[i] = 0;
    __syncthreads();
  }
  unsigned last = 0, run = 0;
  const int K = it.k;
  const int64_t L = it.sh[K - 1], sai = it.sa[K - 1], sei = it.se[K - 1];
  const int64_t isa = G::TYPED ? G::ISA : it.isa, ise = G::TYPED ? G::ISE : it.ise;
  const bool unit = G::TYPED && sai == 1 && sei == 1;
  for (int64_t c = (int64_t)blockIdx.x * HT + threadIdx.x; c < A.nchunk;
       c += (int64_t)gridDim.x * HT) {
    const VgChunkPos cp = vg_chunk_pos<G::CH>(it, c, A.cpr, A.cprd, L, sai, sei);
    const int cnt = cp.cnt;
    unsigned long long keys[G::CH];
    vg_chunk_keys<DA, DE>(it, it.pa + cp.oa * isa, it.pe + cp.oe * ise, sai, sei, isa, ise, unit,
                          cnt, keys);
#pragma unroll
    for (int q = 0; q < G::CH; ++q) {
      const unsigned long long key = keys[q];
      if (q >= cnt || (key >> 63)) continue; /* VG_KEY_NONE: not a finite pair */
      const int r = h_row(A, key);
      if (r < 0) continue;
      const unsigned bin = (unsigned)r * (unsigned)(A.dmask + 1) + (unsigned)((key >> A.dshift) & A.dmask);
      if (!A.smem) {
        atomicAdd(A.hist + bin, 1ull);
      } else if (run && bin == last) {
        ++run;
      } else {
        if (run) atomicAdd(&hsm[last], run);
        last = bin;
        run = 1;
      }
    }
  }
  if (A.smem) {
    if (run) atomicAdd(&hsm[last], run);
    __syncthreads();
    for (unsigned i = threadIdx.x; i < nbins; i += HT) {
      const unsigned c = hsm[i];
      if (c) atomicAdd(A.hist + i, (unsigned long long)c);
    }
  }
}

template <int DA, int DE>
static cudaError_t launch_hist(int grid, size_t smem, const HArgs &A, cudaStream_t s) {
  if (smem > 48u * 1024u) {
    cudaError_t e = cudaFuncSetAttribute(k_hist<DA, DE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return e;
  }
  k_hist<DA, DE><<<grid, HT, smem, s>>>(A);
  return cudaGetLastError();
}

static cudaError_t dispatch_hist(int grid, size_t smem, const HArgs &A, cudaStream_t s) {
  const int da = A.it.da, de = A.it.de;
#define VG_CASE(X, Y) \
  if (da == X && de == Y) return launch_hist<X, Y>(grid, smem, A, s);
  VG_TYPED_PAIRS(VG_CASE)
#undef VG_CASE
  return launch_hist<-1, -1>(grid, smem, A, s);
}

struct HPref { unsigned long long p; int row; };
static int cmp_hpref(const void *x, const void *y) {
  const HPref *a = (const HPref *)x, *b = (const HPref *)y;
  return a->p < b->p ? -1 : (a->p > b->p ? 1 : 0);
}

extern "C" int vgct_cuda_histogram(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                                   uintptr_t stream, const uint64_t *prefixes, int nprefix,
                                   int prefix_bits, int width, int64_t *counts, char *err,
                                   size_t errlen) {
  (void)p;
  if (err && errlen) err[0] = '\0';
  if (width < 1 || width > VGCT_HIST_MAX_WIDTH || prefix_bits < 0 || prefix_bits > 64 - width) {
    snprintf(err, errlen, "vgct_cuda_histogram: width %d / prefix_bits %d out of range", width,
             prefix_bits);
    return VGCT_EVALUE;
  }
  if (nprefix < 1 || nprefix > VGCT_HIST_MAX_PREFIXES || (prefix_bits == 0 && nprefix != 1)) {
    snprintf(err, errlen, "vgct_cuda_histogram: nprefix %d out of range", nprefix);
    return VGCT_EVALUE;
  }
  HPref sp[VGCT_HIST_MAX_PREFIXES];
  for (int g = 0; g < nprefix; ++g) {
    if (prefix_bits == 0 ? prefixes[g] != 0 : (prefixes[g] >> prefix_bits) != 0) {
      snprintf(err, errlen, "vgct_cuda_histogram: prefix %llu does not fit prefix_bits",
               (unsigned long long)prefixes[g]);
      return VGCT_EVALUE;
    }
    sp[g].p = prefixes[g];
    sp[g].row = g;
  }
  qsort(sp, (size_t)nprefix, sizeof sp[0], cmp_hpref);
  for (int g = 1; g < nprefix; ++g)
    if (sp[g].p == sp[g - 1].p) {
      snprintf(err, errlen, "vgct_cuda_histogram: prefix %llu given twice", sp[g].p);
      return VGCT_EVALUE;
    }
  const size_t rowlen = (size_t)1 << width;
  memset(counts, 0, (size_t)nprefix * rowlen * sizeof(int64_t));
  if (vgct_numel(a) == 0) return VGCT_OK;
  IterSpec it;
  int rc = vg_prepare(a, e, -1, &it, err, errlen);
  if (rc) return rc;
  CallCtx cx("vgct_cuda_histogram", a->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  DevWS *ws = cx.ws;
  HArgs *A = (HArgs *)calloc(1, sizeof(HArgs));
  if (!A) {
    snprintf(err, errlen, "vgct_cuda_histogram: out of host memory");
    return VGCT_ENOMEM;
  }
  A->it = it;
  const int CH = vg_chunk_elems(it.da, it.de);
  const int64_t L = it.sh[it.k - 1];
  A->cpr = (L + CH - 1) / CH;
  A->cprd = vg_make_div((uint64_t)A->cpr);
  A->nchunk = (it.m / L) * A->cpr;
  A->all = prefix_bits == 0;
  A->pshift = prefix_bits == 0 ? 0 : 64 - prefix_bits;
  A->dshift = 64 - prefix_bits - width;
  A->dmask = (unsigned long long)rowlen - 1;
  A->hist = (unsigned long long *)(ws->d_ws + H_WS_OFF);
  const int64_t gb = (A->nchunk + HT - 1) / HT;
  const int grid = (int)(gb < ws->sms ? gb : ws->sms);
  size_t per = H_WS_BYTES / (rowlen * 8); /* prefixes per data pass */
  if (per < 1) per = 1;
  for (int b0 = 0; b0 < nprefix && rc == VGCT_OK; b0 += (int)per) {
    const int nb = nprefix - b0 < (int)per ? nprefix - b0 : (int)per;
    A->np = nb;
    for (int i = 0; i < nb; ++i) A->pre[i] = sp[b0 + i].p;
    const size_t smem = (size_t)nb * rowlen * 4;
    const size_t smax = ws->smem_optin < H_SMEM_MAX ? ws->smem_optin : H_SMEM_MAX;
    A->smem = smem <= smax;
    if (!cx.check(cudaMemsetAsync(A->hist, 0, (size_t)nb * rowlen * 8, cx.stream),
                  "cudaMemsetAsync (histogram)") ||
        !cx.check(dispatch_hist(grid, A->smem ? smem : 0, *A, cx.stream), "k_hist launch")) {
      rc = cx.rc;
      break;
    }
    for (int i = 0; i < nb; ++i)
      if (!cx.check(cudaMemcpyAsync(counts + (size_t)sp[b0 + i].row * rowlen, A->hist + (size_t)i * rowlen,
                                    rowlen * 8, cudaMemcpyDeviceToHost, cx.stream),
                    "cudaMemcpyAsync (histogram)")) {
        rc = cx.rc;
        break;
      }
    if (rc == VGCT_OK && !cx.check(cx.sync(), "cudaStreamSynchronize (histogram)"))
      rc = cx.rc;
  }
  free(A);
  return rc;
}
