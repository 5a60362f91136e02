/*
 * cuda_host_check.cu -- host-side checks of the CUDA engine's __host__
 * __device__ helpers (cuda/vgct_cuda_internal.cuh), compiled by nvcc for the
 * CPU: no GPU needed, so CI runs it (test_cuda_host_check.py).
 *
 *  1. the register accumulator (HotAcc + vg_pair + vg_hot_flush) against
 *     vgct_acc_update pair by pair: bit for bit with one final flush; with
 *     the kernels' periodic flushes, maxima/indices/counters bit for bit and
 *     sums within 1e-13 relative;
 *  2. FastDiv (vg_make_div / vg_div) against the '/' operator;
 *  3. the narrow-dtype chunk fast path (vg_fast_chunk with the kernels'
 *     fallbacks -- vgct_acc_maxima for VG_CHUNK_MAXIMA, vgct_acc_update for
 *     VG_CHUNK_DEFINE -- and gate refresh) against vgct_acc_update pair by
 *     pair: maxima/indices/counters bit for bit, sums within 1e-13, on
 *     float32-valued data built to hit every bound (ties, zeros, identical
 *     pairs, subnormals, values near FLT_MAX, NaN/Inf, indices out of order),
 *     with 1-4 lanes in two "warps" that each share their held maxima
 *     (vg_held_max) and, in two trials of three, exchange thresholds through
 *     shared "grid" words (vg_gate_max, as vg_gate_exchange does; a warp
 *     that did not fall back also takes them after steps 0, 1, 3, 7, ...,
 *     as vg_gate_refresh's poll does; a tie of max |d| planted at a high
 *     index in one warp's first step and at a low index in the other's last
 *     step must resolve to the low one through the polled threshold), and both
 *     branches taken; each trial also runs with the other gate (shared
 *     thresholds off / on) and must give the same record bit for bit, sums
 *     included (the sums do not depend on the path a chunk takes);
 *  4. the selection key of binary32 pairs (vg_key_narrow) against
 *     vgct_absdiff_key on every pair of special and random values;
 *  5. the exact integer pairs (vgct_int_pair) against 128-bit arithmetic;
 *  6. the fused key window's chunk test (vg_win_t32_of): no pair whose key
 *     is at or above lo passes it, and a bound 2^-20 too high is caught;
 *  7. the selection's distinct ascending ranks (vg_distinct_ascending);
 *  8. the fused window's per-pair classification (vg_fast_chunk with a
 *     VgWinCnt) against vg_key_narrow and the key comparisons k_sel_window
 *     makes: counts >= lo, == lo, == hi and the inside bits, on chunks of
 *     every kind of pair with windows at a chunk's own keys, at 0, at
 *     INF_KEY and WIN_SENT; a chunk with a non-finite pair or a float32
 *     overflow must say VG_WIN_DEFINE and count nothing;
 *  9. the fused window's sparse way (WIN 1): vg_fast_chunk's candidates
 *     (VgLook) hold every pair whose key is at or above lo but 0 (a chunk the
 *     definition folds: every pair), the keys of 0 are counted, and
 *     vg_win_sparse counts and stores what the keys of the whole chunk give -- for
 *     float16, bfloat16, float32 and the mixed pairs; a bound 2^-20 too high
 *     must miss keys (teeth);
 * 10. k_reduce_lean's typed loop: pairs folded by vg_pair_fin with their
 *     finiteness tested in float32 (vg_finite32), and the last flush a
 *     store into a record nothing was folded into (vg_lean_store_fresh),
 *     against vg_pair and vg_hot_flush, bit for bit; a planted store over a
 *     used record must change the result (teeth); vg_finite32 against
 *     vg_finite on every float16 and bfloat16 pattern, every float32 one of
 *     the exponent's two ends (zeros, subnormals, FLT_MAX's binade, inf,
 *     NaN; both signs) and 2M at random.
 * 14. the fast kernels' flush (vg_hot_flush_sums: sums, counters and max |e|
 *     added, no merge) against vg_hot_flush, bit for bit, on the states the
 *     kernels reach: a HotAcc folded by vg_fast_chunk only, a thread record
 *     written only by the fallbacks (vgct_acc_maxima, vgct_acc_update) and
 *     earlier flushes; two planted faults (max |e| or n_finite not merged)
 *     must change the record (teeth).
 * 15. the 16-bit word paths of vg_fast_chunk (P16: two float16 or two
 *     bfloat16 operands): vg_min16_key against the float32 loop's min |e| key
 *     on every bfloat16 pattern, in both halves of a word beside a zero of
 *     either sign, and on random words; vg_fast_chunk<8, P16> against
 *     vg_fast_chunk<8> on the same chunks (float16 and bfloat16, every kind
 *     of element: zeros of both signs, subnormals, ties, one-ulp differences,
 *     NaN and Inf), plain, with the sparse way's look (VgLook: candidates and
 *     zeros) and with the fused window's classification (VgWinCnt): the same
 *     outcome, HotAcc, look and window counts bit for bit; two formulas with a
 *     planted fault (the key's sign mask left out, the unequal pairs counted
 *     by their bits: +0 != -0) must differ, each often enough on its own
 *     (teeth).  (vg_ne16_mask's device form, an HSET2, is checked on the GPU:
 *     test_gpu.py.)
 * 16. the ring's copies over rows (vg_ring_segments, which cuda/reduce.cu's
 *     vg_ring_load runs for a step of the ring kernel over rows): for every
 *     row length of 32 .. 1024 chunks (multiples of 32), every start chunk of
 *     the first three rows and beyond and every step of 0 .. 96 chunks, the
 *     copies take the step's chunks in order, each exactly once, each from its
 *     own row and column, none past a row's end; a step that starts at a
 *     multiple of 32 chunks, as the kernel's do, takes at most two copies over
 *     rows of a multiple of 64 chunks (96-chunk steps, 16-bit pairs) and one
 *     when it is at most 32 chunks (RB 1 pairs); a planted split that does
 *     not reset the column at a row end must fail (teeth).
 * 17. the ring's flat index over rows (VgRowCur, which cuda/reduce.cu's
 *     k_reduce_bulk steps for each lane instead of dividing a chunk): for
 *     rows of 32 .. 1024 chunks (multiples of 32) and a few others, steps of
 *     the kernel's 256 and 768 chunks and others, every start below three
 *     rows and 97 chunks (at most 4000) plus 64 random far ones, flat strides
 *     of either sign, 24 steps each: the flat index of chunk c + du (du 0,
 *     32, 64 and random, up to a row) equals f0 + (c / cpr) sf0 + (c % cpr)
 *     w; a planted cursor that forgets the row end inside a step, and one
 *     that forgets it past a chunk, must fail (teeth).
 * Prints "N passed, M failed" last; exit status 1 on any failure.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <random>
#include <vector>
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

/* float32-valued data for the fast path: bf16-rounded or full float32 */
static float fval(int kind) {
  float x;
  switch (R() % 24) {
    case 0: x = 0.0f; break;
    case 1: x = -0.0f; break;
    case 2: x = ldexpf((float)U(), -140); break;       /* subnormal */
    case 3: x = 3.0e38f * (float)(U() - 0.5); break;   /* near FLT_MAX */
    case 4: x = (float)(R() % 5) - 2.0f; break;        /* repeated values: ties */
    default: x = (float)ldexp(U() - 0.5, (int)(R() % 12) - 6);
  }
  if (kind == 1) { /* bfloat16: keep the top 16 bits */
    uint32_t b;
    memcpy(&b, &x, 4);
    b &= 0xffff0000u;
    memcpy(&x, &b, 4);
  }
  return x;
}

/* W lanes of a "warp" fold interleaved chunks, each with its HotAcc (sums,
 * counters) and its vgct_acc (the definition's fallback; the kernels keep it
 * in shared memory); after each step in which a lane fell back, every lane
 * takes the best maxima the lanes' vgct_acc hold (as vg_held_warp does on the
 * device). */
