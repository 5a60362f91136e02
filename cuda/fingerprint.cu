/*
 * fingerprint.cu -- vgct_cuda_fingerprint: the 64-bit content hash of
 * vgct_stats.h ("fingerprint"): sum over elements of
 * vgct_fp_element(raw bits zero-extended, flat index) modulo 2^64, then
 * vgct_fp_finish with the dtype and shape (on the host, as the CPU engine).
 *
 * k_fingerprint<IS>: one template per item size (the hash reads storage
 * bits, not values, so the dtype only matters through its width).  Each
 * thread sums its elements (any strides: one FastDiv row decomposition per
 * element), the block sums with shuffles, and one 64-bit integer atomicAdd
 * per block folds the blocks: integer addition modulo 2^64 is associative
 * and commutative, so the value is exact and independent of scheduling.
 * Trade-off: per-element index arithmetic; the hash is not on a hot path.
 */
#include <stdio.h>
#include <string.h>
#include "vgct_cuda_internal.cuh"

#define FT 256
#define WS_FP_SUM 128 /* bytes from d_ws: the u64 accumulator */

struct FArgs {
  IterSpec it;
  FastDiv Ld; /* inner length */
  unsigned long long *sum;
};

template <int IS>
__device__ __forceinline__ uint64_t fp_bits(const char *p) {
  if (IS == 1) return *(const uint8_t *)p;
  if (IS == 2) return *(const uint16_t *)p;
  if (IS == 4) return *(const uint32_t *)p;
  return *(const uint64_t *)p;
}

template <int IS>
__global__ void __launch_bounds__(FT) k_fingerprint(const __grid_constant__ FArgs A) {
  const IterSpec &it = A.it;
  const int K = it.k;
  const int64_t L = it.sh[K - 1], s_in = it.sa[K - 1], f_in = it.sf[K - 1];
  uint64_t sum = 0;
  for (int64_t p = (int64_t)blockIdx.x * FT + threadIdx.x; p < it.m;
       p += (int64_t)gridDim.x * FT) {
    const uint64_t row = vg_div((uint64_t)p, A.Ld);
    const int64_t col = p - (int64_t)row * L;
    int64_t oa, oe, of;
    vg_row_offsets(it, row, oa, oe, of);
    const char *q = it.pa + (oa + col * s_in) * IS;
    sum += vgct_fp_element(fp_bits<IS>(q), it.f0 + of + col * f_in);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
  __shared__ uint64_t sm[FT / 32];
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t t = 0;
    for (int i = 0; i < FT / 32; ++i) t += sm[i];
    atomicAdd(A.sum, (unsigned long long)t);
  }
}

extern "C" int vgct_cuda_fingerprint(const vgct_view *x, uintptr_t stream, uint64_t *out,
                                     char *err, size_t errlen) {
  const int64_t n = vgct_numel(x);
  if (n == 0) {
    *out = vgct_fp_finish(0, x->dtype, x->ndim, x->shape);
    return VGCT_OK;
  }
  IterSpec it;
  int rc = vg_prepare(x, x, -1, &it, err, errlen);
  if (rc) return rc;
  CallCtx cx("vgct_cuda_fingerprint", x->device_id, stream, err, errlen);
  if (!cx.ok()) return cx.rc;
  DevWS *ws = cx.ws;
  FArgs A;
  memset(&A, 0, sizeof A);
  A.it = it;
  A.Ld = vg_make_div((uint64_t)it.sh[it.k - 1]);
  A.sum = (unsigned long long *)(ws->d_ws + WS_FP_SUM);
  int64_t g = (it.m + FT - 1) / FT;
  if (g > (int64_t)ws->sms * 8) g = (int64_t)ws->sms * 8;
  if (!cx.check(cudaMemsetAsync(A.sum, 0, 8, cx.stream), "cudaMemsetAsync (fingerprint)"))
    return cx.rc;
  switch (it.isa) {
    case 1: k_fingerprint<1><<<(int)g, FT, 0, cx.stream>>>(A); break;
    case 2: k_fingerprint<2><<<(int)g, FT, 0, cx.stream>>>(A); break;
    case 4: k_fingerprint<4><<<(int)g, FT, 0, cx.stream>>>(A); break;
    default: k_fingerprint<8><<<(int)g, FT, 0, cx.stream>>>(A); break;
  }
  if (!cx.check_launch("k_fingerprint launch")) return cx.rc;
  if (!cx.check(cudaMemcpyAsync(ws->h_pin, A.sum, 8, cudaMemcpyDeviceToHost, cx.stream),
                "cudaMemcpyAsync (fingerprint to host)"))
    return cx.rc;
  if (!cx.check(cx.sync(), "cudaStreamSynchronize (fingerprint)"))
    return cx.rc;
  uint64_t s;
  memcpy(&s, ws->h_pin, 8);
  *out = vgct_fp_finish(s, x->dtype, x->ndim, x->shape);
  return VGCT_OK;
}
