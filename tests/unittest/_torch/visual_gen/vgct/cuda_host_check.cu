/*
 * cuda_host_check.cu -- host-side checks of the CUDA engine's __host__
 * __device__ helpers (cuda/vgct_cuda_internal.cuh), compiled by nvcc for the
 * CPU: no GPU needed, so CI runs it (test_cuda_host_check.py).
 *
 *  1. the register accumulator (HotAcc + vg_pair + vg_hot_flush) against
 *     vgct_acc_update pair by pair: bit for bit with one final flush; with
 *     the kernels' periodic flushes, maxima/indices/counters bit for bit and
 *     sums within 1e-13 relative;
 *  2. FastDiv (vg_make_div / vg_div) against the '/' operator.
 * Prints "N passed, M failed" last; exit status 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <random>
#include "vgct_cuda_internal.cuh"

static std::mt19937_64 R(20261129);
static double U() { return (double)(R() >> 11) * 0x1p-53; }
static double val(int kind) {
  if (kind == 2) return ldexp(U() - 0.5, (int)(R() % 8));
  switch (R() % (kind ? 14 : 40)) {
    case 0: return 0.0;
    case 1: return -0.0;
    case 2: return NAN;
    case 3: return INFINITY;
    case 4: return -INFINITY;
    case 5: return ldexp(U(), -1070);
    case 6: return 1e300 * (U() - 0.5);
    default: return ldexp(U() - 0.5, (int)(R() % 20) - 10);
  }
}

static bool close_rel(double x, double y) {
  return x == y || fabs(x - y) <= 1e-13 * fabs(y) || (x != x && y != y);
}

static int check_fold(bool periodic) {
  int bad = 0;
  for (int t = 0; t < 6000; ++t) {
    const int kind = t % 3, n = 1 + (int)(R() % 700);
    const double rtol = (t % 5) ? 1e-3 : 0.0, atol = (t % 4) ? 1e-3 : 0.0;
    const int64_t sf = (t % 2) ? 1 : -3, f0 = (t % 2) ? 0 : 5000;
    vgct_acc ref, cold;
    vgct_acc_init(&ref, 0);
    vgct_acc_init(&cold, 0);
    HotAcc h;
    vg_hot_init(h);
    int since = 0;
    for (int i = 0; i < n; ++i) {
      double e = val(kind), a;
      switch (R() % 4) {
        case 0: a = e; break;
        case 1: a = e + ldexp(U(), -(int)(R() % 30)); break;
        case 2: a = e * (1 + 1e-3 * (U() - 0.5)); break;
        default: a = val(kind);
      }
      const int64_t idx = (R() % 9 == 0) ? (int64_t)(R() % 64) : f0 + i * sf; /* ties too */
      vgct_acc_update(&ref, a, e, idx, rtol, atol, 0);
      vg_pair<0>(h, &cold, a, e, idx, rtol, atol);
      if (periodic && ++since == VG_FLUSH) {
        since = 0;
        vg_hot_flush(h, &cold);
      }
    }
    vg_hot_flush(h, &cold);
    bool ok;
    if (!periodic) {
      ok = memcmp(&ref, &cold, sizeof ref) == 0;
    } else {
      vgct_acc x = cold, y = ref;
      ok = close_rel(x.s_aa, y.s_aa) && close_rel(x.s_ee, y.s_ee) && close_rel(x.s_ae, y.s_ae) &&
           close_rel(x.s_dd, y.s_dd) && (close_rel(x.s_d, y.s_d) || fabs(x.s_d - y.s_d) <= 1e-13 * x.s_dd);
      x.s_aa = y.s_aa; x.s_ee = y.s_ee; x.s_ae = y.s_ae; x.s_dd = y.s_dd; x.s_d = y.s_d;
      ok = ok && memcmp(&x, &y, sizeof x) == 0;
    }
    if (!ok) {
      if (bad < 5) printf("fold mismatch (periodic=%d) in trial %d\n", (int)periodic, t);
      ++bad;
    }
  }
  return bad;
}

static int check_fastdiv(void) {
  int bad = 0;
  const uint64_t ds[] = {1, 2, 3, 5, 7, 10, 12, 16, 63, 64, 65, 100, 1000, 4095, 4096, 4097, 65535,
                         131040, (1ull << 31) - 1, 1ull << 32, (1ull << 32) + 1, 3000000019ull,
                         (1ull << 62) + 3, ~0ull};
  for (uint64_t d : ds) {
    const FastDiv f = vg_make_div(d);
    for (int i = 0; i < 100000; ++i) {
      uint64_t n = R() >> (R() % 64);
      if (i < 64) n = ~0ull - (uint64_t)i;
      if (vg_div(n, f) != n / d) ++bad;
    }
  }
  for (int t = 0; t < 100000; ++t) {
    uint64_t d = R() >> (R() % 64);
    if (!d) d = 1;
    const FastDiv f = vg_make_div(d);
    for (int i = 0; i < 8; ++i) {
      const uint64_t n = R() >> (R() % 64);
      if (vg_div(n, f) != n / d) ++bad;
    }
  }
  if (bad) printf("fastdiv: %d wrong quotients\n", bad);
  return bad;
}

int main() {
  int passed = 0, failed = 0;
  const int r[3] = {check_fold(false), check_fold(true), check_fastdiv()};
  const char *names[3] = {"register accumulator == vgct_acc_update (bitwise)",
                          "periodic flushes: maxima/counters exact, sums 1e-13",
                          "FastDiv == '/'"};
  for (int i = 0; i < 3; ++i) {
    printf("%s: %s\n", names[i], r[i] ? "FAIL" : "ok");
    r[i] ? ++failed : ++passed;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