template <int CH>
static int check_fast_chunk(long *n_fast, long *n_slow) {
  int bad = 0;
  for (int t = 0; t < 3000; ++t) {
    const int kind = t % 2, nstep = 1 + (int)(R() % 60), W = 1 + (int)(R() % 4);
    const double rtol = (t % 5) ? 1e-3 : ((t % 3) ? 0.0 : 0.25);
    const int mode = t % 6; /* 0: identical, 1: close, 2: mixed, 3: with non-finite, 4: close, 5: see quiet */
    /* mode 5: every other trial without mismatches (the max_abs bound alone decides) */
    const double atol = (mode == 5 && (t / 6) % 2) ? 10.0 : (t % 4) ? 1e-3 : ((t % 7) ? 0.0 : 10.0);
    vgct_acc ref;
    vgct_acc_init(&ref, 0);
    const bool share = (t % 3) != 1;
    const int split = W > 1 ? W / 2 : 1;
    const int64_t sf = (t % 3 == 0) ? -1 : 1;
    /* the trial's data first (chunk k = c*W + l: pairs A/E[k*CH + q] at flat
       indices F[k] + q*sf), then the fast path over it, twice */
    std::vector<float> A((size_t)nstep * W * CH), E(A.size());
    std::vector<int64_t> F((size_t)nstep * W);
    for (int c = 0; c < nstep; ++c) {
      for (int l = 0; l < W; ++l) {
        const int wp = l < split ? 0 : 1;
        /* distinct flat indices (as in a tensor); every 7th chunk from a low
           region, so lower indices also come later (the tie rules) */
        const int64_t k = (int64_t)c * W + l;
        /* a tie planted for the poll (mode 5, two warps, no mismatch): max |d|
           = 1 in warp 1's first chunk at a high index (with a pair of |d|/|e|
           ~500 beside it, so the relative-error bound passes any chunk of
           |e| >= 1) and in warp 0's last chunk at a low index, reached after
           warp 0 polled the grid's threshold (vg_gate_refresh polls after
           steps 0, 1, 3, 7, ...): the lower index must win, through the exact
           check at the threshold's own value */
        const bool tie = mode == 5 && W > 1 && atol == 10.0 && nstep >= 6 && CH >= 2;
        const int tie_at = tie && l == split && c == 0 ? 1 : tie && l == 0 && c == nstep - 1 ? 2 : 0;
        const int64_t f = (tie_at == 2 || (tie_at == 0 && R() % 7 == 0) ? 0 : 1000000) + k * 2 * CH +
                          (sf < 0 ? 2 * CH - 1 : CH);
        F[k] = f;
        float *a = &A[k * CH], *e = &E[k * CH];
        for (int q = 0; q < CH; ++q) {
          /* mode 5: |e| in [1, 2] and |d| independent of it (so a record of
             max_abs is rarely one of max_rel: each bound decides alone), and
             with two warps, warp 0 sees identical pairs for the first half of
             the steps, then pairs like warp 1's: its records then compete
             with thresholds that warp 1 derived (ties and near-ties of the
             two warps' maxima, common in bfloat16) */
          if (mode == 5) {
            e[q] = (float)((R() % 2 ? 1.0 : -1.0) * (1.0 + U()));
            if (kind == 1) e[q] = vgct_f32_from_bits(vgct_bits_from_f32(e[q]) & 0xffff0000u);
          } else {
            e[q] = fval(kind);
          }
          const float noise = (float)ldexp(U() - 0.5, -(int)(R() % 24));
          const bool quiet = mode == 5 && W > 1 && wp == 0 && 2 * c < nstep;
          switch (quiet ? 0 : mode) {
            case 0: a[q] = e[q]; break;
            case 2: a[q] = (R() % 3) ? e[q] : fval(kind); break;
            case 3: a[q] = (R() % 50) ? e[q] * (1.0f + noise) : (R() % 2 ? NAN : INFINITY); break;
            case 5: a[q] = (R() % 4) ? e[q] + noise : e[q]; break; /* |d| independent of |e| */
            default: a[q] = (R() % 4) ? e[q] + noise * fabsf(e[q]) + (float)(noise * 1e-3) : e[q];
          }
          if (kind == 1) {
            uint32_t b;
            memcpy(&b, &a[q], 4);
            b &= 0xffff0000u;
            memcpy(&a[q], &b, 4);
          }
          if (tie_at != 0) { /* (values exact in bfloat16) */
            e[q] = q == 1 && tie_at == 1 ? 0x1p-10f : 1.5f;
            a[q] = q == 0 ? 2.5f : q == 1 && tie_at == 1 ? 0.5f : 1.5f;
          }
          vgct_acc_update(&ref, (double)a[q], (double)e[q], f + q * sf, rtol, atol, 0);
        }
      }
    }
    /* W lanes in two "warps" (lanes l < W/2 and the rest, when W > 1), each
       warp with its own held maxima and thresholds, and (share) the grid's
       shared thresholds between them (vg_gate_exchange: the max of every
       derived gate, taken when a warp refreshes) */
    auto run = [&](bool shared, long *nf, long *ns) {
      vgct_acc acc[4];
      HotAcc h[4];
      HotGate g[2];
      GateHeld held[2];
      vg_gate_init(g[0], held[0], rtol);
      vg_gate_init(g[1], held[1], rtol);
      uint32_t glob[3] = {0, 0, 0};
      for (int l = 0; l < W; ++l) {
        vg_hot_init(h[l]);
        vgct_acc_init(&acc[l], 0);
      }
      int since = 0;
      for (int c = 0; c < nstep; ++c) {
        bool slow[2] = {false, false};
        for (int l = 0; l < W; ++l) {
          const int wp = l < split ? 0 : 1;
          const int64_t k = (int64_t)c * W + l, f = F[k];
          float a[CH], e[CH];
          memcpy(a, &A[k * CH], sizeof a);
          memcpy(e, &E[k * CH], sizeof e);
          const int r = vg_fast_chunk<CH>(h[l], g[wp], held[wp], a, e, f, sf, rtol, atol);
          if (r == VG_CHUNK_DONE) {
            ++*nf;
          } else if (r == VG_CHUNK_MAXIMA) { /* vg_slow_maxima */
            ++*ns;
            slow[wp] = true;
            for (int q = 0; q < CH; ++q)
              vgct_acc_maxima(&acc[l], (double)a[q], (double)e[q], f + q * sf, rtol, atol);
          } else { /* vg_slow_chunk */
            ++*ns;
            slow[wp] = true;
            for (int q = 0; q < CH; ++q)
              vgct_acc_update(&acc[l], (double)a[q], (double)e[q], f + q * sf, rtol, atol, 0);
          }
        }
        for (int wp = 0; wp < 2; ++wp) {
          if (!slow[wp]) {
            /* vg_gate_refresh's poll (after steps 0, 1, 3, 7, ...): the
               grid's thresholds taken by a warp that did not fall back, its
               held maxima unchanged */
            if (shared && (c & (c + 1)) == 0) vg_gate_max(g[wp], glob[0], glob[1], glob[2]);
            continue;
          }
          /* vg_gate_refresh: the warp's best held maxima, its thresholds */
          const int l0 = wp == 0 ? 0 : split, l1 = wp == 0 ? split : W;
          vg_held_from_acc(held[wp], &acc[l0]);
          for (int l = l0 + 1; l < l1; ++l) {
            GateHeld o;
            vg_held_from_acc(o, &acc[l]);
            vg_held_max(held[wp], o);
          }
          vg_gate_derive(g[wp], held[wp]);
          if (shared) { /* vg_gate_exchange (publish): atomicMax, then the max */
            const uint32_t m0 = glob[0], m1 = glob[1], m2 = glob[2];
            if (g[wp].mxb > glob[0]) glob[0] = g[wp].mxb;
            if (vgct_bits_from_f32(g[wp].crel) > glob[1]) glob[1] = vgct_bits_from_f32(g[wp].crel);
            if (vgct_bits_from_f32(g[wp].wx32) > glob[2]) glob[2] = vgct_bits_from_f32(g[wp].wx32);
            vg_gate_max(g[wp], m0, m1, m2);
          }
        }
        if ((since += CH) >= VG_FLUSH) {
          since = 0;
          for (int l = 0; l < W; ++l) vg_hot_flush(h[l], &acc[l]);
        }
      }
      vgct_acc cold;
      vgct_acc_init(&cold, 0);
      for (int l = 0; l < W; ++l) {
        vg_hot_flush(h[l], &acc[l]);
        vgct_acc_merge(&cold, &acc[l]);
      }
      return cold;
    };
    const vgct_acc cold = run(share, n_fast, n_slow);
    /* the other gate (with / without the shared thresholds) takes other paths
       but must give the same record, sums included, bit for bit */
    long nf2 = 0, ns2 = 0;
    const vgct_acc other = run(!share, &nf2, &ns2);
    if (memcmp(&cold, &other, sizeof cold) != 0) {
      if (bad < 5) printf("trial %d: the record depends on the shared thresholds\n", t);
      ++bad;
    }
    vgct_acc x = cold, y = ref;
    const double cross = sqrt(y.s_aa * y.s_ee);
    bool ok = close_rel(x.s_aa, y.s_aa) && close_rel(x.s_ee, y.s_ee) &&
              (close_rel(x.s_ae, y.s_ae) || fabs(x.s_ae - y.s_ae) <= 1e-13 * cross) &&
              close_rel(x.s_dd, y.s_dd) &&
              (close_rel(x.s_d, y.s_d) || fabs(x.s_d - y.s_d) <= 1e-13 * sqrt(y.s_dd * (double)y.n_finite));
    if (!ok && bad < 5)
      printf("sums: aa %.17g/%.17g ee %.17g/%.17g ae %.17g/%.17g dd %.17g/%.17g d %.17g/%.17g\n",
             x.s_aa, y.s_aa, x.s_ee, y.s_ee, x.s_ae, y.s_ae, x.s_dd, y.s_dd, x.s_d, y.s_d);
    x.s_aa = y.s_aa; x.s_ee = y.s_ee; x.s_ae = y.s_ae; x.s_dd = y.s_dd; x.s_d = y.s_d;
    ok = ok && memcmp(&x, &y, sizeof x) == 0;
    if (!ok && bad < 5)
      for (size_t w = 0; w < sizeof x / 8; ++w)
        if (memcmp((const char *)&x + 8 * w, (const char *)&y + 8 * w, 8))
          printf("word %zu differs: %lld vs %lld\n", w, (long long)((const int64_t *)&x)[w], (long long)((const int64_t *)&y)[w]);
    if (!ok) {
      if (bad < 5)
        printf("fast chunk (CH=%d) mismatch in trial %d: max_abs %.17g@%lld vs %.17g@%lld, max_rel "
               "%.17g@%lld vs %.17g@%lld, worst %.17g@%lld vs %.17g@%lld, mism %lld vs %lld, neq "
               "%lld vs %lld\n", CH, t, x.max_abs, (long long)x.max_abs_i, y.max_abs,
               (long long)y.max_abs_i, x.max_rel, (long long)x.max_rel_i, y.max_rel,
               (long long)y.max_rel_i, x.worst_excess, (long long)x.worst_i, y.worst_excess,
               (long long)y.worst_i, (long long)x.n_mismatch, (long long)y.n_mismatch,
               (long long)x.n_unequal, (long long)y.n_unequal);
      ++bad;
    }
  }
  return bad;
}

