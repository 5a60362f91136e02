/*
 * launch_floor.cu -- the host's fixed cost of one CUDA launch on this machine, the floor under
 * every small vgct_ext.compare (issue #13's 2^20 row: <= 30 us from the Python call to the
 * result).  For kernels whose __grid_constant__ parameter is 16 .. 4000 bytes (the reduce and
 * selection kernels pass ~2 KiB: their IterSpec holds 32 axes), on a grid of 1 and of 256 blocks,
 * it prints the mean host time of the launch call alone and of the launch followed by
 * cudaStreamSynchronize (an empty kernel: what is left is the launch, the device's start and
 * end, and the wake-up), over 2000 launches after 200 warm-up ones.  Not a test.
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 bench/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor
 *
 * Measured on an H200 host (docs/performance.md, 2026-12-02 20:55 UTC): 4.4-5.5 us a launch call
 * and 9.8-11.1 us launch + synchronise, whatever the parameter size.
 */
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

template <int N> struct Param {
  char bytes[N];
  int *out;
};

/* one thread writes one byte: the kernel's own work is nothing */
template <int N> __global__ void k_empty(const __grid_constant__ Param<N> p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *p.out = p.bytes[N - 1];
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

static bool ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "launch_floor: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

template <int N> static bool run(cudaStream_t s, int *d, int grid) {
  Param<N> p{};
  p.out = d;
  for (int i = 0; i < 200; ++i) k_empty<N><<<grid, 256, 0, s>>>(p);
  if (!ok(cudaStreamSynchronize(s), "warm-up")) return false;
  const int reps = 2000;
  double t_launch = 0, t_round = 0;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_us();
    k_empty<N><<<grid, 256, 0, s>>>(p);
    const double t1 = now_us();
    if (!ok(cudaStreamSynchronize(s), "cudaStreamSynchronize")) return false;
    t_launch += t1 - t0;
    t_round += now_us() - t0;
  }
  printf("| %5d B | %4d | %6.2f us | %6.2f us |\n", N, grid, t_launch / reps, t_round / reps);
  return ok(cudaGetLastError(), "launch");
}

int main() {
  cudaStream_t s;
  int *d = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !ok(cudaMalloc(&d, sizeof(int)), "cudaMalloc"))
    return 1;
  printf("| parameter | blocks | launch call | launch + synchronise |\n|---:|---:|---:|---:|\n");
  bool good = true;
  for (int grid : {1, 256})
    good = good && run<16>(s, d, grid) && run<512>(s, d, grid) && run<1024>(s, d, grid) &&
           run<2048>(s, d, grid) && run<4000>(s, d, grid);
  cudaFree(d);
  cudaStreamDestroy(s);
  return good ? 0 : 1;
}
