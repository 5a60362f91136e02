/*
 * wait_floor.cu -- how soon the host learns that a small kernel is done, the other half of a
 * small vgct_ext.compare's floor (launch_floor.cu measures the launch).  One kernel, 256
 * threads a block, on a grid of 1 and of 256 blocks, spins for 0, 20k or 40k clock cycles; the
 * grid's last block (an atomic counter, as in reduce.cu's vg_reduce_finish) then writes a
 * sequence number into mapped pinned host memory after a system-scope fence.  The host times,
 * from just before the launch, each way of waiting:
 *
 *   sync              cudaStreamSynchronize: the driver's view that the whole grid retired
 *   spin on flag      read the word until it holds this launch's number (what
 *                     CallCtx::wait_signal does in the common case)
 *   spin + query      the same, then one cudaStreamQuery (wait_signal's error check)
 *   event sync        cudaEventRecord after the kernel + cudaEventSynchronize
 *   query alone       the cudaStreamQuery call by itself, after the word was seen
 *
 * and prints the median host microseconds of 2800 launches per way (after 200 warm-up ones).
 * Not a test.
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 bench/wait_floor.cu -o /tmp/wait_floor && /tmp/wait_floor
 *
 * Measured on an H200 host (docs/performance.md, 2026-12-02 23:05 UTC): the word is seen
 * ~1.9-2.1 us before cudaStreamSynchronize returns, whatever the kernel's length or grid.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

__device__ unsigned g_count; /* blocks done, reset by the last one */

/* Spin `cycles`, then the last block to finish writes `seq` to the host's word. */
__global__ void k_work(long long cycles, volatile unsigned *flag, unsigned seq) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&g_count, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    g_count = 0;
    __threadfence_system();
    *flag = seq;
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

static bool ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "wait_floor: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

static double median(std::vector<double> &v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  cudaStream_t s;
  unsigned *h = NULL, *d = NULL;
  cudaEvent_t ev;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaHostAlloc((void **)&h, 64, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc") ||
      !ok(cudaHostGetDevicePointer((void **)&d, h, 0), "cudaHostGetDevicePointer") ||
      !ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"))
    return 1;
  *h = 0;
  unsigned seq = 0;
  printf("| kernel | blocks | sync | spin on flag | spin + query | event sync | query alone |\n"
         "|---|---:|---:|---:|---:|---:|---:|\n");
  for (long long cycles : {0LL, 20000LL, 40000LL}) {
    for (int grid : {1, 256}) {
      std::vector<double> t[5];
      for (int rep = 0; rep < 3000; ++rep) {
        for (int way = 0; way < 4; ++way) {
          ++seq;
          const double t0 = now_us();
          k_work<<<grid, 256, 0, s>>>(cycles, d, seq);
          if (way == 0) {
            cudaStreamSynchronize(s);
          } else if (way == 3) {
            cudaEventRecord(ev, s);
            cudaEventSynchronize(ev);
          } else {
            while (__atomic_load_n((volatile unsigned *)h, __ATOMIC_ACQUIRE) != seq) {
            }
            if (way == 2) {
              const double q0 = now_us();
              cudaStreamQuery(s);
              if (rep >= 200) t[4].push_back(now_us() - q0);
            }
          }
          const double t1 = now_us();
          if (rep >= 200) t[way].push_back(t1 - t0);
          if (!ok(cudaStreamSynchronize(s), "k_work")) return 1;
        }
      }
      printf("| %lld cycles | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", cycles, grid,
             median(t[0]), median(t[1]), median(t[2]), median(t[3]), median(t[4]));
    }
  }
  cudaFreeHost(h);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return ok(cudaGetLastError(), "the run") ? 0 : 1;
}