static int check_fast(void) {
  long nf = 0, ns = 0;
  int bad = check_fast_chunk<8>(&nf, &ns) + check_fast_chunk<4>(&nf, &ns);
  printf("fast path: %ld chunks committed, %ld folded by the definition\n", nf, ns);
  if (nf < 10 * ns / 10 || ns == 0) { /* both branches well exercised */
    printf("fast path: branch coverage too low\n");
    ++bad;
  }
  return bad;
}

/* The chunk fast path's counters at the mismatch boundary: chunks whose pairs
 * sit within a few float32 ulps of the tolerance atol + rtol |e| (below, at,
 * above), some wholly below it (where vg_fast_chunk skips the exact mismatch
 * test on its bound ub < 0), for bfloat16- and float32-valued data, with zero,
 * subnormal and huge tolerances.  n_mismatch and n_unequal must equal the
 * definition's (vgct_acc_update) for every chunk the fast path folds. */
template <int CH>
static int check_fast_counts(long *n_chunks) {
  const double rtols[] = {1e-3, 0.0, 0.25, 1.6e-2, 0x1p-140, 1e-45, 3e38, 1e300};
  const double atols[] = {1e-3, 0.0, 1e-5, 0x1p-149, 1e-30, 10.0, 1e300};
  int bad = 0;
  for (int t = 0; t < 200000; ++t) {
    const int kind = t % 2;
    const double rtol = rtols[R() % 8], atol = atols[R() % 7];
    const bool below = (t % 3) == 0; /* every pair at or below the tolerance */
    float a[CH], e[CH];
    vgct_acc ref;
    vgct_acc_init(&ref, 0);
    for (int q = 0; q < CH; ++q) {
      double ev;
      switch (R() % 8) {
        case 0: ev = 0.0; break;
        case 1: ev = ldexp(U(), -140); break;
        case 2: ev = 3.0e38 * (U() - 0.5); break;
        default: ev = ldexp(U() - 0.5, (int)(R() % 40) - 20);
      }
      float ef = (float)ev;
      if (kind == 1) ef = vgct_f32_from_bits(vgct_bits_from_f32(ef) & 0xffff0000u);
      const double tol = atol + rtol * fabs((double)ef);
      const double s = (R() & 1) ? 1.0 : -1.0;
      float af = (float)((double)ef + s * (below ? tol * (1.0 - ldexp(U(), -(int)(R() % 30))) : tol));
      const int k = below ? -(int)(R() % 3) : (int)(R() % 7) - 3; /* ulps away from the boundary */
      for (int i = 0; i < (k < 0 ? -k : k); ++i)
        af = nextafterf(af, ((k > 0) == (s > 0)) ? INFINITY : -INFINITY);
      if (kind == 1) af = vgct_f32_from_bits(vgct_bits_from_f32(af) & 0xffff0000u);
      a[q] = af;
      e[q] = ef;
      vgct_acc_update(&ref, (double)af, (double)ef, q, rtol, atol, 0);
    }
    HotAcc h;
    vg_hot_init(h);
    HotGate g;
    GateHeld held;
    vg_gate_init(g, held, rtol);
    const int r = vg_fast_chunk<CH>(h, g, held, a, e, 0, 1, rtol, atol);
    if (r == VG_CHUNK_DEFINE) continue; /* non-finite or overflow: the definition folds it */
    ++*n_chunks;
    if (h.nmm != ref.n_mismatch || h.neq != ref.n_unequal || h.n != ref.n_finite) {
      if (bad++ < 5) {
        printf("  fast counts (CH=%d) rtol %a atol %a: mismatches %lld (want %lld), unequal %lld "
               "(want %lld)\n", CH, rtol, atol, (long long)h.nmm, (long long)ref.n_mismatch,
               (long long)h.neq, (long long)ref.n_unequal);
        for (int q = 0; q < CH; ++q) printf("    a %a e %a\n", a[q], e[q]);
      }
    }
  }
  return bad;
}

/* vg_key_narrow == vgct_absdiff_key on every pair of binary32 special and
 * random values (zeros, subnormals, FLT_MAX, infinities, NaNs). */
static int check_key_narrow(void) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, 0x1.fffffcp-127f,
                          3.4028235e38f, -3.4028235e38f, INFINITY, -INFINITY, NAN, -NAN, 1e-3f,
                          0x1.000002p0f, 65504.0f, 0x1p-24f};
  for (int i = 0; i < 200; ++i) v.push_back((float)ldexp(U() - 0.5, (int)(R() % 300) - 150));
  int bad = 0;
  for (float a : v)
    for (float e : v) {
      uint64_t k = 0;
      const unsigned long long want = vgct_absdiff_key((double)a, (double)e, &k) ? k : VG_KEY_NONE;
      if (vg_key_narrow(a, e) != want && bad++ < 5)
        printf("vg_key_narrow(%a, %a) = %llx, vgct_absdiff_key %llx\n", a, e, vg_key_narrow(a, e), want);
    }
  return bad;
}

/* vgct_int_pair (vgct_stats.h, the integer pairs of the generic GPU kernels) as nvcc compiles
 * it, against 128-bit integer arithmetic: |a - e| rounded once (the compiler's unsigned
 * __int128 -> double conversion rounds to nearest), equality, and the mismatch decision with
 * dyadic tolerances rtol = k/2^20, atol = m/4 (then D > atol + rtol*E is an integer inequality
 * scaled by 2^20), on values at the int64/uint64 edges and near ties. */
static int check_int_pairs(void) {
  typedef __int128 i128;
  int bad = 0;
  const uint64_t edges[] = {0, 1, 2, (1ull << 53), (1ull << 53) + 1, (1ull << 62) + 1,
                            0x7fffffffffffffffull, 0x8000000000000000ull, 0xffffffffffffffffull,
                            0xfffffffffffffffeull};
  for (int t = 0; t < 400000; ++t) {
    const int ua = (int)(R() & 1), ue = (int)(R() & 1);
    uint64_t ra = (R() & 3) ? edges[R() % 10] : R(), re = (R() & 3) ? edges[R() % 10] : R();
    if (R() & 1) re = ra + (R() % 7) - 3; /* near pairs */
    const i128 A = ua ? (i128)ra : (i128)(int64_t)ra, E = ue ? (i128)re : (i128)(int64_t)re;
    const i128 D = A > E ? A - E : E - A, Ea = E < 0 ? -E : E;
    const double rtol = (double)(R() % (1u << 21)) * 0x1p-20, atol = (double)(R() % 64) * 0.25;
    /* a tolerance right at D for some trials: atol chosen from D */
    const double atol2 = (R() & 1) ? atol : (double)((D >> 2) % 1024) * 0.25;
    vgct_int_cmp c;
    vgct_int_pair(ra, ua, re, ue, rtol, atol2, &c);
    const unsigned __int128 Du = (unsigned __int128)D;
    const bool mism = (i128)Du * ((i128)1 << 20) >
                      (i128)(atol2 * 0x1p20) + (i128)(rtol * 0x1p20) * Ea; /* rtol*2^20, atol*2^20: integers */
    if (c.ad != (double)Du || c.unequal != (D != 0) || c.mismatch != mism ||
        c.a != (ua ? (double)ra : (double)(int64_t)ra) || (c.d < 0) != (A < E && D != 0)) {
      if (++bad <= 5)
        printf("  int pair %llx/%d vs %llx/%d rtol %a atol %a: ad %a unequal %d mismatch %d (want %d)\n",
               (unsigned long long)ra, ua, (unsigned long long)re, ue, rtol, atol2, c.ad, c.unequal,
               c.mismatch, (int)mism);
    }
  }
  return bad != 0;
}

/* The fused window's chunk test (vg_win_t32_of): for binary32 pairs of every kind (float32 and
 * bfloat16 values, subnormals, ties, near FLT_MAX; b a few ulps from a, or anywhere), with lo =
 * the pair's own key and the doubles just below it (where a wrong bound would fail first),
 * |fl32(a - e)| < t32 must never hold -- nor for any lo below the key.  Teeth: the same pairs
 * against a bound 2^-20 too high (lo (1 + 2^-20) rounded down) must show violations, or this
 * check proves nothing.  Also the ends: lo = 0 -> 0, lo = INF_KEY / WIN_SENT -> +Inf. */
static int check_win_t32(long *n_pairs) {
  int bad = 0;
  long teeth = 0;
  for (long t = 0; t < 3000000; ++t) {
    const int kind = (int)(R() % 2);
    const float a = fval(kind);
    float e;
    if (R() & 1) { /* a few ulps away: differences of every size down to subnormal */
      uint32_t b = vgct_bits_from_f32(a) + (uint32_t)(R() % 9) - 4u;
      if (kind == 1) b = (vgct_bits_from_f32(a) & 0xffff0000u) + ((uint32_t)(R() % 9) - 4u) * 0x10000u;
      e = vgct_f32_from_bits(b);
    } else {
      e = fval(kind);
    }
    const unsigned long long key = vg_key_narrow(a, e);
    const float d32 = fabsf(a - e);
    if (key == VG_KEY_NONE || !(d32 <= 3.4028235e38f)) continue; /* the definition's chunks */
    ++*n_pairs;
    for (int k = 0; k < 4; ++k) {
      const unsigned long long lo = key >= (unsigned long long)k ? key - (unsigned long long)k : 0ull;
      if (d32 < vg_win_t32_of(lo) && bad++ < 5)
        printf("  t32: pair %a, %a: |d32| %a < t32(%a) though its key %a >= lo\n", a, e, d32,
               vgct_f64_from_bits(lo), vgct_f64_from_bits(key));
      const float wrong = vg_f32_down(vgct_f64_from_bits(lo) * (1.0 + 0x1p-20));
      teeth += d32 < wrong;
    }
  }
  if (vg_win_t32_of(0) != 0.0f || vg_win_t32_of(INF_KEY) != INFINITY || vg_win_t32_of(WIN_SENT) != INFINITY) {
    printf("  t32 at the ends: %a %a %a\n", vg_win_t32_of(0), vg_win_t32_of(INF_KEY), vg_win_t32_of(WIN_SENT));
    ++bad;
  }
  if (teeth == 0) {
    printf("  t32: a bound 2^-20 too high passed every pair: the check has no teeth\n");
    ++bad;
  }
  printf("fused window chunk test: %ld pairs, %ld caught with a bound 2^-20 too high\n", *n_pairs, teeth);
  return bad != 0;
}

/* A window [lo, hi] for a chunk of 8 keys (VG_KEY_NONE: a non-finite pair), as the window plan
 * makes them: bounds at the chunk's own keys (ties at lo and hi; hi == lo), the keys next to them,
 * lo = 0, hi = INF_KEY, no window (both WIN_SENT); tiny: sometimes a positive lo below every
 * float32 (vg_win_t32_of gives 0: the keys of 0 below lo, every other key above). */
static void random_window(const unsigned long long (&keys)[8], bool tiny, unsigned long long &lo,
                          unsigned long long &hi) {
  const int wk = (int)(R() % 6);
  if (wk == 0) { lo = 0; hi = keys[R() % 8]; }
  else if (wk == 1) { lo = keys[R() % 8]; hi = INF_KEY; }
  else if (wk == 2) { lo = hi = WIN_SENT; }
  else { lo = keys[R() % 8]; hi = (R() & 1) ? lo : keys[R() % 8]; }
  if (lo == VG_KEY_NONE) lo = 0;
  if (hi == VG_KEY_NONE) hi = INF_KEY;
  if (R() % 4 == 0 && lo > 0 && lo < INF_KEY) lo += (R() & 1) ? 1 : -1; /* next to a key */
  if (tiny && R() % 16 == 0 && hi != WIN_SENT) lo = 1 + R() % 4; /* (WIN_SENT: only with lo) */
  if (hi < lo) std::swap(lo, hi);
}

/* The fused window's classification in vg_fast_chunk (VgWinCnt, cuda/reduce.cu k_reduce_bulk<...,
 * WIN = 2>; the host branch of vg_win_mark) against the keys themselves: for chunks of 8 binary32 pairs of every kind (float32 and
 * bfloat16 values, ties, zeros, subnormals, near FLT_MAX, a few NaN/Inf), windows [lo, hi] whose
 * bounds are keys of the chunk (ties at lo and hi), the doubles next to them, 0, INF_KEY and
 * WIN_SENT (no window), hi == lo among them: ge, el, eh and the inside bits equal what
 * vg_key_narrow's keys give (eh: the kernel drops it when hi == lo, vg_win_end; so does this
 * reference), and a chunk the definition folds says VG_WIN_DEFINE and counts nothing. */
static int check_win_classify(long *n_chunks) {
  int bad = 0;
  HotGate g;
  GateHeld held;
  vg_gate_init(g, held, 1e-3);
  for (long t = 0; t < 400000; ++t) {
    const int kind = (int)(R() % 2);
    float a[8], e[8];
    unsigned long long keys[8];
    bool fin = true, ovf = false;
    for (int q = 0; q < 8; ++q) {
      a[q] = fval(kind);
      e[q] = (R() & 1) ? a[q] : fval(kind);
      if (R() % 3 == 0) e[q] = vgct_f32_from_bits(vgct_bits_from_f32(a[q]) + (uint32_t)(R() % 5) * (kind ? 0x10000u : 1u));
      if (R() % 400 == 0) a[q] = (R() & 1) ? NAN : INFINITY;
      if (R() % 400 == 0) { a[q] = 3e38f; e[q] = -3e38f; }
      keys[q] = vg_key_narrow(a[q], e[q]);
      fin = fin && keys[q] != VG_KEY_NONE;
      ovf = ovf || !(fabsf(a[q] - e[q]) <= 3.4028235e38f);
    }
    unsigned long long lo, hi;
    random_window(keys, false, lo, hi);
    VgWinCnt wc;
    wc.lo = vgct_f64_from_bits(lo);
    wc.hi = vgct_f64_from_bits(hi);
    wc.ge = wc.el = wc.eh = 7;
    wc.in = 12345;
    HotAcc h;
    vg_hot_init(h);
    vg_fast_chunk<8>(h, g, held, a, e, 0, 1, 1e-3, 1e-3, nullptr, &wc);
    ++*n_chunks;
    unsigned ge = 7, el = 7, eh = 7, in = 0;
    if (!fin || ovf) {
      in = VG_WIN_DEFINE;
    } else {
      for (int q = 0; q < 8; ++q) {
        const unsigned long long k = keys[q];
        ge += k >= lo;
        el += k == lo;
        eh += k == hi && lo != WIN_SENT;
        in |= (k > lo && k < hi ? 1u : 0u) << q;
      }
    }
    unsigned weh = wc.eh;
    if (hi == lo) { weh = 7; eh = 7; } /* dropped by the kernel's end */
    if (wc.ge != ge || wc.el != el || weh != eh || wc.in != in) {
      if (++bad <= 5)
        printf("  classify: lo %llx hi %llx: ge %u/%u el %u/%u eh %u/%u in %x/%x\n", lo, hi, wc.ge,
               ge, wc.el, el, weh, eh, wc.in, in);
    }
  }
  printf("fused window classification: %ld chunks\n", *n_chunks);
  return bad != 0;
}

/* Element bits of dtype D for the sparse-way check: float32 / bfloat16 from fval (bfloat16: its
 * top 16 bits), float16 as raw bits (finite of every exponent, subnormals, zeros, a few NaN/Inf);
 * near = another element's bits when >= 0 (a few units away, or equal: ties, differences of one
 * ulp, zero differences). */
template <int D>
static uint32_t elem_bits(long near) {
  if (near >= 0 && R() % 3 != 0) {
    const uint32_t d = (uint32_t)(R() % 5) - 2u;
    if (R() % 4 == 0) return (uint32_t)near;
    return D == VGCT_FLOAT32 ? (uint32_t)near + d : (uint32_t)((near + d) & 0xffffu);
  }
  if (D == VGCT_FLOAT16) {
    if (R() % 60 == 0) return (R() & 1) ? 0x7c00u : 0x7e01u; /* +Inf, NaN */
    return (uint32_t)(R() % 0x7c00u) | ((R() & 1) ? 0x8000u : 0u);
  }
  float x = fval(D == VGCT_BFLOAT16 ? 1 : 0);
  if (R() % 200 == 0) x = (R() & 1) ? NAN : INFINITY;
  const uint32_t b = vgct_bits_from_f32(x);
  return D == VGCT_FLOAT32 ? b : b >> 16;
}

/* Bits of element q of a chunk's vectors, stored as the device stores them (little-endian). */
template <int D, int NV>
static void put_elem(uint4 (&v)[NV], int q, uint32_t bits) {
  constexpr int IS = D == VGCT_FLOAT32 ? 4 : 2;
  memcpy(reinterpret_cast<char *>(v) + q * IS, &bits, IS); /* (the host is little-endian too) */
}

/* Where vg_win_sparse puts the keys inside the window (a functor callable from its
 * __host__ __device__ code). */
struct KeySink {
  unsigned long long k[8];
  int n = 0;
  __host__ __device__ void operator()(unsigned long long key) {
    if (n < 8) k[n] = key;
    ++n;
  }
};

/* The fused window's sparse way (WIN 1: VgLook in vg_fast_chunk, vg_win_sparse)
 * against the keys of the whole chunk, for one dtype pair. */
template <int DA, int DE>
static int check_win_cand_pair(long *n_chunks, long *teeth) {
  typedef vg_chunk<DA, DE> G;
  static_assert(G::CH == 8, "chunks of 8 pairs");
  int bad = 0;
  long tiny = 0; /* windows with 0 < lo and t32 == 0 */
  HotGate g;
  GateHeld held;
  vg_gate_init(g, held, 1e-3);
  for (long t = 0; t < 150000; ++t) {
    uint4 va[G::NVA], ve[G::NVE];
    memset(va, 0, sizeof va);
    memset(ve, 0, sizeof ve);
    float a[8], e[8];
    unsigned long long keys[8];
    bool define = false;
    for (int q = 0; q < 8; ++q) {
      const uint32_t ab = elem_bits<DA>(-1);
      uint32_t eb;
      if (DA == DE) {
        eb = elem_bits<DE>((long)ab);
      } else { /* a 16-bit actual against a float32 reference near its value */
        const float av = vgct_load_f32(&ab, DA);
        eb = (R() % 4 == 0) ? elem_bits<DE>(-1) : vgct_bits_from_f32(av) + (uint32_t)(R() % 65) - 32u;
      }
      if (R() % 300 == 0) /* e = -a: |d| = 2|a| (the sign bit flipped in e's own format) */
        eb = DA == DE ? ab ^ (DE == VGCT_FLOAT32 ? 0x80000000u : 0x8000u)
                      : vgct_bits_from_f32(-vgct_load_f32(&ab, DA));
      put_elem<DA>(va, q, ab);
      put_elem<DE>(ve, q, eb);
      a[q] = vgct_load_f32(reinterpret_cast<const char *>(va) + q * G::ISA, DA);
      e[q] = vgct_load_f32(reinterpret_cast<const char *>(ve) + q * G::ISE, DE);
      keys[q] = vg_key_narrow(a[q], e[q]);
      define = define || keys[q] == VG_KEY_NONE || !(fabsf(a[q] - e[q]) <= 3.4028235e38f);
    }
    unsigned long long lo, hi;
    random_window(keys, true, lo, hi);
    VgLook lk;
    lk.t32 = vg_win_t32_of(lo);
    tiny += lo > 0 && lk.t32 == 0.0f;
    lk.cand = 12345u;
    HotAcc h;
    vg_hot_init(h);
    vg_fast_chunk<8>(h, g, held, a, e, 0, 1, 1e-3, 1e-3, &lk, nullptr);
    ++*n_chunks;
    /* the reference: every finite key of the chunk against the bounds */
    unsigned ge = 0, el = 0, eh = 0, need = 0;
    std::vector<unsigned long long> inside;
    for (int q = 0; q < 8; ++q) {
      const unsigned long long k = keys[q];
      if (k == VG_KEY_NONE) continue;
      need |= (k >= lo && k != 0 ? 1u : 0u) << q; /* keys of 0: counted by number */
      ge += k >= lo;
      el += k == lo;
      eh += k == hi && lo != WIN_SENT;
      if (k > lo && k < hi) inside.push_back(k);
    }
    unsigned nzero = 0;
    for (int q = 0; q < 8; ++q) nzero += keys[q] == 0;
    if ((lk.cand & need) != need || (define && (lk.cand != 0xffu || lk.zeros != 0)) || lk.cand > 0xffu ||
        (!define && lk.zeros != nzero)) {
      if (++bad <= 5)
        printf("  cand<%d,%d>: lo %llx: candidates %x, keys >= lo %x, define %d, zeros %u/%u\n", DA, DE, lo,
               lk.cand, need, (int)define, lk.zeros, nzero);
    }
    /* the keys of the candidates (what the kernel's lane does) */
    VgWinCnt wc;
    wc.lo = vgct_f64_from_bits(lo);
    wc.hi = vgct_f64_from_bits(hi);
    wc.ge = wc.el = wc.eh = 0;
    KeySink sink;
    vg_win_sparse<DA, DE>(reinterpret_cast<const char *>(va), reinterpret_cast<const char *>(ve), lk, wc, sink);
    std::vector<unsigned long long> got(sink.k, sink.k + (sink.n < 8 ? sink.n : 8));
    if (sink.n > 8) got.resize(9); /* more keys than pairs: a mismatch below */
    std::sort(got.begin(), got.end());
    std::sort(inside.begin(), inside.end());
    unsigned weh = wc.eh;
    if (hi == lo) weh = eh = 0; /* dropped by the kernel's end (vg_win_end) */
    if (wc.ge != ge || wc.el != el || weh != eh || got != inside) {
      if (++bad <= 5)
        printf("  cand keys<%d,%d>: lo %llx hi %llx: ge %u/%u el %u/%u eh %u/%u stored %zu/%zu\n", DA, DE, lo, hi,
               wc.ge, ge, wc.el, el, weh, eh, got.size(), inside.size());
    }
    /* teeth: candidates by a bound 2^-20 too high miss keys >= lo */
    const float wrong = vg_f32_down(vgct_f64_from_bits(lo) * (1.0 + 0x1p-20));
    for (int q = 0; q < 8; ++q)
      if (((need >> q) & 1u) && fabsf(a[q] - e[q]) < wrong) ++*teeth;
  }
  if (tiny < 1000) {
    printf("  cand<%d,%d>: only %ld windows with 0 < lo and t32 == 0\n", DA, DE, tiny);
    ++bad;
  }
  return bad;
}

static int check_win_cand(long *n_chunks) {
  long teeth = 0;
  int bad = check_win_cand_pair<VGCT_BFLOAT16, VGCT_BFLOAT16>(n_chunks, &teeth) +
            check_win_cand_pair<VGCT_FLOAT16, VGCT_FLOAT16>(n_chunks, &teeth) +
            check_win_cand_pair<VGCT_FLOAT32, VGCT_FLOAT32>(n_chunks, &teeth) +
            check_win_cand_pair<VGCT_BFLOAT16, VGCT_FLOAT32>(n_chunks, &teeth) +
            check_win_cand_pair<VGCT_FLOAT16, VGCT_FLOAT32>(n_chunks, &teeth);
  if (teeth == 0) {
    printf("  cand: a bound 2^-20 too high missed no key: the check has no teeth\n");
    ++bad;
  }
  printf("fused window sparse way: %ld chunks, %ld keys missed with a bound 2^-20 too high\n", *n_chunks, teeth);
  return bad != 0;
}

/* vg_distinct_ascending (the selection's wanted ranks) against std::sort + std::unique, on lists
 * of 0..300 ranks drawn from small and int64-edge ranges (many duplicates, or none). */
static int check_distinct(void) {
  int bad = 0;
  for (int t = 0; t < 20000; ++t) {
    const int n = (int)(R() % 301);
    const uint64_t span = (R() & 1) ? 8 : (R() & 1) ? 1000 : ~0ull;
    std::vector<int64_t> v(n), out(n + 1, -7);
    for (int i = 0; i < n; ++i) v[i] = (int64_t)(span == ~0ull ? R() : R() % span) - (int64_t)(span == 8);
    std::vector<int64_t> want(v);
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    const int nu = vg_distinct_ascending(v.data(), n, out.data());
    if (nu != (int)want.size() || !std::equal(want.begin(), want.end(), out.begin()) || out[n] != -7) {
      if (++bad <= 3) printf("  distinct: n %d, %d values (want %zu)\n", n, nu, want.size());
    }
  }
  return bad != 0;
}

/* k_reduce_lean's typed loop: binary32-valued pairs folded by vg_pair_fin
 * with their finiteness tested in float32 (vg_finite32), and the thread's
 * last flush a plain store into a record nothing was folded into
 * (vg_lean_store_fresh), against vg_pair and vg_hot_flush: the record bit
 * for bit, sums included, on pairs built to hit every rule --
 * ties of |d|, of |d|/|e| and of the excess at other indices, e == 0,
 * signed zeros, subnormals, FLT_MAX and its neighbour, NaN/Inf -- with chunks cut short
 * (cnt < 8), indices rising or falling, and the kernels' periodic flushes.
 * Teeth: storing whatever s holds (the test s->n == 0 left out) must give
 * another record in some trials. */
static float lean_val(int kind) {
  switch (kind) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return (float)ldexp(U(), -140); /* subnormal */
    case 3: { /* near and at FLT_MAX */
      const float m = R() % 2 ? 0x1.fffffep+127f : 0x1.fffffcp+127f;
      return R() % 3 ? m * (R() % 2 ? 1.0f : -1.0f) : 3.0e38f * (float)(U() - 0.5);
    }
    case 4: return 1.0f;
    case 5: return -1.5f;
    case 6: return 0.25f * (float)(int)(R() % 9); /* few distinct values: ties */
    default: return (float)ldexp(U() - 0.5, (int)(R() % 20) - 10);
  }
}

static int check_lean_loop(long *n_stored, long *n_teeth, long *n_chunks) {
  int bad = 0;
  for (int t = 0; t < 40000; ++t) {
    const int nch = (t % 7 == 0) ? (int)(R() % 3) : 1 + (int)(R() % 40);
    const double rtol = (t % 5) ? 1e-3 : 0.0, atol = (t % 4) ? 1e-3 : 0.0;
    const int nonfinite = t % 5 == 0;
    const int64_t sfi = (t % 3 == 0) ? -1 : (t % 3 == 1) ? 1 : 7;
    vgct_acc want, got, wrong;
    vgct_acc_init(&want, 0);
    vgct_acc_init(&got, 0);
    HotAcc hw, hg;
    vg_hot_init(hw);
    vg_hot_init(hg);
    int since = 0;
    int64_t base = 100000;
    for (int c = 0; c < nch; ++c) {
      const int cnt = (R() % 4 == 0) ? 1 + (int)(R() % 8) : 8;
      float fa[8], fe[8];
      for (int q = 0; q < 8; ++q) {
        fa[q] = fe[q] = 0.0f;
        if (q >= cnt) continue;
        float e = lean_val((int)(R() % 8)), a;
        switch (R() % 5) {
          case 0: a = e; break;
          case 1: a = lean_val((int)(R() % 8)); break;
          case 2: a = -e; break;
          default: a = (float)((double)e * (1 + 1e-3 * (U() - 0.5)) + 1e-3 * (U() - 0.5));
        }
        if (nonfinite && R() % 13 == 0) (R() % 2 ? a : e) = (R() % 3 == 0) ? NAN : (R() % 2 ? INFINITY : -INFINITY);
        fa[q] = a;
        fe[q] = e;
      }
      const int64_t idx0 = base;
      base += (sfi < 0 ? -1 : 1) * 8 * (sfi < 0 ? -sfi : sfi) + (int64_t)(R() % 3);
      for (int q = 0; q < cnt; ++q)
        vg_pair<VG_MODE_LEAN>(hw, &want, (double)fa[q], (double)fe[q], idx0 + q * sfi, rtol, atol);
      for (int q = 0; q < cnt; ++q) /* k_reduce_lean's typed loop */
        vg_pair_fin<VG_MODE_LEAN>(hg, &got, (double)fa[q], (double)fe[q],
                                  vg_finite32(fa[q]) && vg_finite32(fe[q]), idx0 + q * sfi, rtol,
                                  atol);
      ++*n_chunks;
      if ((since += cnt) >= VG_FLUSH) {
        since = 0;
        vg_hot_flush(hw, &want);
        vg_hot_flush(hg, &got);
      }
    }
    vg_hot_flush(hw, &want);
    wrong = got;
    vg_hot_record(hg, &wrong); /* the planted fault: s overwritten whatever it held */
    if (vg_lean_store_fresh(hg, &got)) ++*n_stored; else vg_hot_flush(hg, &got);
    *n_teeth += memcmp(&wrong, &want, sizeof want) != 0;
    if (memcmp(&got, &want, sizeof want) != 0) {
      if (bad < 5) printf("lean loop: record differs in trial %d (%d chunks)\n", t, nch);
      ++bad;
    }
  }
  /* the float32 finiteness test against the float64 one: every float16 and
     bfloat16 pattern, and float32 patterns around the exponent's ends */
  for (uint32_t b = 0; b < 65536u; ++b) {
    const float fb = vgct_f32_from_bits(b << 16), fh = (float)vgct_f16_to_f64((uint16_t)b);
    bad += vg_finite32(fb) != vg_finite((double)fb);
    bad += vg_finite32(fh) != vg_finite((double)fh);
  }
  /* float32: the exponent's two ends exhaustively (every mantissa, both signs: 0, the
     subnormals, the largest finite binade with FLT_MAX, inf and every NaN), and 2M at random */
  for (uint32_t m = 0; m < (1u << 23); ++m)
    for (uint32_t hi : {0x00000000u, 0x7f000000u, 0x7f800000u, 0x80000000u, 0xff000000u, 0xff800000u}) {
      const float f = vgct_f32_from_bits(hi | m);
      bad += vg_finite32(f) != vg_finite((double)f);
    }
  for (int i = 0; i < 2000000; ++i) {
    const float f = vgct_f32_from_bits((uint32_t)R());
    bad += vg_finite32(f) != vg_finite((double)f);
  }
  return bad;
}

/* vgct_bf16_of_word (csrc/vgct_dtypes.h: THE bfloat16 conversion, of the scalar loaders and of the
 * reduce's vector path) against bfloat16's fields, decoded here: sign, 8 exponent bits (bias 127),
 * 7 fraction bits; exponent 0: subnormal (fraction 2^-133), 255: infinity or NaN.  Every one of the
 * 65536 patterns, in the low and in the high half of a word whose other half holds another pattern
 * (its own bit complement, so no half reads as the other): a non-NaN value must be the decoded
 * value, bit for bit (the sign of zero included); a NaN must stay a NaN with its sign and fraction
 * (the float32's low 16 bits zero). */
static int check_bf16_word(void) {
  int bad = 0;
  for (uint32_t b = 0; b < 65536u; ++b) {
    const int sgn = (int)(b >> 15), ex = (int)((b >> 7) & 0xffu), fr = (int)(b & 0x7fu);
    const uint32_t other = (~b) & 0xffffu;
    const float got[2] = {vgct_bf16_of_word(b | (other << 16), 0),
                          vgct_bf16_of_word((b << 16) | other, 1)};
    for (const float g : got) {
      bool ok;
      if (ex == 255 && fr != 0) {
        ok = std::isnan(g) && vgct_bits_from_f32(g) == b << 16;
      } else {
        const double mag = ex == 255 ? (double)INFINITY
                           : ex == 0 ? ldexp((double)fr, -133)
                                     : ldexp(1.0 + fr / 128.0, ex - 127);
        const double want = sgn ? -mag : mag;
        ok = (double)g == want && std::signbit(g) == (sgn != 0);
      }
      if (!ok && bad++ < 5) printf("bf16 %04x: got %a (bits %08x)\n", b, (double)g, vgct_bits_from_f32(g));
    }
  }
  return bad;
}

/* Check 14: vg_hot_flush_sums == vg_hot_flush where the fast kernels call it. */
static int check_flush_sums(long *n_flush, long *n_teeth) {
  int bad = 0;
  for (int t = 0; t < 20000; ++t) {
    const double rtol = (t % 5) ? 1e-3 : 0.0, atol = (t % 4) ? 1e-3 : 0.0;
    const int nonfinite = t % 3 == 0;
    vgct_acc s;
    vgct_acc_init(&s, 0);
    HotAcc h;
    vg_hot_init(h);
    HotGate g;
    GateHeld held;
    vg_gate_init(g, held, rtol);
    const int nch = 1 + (int)(R() % 40);
    int64_t f = 1000;
    for (int c = 0; c < nch; ++c, f += 8) {
      float a[8], e[8];
      for (int q = 0; q < 8; ++q) {
        e[q] = lean_val((int)(R() % 8));
        switch (R() % 4) {
          case 0: a[q] = e[q]; break;
          case 1: a[q] = lean_val((int)(R() % 8)); break;
          default: a[q] = (float)((double)e[q] * (1 + 1e-3 * (U() - 0.5)) + 1e-3 * (U() - 0.5));
        }
        if (nonfinite && R() % 17 == 0) (R() % 2 ? a[q] : e[q]) = R() % 2 ? NAN : -INFINITY;
      }
      const int r = vg_fast_chunk<8>(h, g, held, a, e, f, 1, rtol, atol);
      if (r != VG_CHUNK_DONE) { /* the kernels' fallbacks, then their gate refresh */
        for (int q = 0; q < 8; ++q) {
          if (r == VG_CHUNK_MAXIMA) vgct_acc_maxima(&s, a[q], e[q], f + q, rtol, atol);
          else vgct_acc_update(&s, a[q], e[q], f + q, rtol, atol, 0);
        }
        vg_held_from_acc(held, &s);
        vg_gate_derive(g, held);
      }
      if (R() % 4 != 0 && c != nch - 1) continue;
      vgct_acc want = s, got = s, wrong1 = s, wrong2 = s;
      HotAcc hw = h, hg = h, h1 = h, h2 = h;
      vg_hot_flush(hw, &want);
      vg_hot_flush_sums(hg, &got);
      vg_hot_flush_sums(h1, &wrong1);
      wrong1.max_abs_ref = s.max_abs_ref; /* planted: max |e| not merged */
      vg_hot_flush_sums(h2, &wrong2);
      wrong2.n_finite = s.n_finite; /* planted: n_finite not added */
      const bool hsame = hw.s_aa == hg.s_aa && hw.s_ee == hg.s_ee && hw.s_ae == hg.s_ae &&
                         hw.s_dd == hg.s_dd && hw.s_d == hg.s_d && hw.n == hg.n &&
                         hw.neq == hg.neq && hw.nmm == hg.nmm && hw.ref == hg.ref &&
                         hw.ref32 == hg.ref32 && hw.mxi == hg.mxi && hw.mri == hg.mri && hw.wxi == hg.wxi;
      if (memcmp(&want, &got, sizeof want) != 0 || !hsame) {
        if (bad < 5) printf("flush sums: record differs in trial %d, chunk %d\n", t, c);
        ++bad;
      }
      *n_teeth += memcmp(&want, &wrong1, sizeof want) != 0;
      *n_teeth += memcmp(&want, &wrong2, sizeof want) != 0;
      ++*n_flush;
      s = want;
      h = hw;
    }
  }
  return bad;
}

/* The float32 loop's min |e| key (vg_fast_chunk without P16) of n bfloat16 elements. */
static uint32_t key_f32_loop(const uint16_t *h, int n) {
  uint32_t mnb = 0xffffffffu;
  for (int q = 0; q < n; ++q) {
    const uint32_t eb = (vgct_bits_from_f32(vgct_bf16_of_word(h[q], 0)) << 1) - 1u;
    mnb = eb < mnb ? eb : mnb;
  }
  return mnb;
}

/* HotAcc fields vg_fast_chunk writes, bit for bit. */
static bool same_hot(const HotAcc &x, const HotAcc &y) {
  return memcmp(&x.s_aa, &y.s_aa, 8) == 0 && memcmp(&x.s_ee, &y.s_ee, 8) == 0 &&
         memcmp(&x.s_ae, &y.s_ae, 8) == 0 && memcmp(&x.s_dd, &y.s_dd, 8) == 0 &&
         memcmp(&x.s_d, &y.s_d, 8) == 0 && memcmp(&x.ref32, &y.ref32, 4) == 0 &&
         memcmp(&x.ref, &y.ref, 8) == 0 && x.n == y.n && x.neq == y.neq && x.nmm == y.nmm;
}

template <int D>
static int check_words16_pair(long *n_chunks, long *teeth_zero) {
  int bad = 0;
  for (int t = 0; t < 200000; ++t) {
    uint32_t wa[4] = {0, 0, 0, 0}, we[4] = {0, 0, 0, 0};
    float a[8], e[8];
    for (int q = 0; q < 8; ++q) {
      uint32_t be = elem_bits<D>(-1);
      if (R() % 8 == 0) be = (R() & 1) ? 0x8000u : 0u; /* zeros of both signs */
      uint32_t ba = elem_bits<D>((long)be);
      if (R() % 16 == 0) ba = be ^ 0x8000u * (be == 0u || be == 0x8000u); /* +0 against -0 */
      wa[q >> 1] |= ba << (16 * (q & 1));
      we[q >> 1] |= be << (16 * (q & 1));
      a[q] = D == VGCT_BFLOAT16 ? vgct_bf16_of_word(ba, 0) : (float)vgct_f16_to_f64((uint16_t)ba);
      e[q] = D == VGCT_BFLOAT16 ? vgct_bf16_of_word(be, 0) : (float)vgct_f16_to_f64((uint16_t)be);
    }
    const double rtol = (t % 3) ? 1e-3 : 0.0, atol = (t % 5) ? 1e-3 : 0.0;
    HotGate g;
    GateHeld held;
    vg_gate_init(g, held, rtol);
    if (t % 2) { /* a gate holding maxima: both branches of the bounds */
      held.mx = ldexp(1.0, -(int)(R() % 12)); held.mxi = 5;
      held.mr = ldexp(1.0, -(int)(R() % 12)); held.mri = 7;
      held.wx = ldexp(1.0, -(int)(R() % 12)); held.wxi = 9;
      vg_gate_derive(g, held);
    }
    HotAcc h0, h1;
    vg_hot_init(h0);
    if (t % 4 == 0) { h0.s_aa = 1.5; h0.n = 24; h0.neq = 3; h0.ref32 = (float)ldexp(1.0, (int)(R() % 9) - 4); }
    h1 = h0;
    /* the plain fold (t % 3 == 0), the sparse way's look (VgLook: its per-pair candidate
       mask, which the word path must leave to the float32 loop) and the fused window's
       classification (VgWinCnt), each with and without the words */
    const int way = t % 3;
    VgLook l0, l1;
    l0.t32 = l1.t32 = (float)ldexp(1.0, -(int)(R() % 16));
    l0.cand = l1.cand = l0.zeros = l1.zeros = 0u;
    VgWinCnt w0, w1;
    w0.lo = ldexp(1.0, -(int)(R() % 16));
    w0.hi = w0.lo * (1.0 + (double)(R() % 4));
    w0.ge = w0.el = w0.eh = w0.in = 0u;
    w1 = w0;
    const int r0 = vg_fast_chunk<8>(h0, g, held, a, e, 64, 1, rtol, atol, way == 1 ? &l0 : nullptr,
                                    way == 2 ? &w0 : nullptr);
    const int r1 = vg_fast_chunk<8, D>(h1, g, held, a, e, 64, 1, rtol, atol, way == 1 ? &l1 : nullptr,
                                       way == 2 ? &w1 : nullptr, wa, we);
    const bool look = l0.cand == l1.cand && l0.zeros == l1.zeros;
    const bool win = w0.ge == w1.ge && w0.el == w1.el && w0.eh == w1.eh && w0.in == w1.in;
    if (r0 != r1 || !same_hot(h0, h1) || !look || !win) {
      if (++bad <= 5)
        printf("words16 dtype %d trial %d way %d: outcome %d / %d, neq %d / %d, ref32 %a / %a, "
               "cand %x / %x, win in %x / %x\n", D, t, way, r0, r1, h0.neq, h1.neq, h0.ref32,
               h1.ref32, l0.cand, l1.cand, w0.in, w1.in);
    }
    ++*n_chunks;
    /* teeth: the unequal pairs counted with +0 != -0 (their bits compared) */
    if (r0 != VG_CHUNK_DEFINE) {
      int nb = 0;
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 2; ++k) nb += ((wa[i] >> (16 * k)) & 0xffffu) != ((we[i] >> (16 * k)) & 0xffffu);
      int nm = 0;
      for (int i = 0; i < 4; ++i) nm += vg_popc(vg_ne16_mask<D>(wa[i], we[i]) & 0x00010001u);
      *teeth_zero += nb != nm;
      if (nm != (int)(h0.neq - (t % 4 == 0 ? 3 : 0))) {
        if (++bad <= 5) printf("words16 dtype %d trial %d: vg_ne16_mask counts %d\n", D, t, nm);
      }
    }
  }
  return bad;
}

static int check_words16(long *n_keys, long *n_chunks, long *teeth_key, long *teeth_zero) {
  int bad = 0;
  /* every bfloat16 pattern p, alone in a word beside +0 or -0, in either half */
  for (uint32_t p = 0; p < 0x10000u; ++p) {
    for (uint32_t z = 0; z <= 0x8000u; z += 0x8000u) {
      for (int half = 0; half < 2; ++half) {
        const uint32_t w = half ? (z | (p << 16)) : (p | (z << 16));
        const uint16_t h[2] = {(uint16_t)(w & 0xffffu), (uint16_t)(w >> 16)};
        const uint32_t want = key_f32_loop(h, 2), got = vg_min16_key<1>(&w);
        if (want != got && ++bad <= 5) printf("min16 key of %08x: %08x, want %08x\n", w, got, want);
        /* teeth: without the mask, the low element's sign lands in the high key */
        const uint32_t wrong = __viaddmin_u16x2(w << 1, 0xffffffffu, 0xffffffffu);
        const uint32_t k = std::min(wrong & 0xffffu, wrong >> 16);
        *teeth_key += ((k + 1u) << 16) - 1u != want;
        ++*n_keys;
      }
    }
  }
  /* random words of four */
  for (int t = 0; t < 200000; ++t) {
    uint32_t w[4];
    uint16_t h[8];
    for (int q = 0; q < 8; ++q) {
      h[q] = (R() % 3 == 0) ? (uint16_t)((R() & 1) ? 0x8000u : 0u) : (uint16_t)elem_bits<VGCT_BFLOAT16>(-1);
    }
    for (int i = 0; i < 4; ++i) w[i] = h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
    const uint32_t want = key_f32_loop(h, 8), got = vg_min16_key<4>(w);
    if (want != got && ++bad <= 5) printf("min16 key (4 words): %08x, want %08x\n", got, want);
    ++*n_keys;
  }
  bad += check_words16_pair<VGCT_BFLOAT16>(n_chunks, teeth_zero);
  bad += check_words16_pair<VGCT_FLOAT16>(n_chunks, teeth_zero);
  return bad;
}

/* 16: one split of ring steps (seg: vg_ring_segments or a planted copy) against
 * the chunks it must copy; the failures, the steps tried and the two-copy
 * steps among the kernel's starts. */
template <class Seg>
static long ring_split_failures(Seg seg, long *n_steps, long *n_two) {
  long bad = 0;
  for (int64_t cpr = 32; cpr <= 1024; cpr += 32)
    for (int64_t cb = 0; cb < 3 * cpr + 97; ++cb)
      for (int nf = 0; nf <= 96; ++nf) {
        const int64_t row0 = cb / cpr, col0 = cb % cpr;
        int64_t next = 0;
        int segs = 0;
        bool ok = true;
        seg(row0, col0, nf, cpr, [&](int i, int64_t r, int64_t col, int n) {
          ok = ok && i == next && n >= 1 && col >= 0 && col + n <= cpr && r * cpr + col == cb + i &&
               (segs == 0 ? r == row0 && col == col0 : col == 0);
          next += n;
          ++segs;
        });
        ok = ok && next == nf;
        if (cb % 32 == 0) { /* the kernel's starts */
          if (cpr % 64 == 0) ok = ok && segs <= 2;
          if (nf <= 32) ok = ok && segs <= 1;
          *n_two += segs == 2;
        }
        bad += !ok;
        ++*n_steps;
      }
  return bad;
}

static int check_ring_segments(long *n_steps, long *n_two, long *teeth) {
  const long bad = ring_split_failures(
      [](int64_t row, int64_t col, int nf, int64_t cpr, auto &&f) { vg_ring_segments(row, col, nf, cpr, f); },
      n_steps, n_two);
  long ns = 0, n2 = 0;
  *teeth = ring_split_failures( /* planted: the next row read from the same column */
      [](int64_t row, int64_t col, int nf, int64_t cpr, auto &&f) {
        for (int i = 0; i < nf; ++row) {
          const int n = (int)std::min((int64_t)(nf - i), cpr - col);
          f(i, row, col, n);
          i += n;
        }
      },
      &ns, &n2);
  if (bad) printf("ring segments: %ld steps split wrong\n", bad);
  return bad != 0;
}

/* 17: one cursor (init, at, step: VgRowCur or a planted copy) against the
 * division; the failures and the indices checked. */
template <class Init, class At, class Step>
static long rowcur_failures(Init init, At at, Step step, long *n_idx) {
  long bad = 0;
  std::vector<int64_t> cprs;
  for (int64_t cpr = 32; cpr <= 1024; cpr += 32) cprs.push_back(cpr);
  for (int64_t cpr : {1, 3, 7, 64 * 3 + 5, 2048, 4096, 1 << 20}) cprs.push_back(cpr);
  for (int64_t cpr : cprs) {
    const FastDiv d = vg_make_div((uint64_t)cpr);
    std::vector<int64_t> starts;
    for (int64_t c = 0; c < std::min<int64_t>(3 * cpr + 97, 4000); ++c) starts.push_back(c);
    for (int i = 0; i < 64; ++i) starts.push_back((int64_t)(R() >> 24));
    for (int64_t cstep : {(int64_t)256, (int64_t)768, (int64_t)1, cpr, 2 * cpr + 5}) {
      for (int64_t c : starts) {
        const int64_t f0 = (int64_t)(R() % 100000) - 50000;
        const int64_t sf0 = (R() % 2 ? 1 : -1) * (int64_t)(R() % (1u << 20));
        const int64_t w = (R() % 2 ? 1 : -1) * (int64_t)(1 + R() % 64);
        auto r = init(c, cpr, d, f0, sf0, w, cstep);
        for (int k = 0; k < 24; ++k, c += cstep) {
          const int64_t dus[4] = {0, std::min<int64_t>(32, cpr), std::min<int64_t>(64, cpr),
                                  (int64_t)(R() % (uint64_t)(cpr + 1))};
          for (int64_t du : dus) {
            const int64_t cc = c + du, want = f0 + (cc / cpr) * sf0 + (cc % cpr) * w;
            bad += at(r, du) != want;
            ++*n_idx;
          }
          step(r);
        }
      }
    }
  }
  return bad;
}

static int check_rowcur(long *n_idx, long *teeth, long *teeth_at) {
  const long bad = rowcur_failures(vg_rowcur_init, vg_rowcur_at, vg_rowcur_step, n_idx);
  long ni = 0;
  *teeth = rowcur_failures( /* planted: a step's row end not crossed */
      vg_rowcur_init, vg_rowcur_at,
      [](VgRowCur &r) {
        r.col += r.rs;
        r.f += r.fs;
        if (r.col >= r.cpr) r.col -= r.cpr;
      },
      &ni);
  *teeth_at = rowcur_failures( /* planted: a chunk past its row end given the row's index */
      vg_rowcur_init, [](const VgRowCur &r, int64_t du) { return r.f + du * r.w; }, vg_rowcur_step,
      &ni);
  if (bad) printf("ring index cursor: %ld indices wrong\n", bad);
  return bad != 0;
}

int main() {
  int passed = 0, failed = 0;
  long nc = 0;
  const int fc = check_fast_counts<8>(&nc) + check_fast_counts<4>(&nc);
  printf("fast path counters at the tolerance boundary: %ld chunks folded\n", nc);
  long nw = 0, nk = 0, nl = 0;
  int r[15] = {check_fold(false), check_fold(true), check_fastdiv(), check_fast(),
               fc + (nc < 100000), check_key_narrow(), check_int_pairs(),
               check_win_t32(&nw) + (nw < 1000000), check_distinct(),
               check_win_classify(&nk), check_win_cand(&nl) + (nl < 700000),
               0 /* check_lean_loop, below */, check_bf16_word(), 0 /* below */, 0};
  long ns = 0, nt = 0, nlc = 0; /* last: the checks above draw the same numbers as before it */
  r[11] = check_lean_loop(&ns, &nt, &nlc) + (ns < 1000) + (nt < 1000) + (nlc < 100000);
  printf("lean loop: %ld chunks, %ld records stored fresh, %ld trials the planted fault changes\n",
         nlc, ns, nt);
  long nfl = 0, nft = 0;
  r[13] = check_flush_sums(&nfl, &nft) + (nfl < 100000) + (nft < 100000);
  printf("flush sums: %ld flushes, %ld planted faults caught\n", nfl, nft);
  long n16k = 0, n16c = 0, n16tk = 0, n16tz = 0;
  r[14] = check_words16(&n16k, &n16c, &n16tk, &n16tz) + (n16k < 300000) + (n16c < 400000) +
          (n16tk < 1000) + (n16tz < 1000);
  printf("16-bit words: %ld keys, %ld chunks; planted faults caught: %ld keys without the sign mask, "
         "%ld chunks counting +0 != -0\n", n16k, n16c, n16tk, n16tz);
  long nrs = 0, nr2 = 0, nrt = 0;
  const int r16 = check_ring_segments(&nrs, &nr2, &nrt) + (nr2 < 5000) + (nrt < 100000);
  printf("ring segments: %ld steps, %ld of the kernel's starts take two copies; the planted split "
         "fails %ld\n", nrs, nr2, nrt);
  long nci = 0, nct = 0, ncta = 0;
  const int r17 = check_rowcur(&nci, &nct, &ncta) + (nci < 10000000) + (nct < 100000) + (ncta < 100000);
  printf("ring index cursor: %ld indices; the planted cursors get %ld (a step's row end) and %ld (a "
         "chunk's) wrong\n", nci, nct, ncta);
  const char *names[17] = {"register accumulator == vgct_acc_update (bitwise)",
                          "periodic flushes: maxima/counters exact, sums 1e-13",
                          "FastDiv == '/'",
                          "narrow-dtype chunk fast path: maxima/counters exact, sums 1e-13",
                          "fast path counters at the mismatch boundary == vgct_acc_update",
                          "vg_key_narrow == vgct_absdiff_key",
                          "vgct_int_pair == 128-bit integer arithmetic",
                          "fused window: max |d32| < t32(lo) => every key < lo",
                          "vg_distinct_ascending == std::sort + std::unique",
                          "fused window: the fold's classification == the keys' comparisons",
                          "fused window, sparse way: candidates and their keys == the keys' comparisons",
                          "lean loop: float32 finiteness and the fresh last flush == vg_pair + vg_hot_flush (bitwise)",
                          "vgct_bf16_of_word == bfloat16's decoded fields (every pattern, both halves)",
                          "the fast kernels' flush (vg_hot_flush_sums) == vg_hot_flush (bitwise)",
                          "16-bit words: vg_min16_key and vg_fast_chunk<P16> == the float32 loop (bitwise)",
                          "ring steps over rows: vg_ring_segments copies each chunk once, from its row",
                          "ring index over rows: VgRowCur == the division (c / cpr, c % cpr)"};
  for (int i = 0; i < 17; ++i) {
    const int ri = i < 15 ? r[i] : i == 15 ? r16 : r17;
    printf("%s: %s\n", names[i], ri ? "FAIL" : "ok");
    ri ? ++failed : ++passed;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
