/*
 * vgct_stats.h -- the ONE definition of every paired statistic.
 *
 * Both engines (csrc/cpu_engine.c and the cuda/ kernels) visit pairs (a_i, e_i) of an
 * `actual` and an `expected` tensor, already converted to float64 by
 * vgct_dtypes.h, and fold them into the accumulators below with
 * vgct_acc_update() / vgct_slice_update(); partial accumulators are combined
 * with vgct_acc_merge() / vgct_slice_merge(), which are associative and, with
 * the index tie rules below, give the same maxima and indices in any merge
 * order (sums differ only by rounding; each engine merges in a FIXED order so
 * repeated calls are bitwise identical).  Finalisation (norms, ratios,
 * quantile interpolation) is also here, so CPU and GPU results mean the same
 * thing.  docs/metrics.md states the definitions in prose; the method they
 * serve is the VisualGen component-test method, stated in docs/method.md
 * (relative L2, cosine, max abs, p99 abs, per-channel mean shift, "handle a
 * zero-norm reference explicitly").
 *
 * Definitions (i runs over the flat row-major logical index of the tensors):
 *   finite pair   a_i and e_i both finite.  Only finite pairs enter sums,
 *                 maxima, mismatches and quantiles.
 *   d_i           a_i - e_i, in float64.
 *   rel_l2        ||d||_2 / ||e||_2 over finite pairs; undefined (None) when
 *                 ||e||_2 == 0 ("zero reference").
 *   cosine        <a,e> / (||a||_2 ||e||_2); undefined when either norm is 0.
 *                 Clamped to [-1, 1] (a change of at most a few ulps).
 *   max_abs_err   max |d_i|, lowest i among ties; the pair (a_i, e_i) there.
 *   max_rel_err   max |d_i| / |e_i| over finite pairs with e_i != 0.
 *   mismatch      finite pair with |d_i| > atol + rtol*|e_i| (torch.allclose
 *                 convention); the worst is the largest excess
 *                 |d_i| - (atol + rtol*|e_i|), lowest i among ties.
 *   unequal       !(a_i == e_i) and not (both NaN): +0 == -0, Inf == Inf.
 *   class         finite / NaN / +Inf / -Inf; a class mismatch is a position
 *                 whose two classes differ.
 *   mean_diff     sum(d_i) / n_finite.
 *
 * Overflow and underflow.  When an input is float64 the engines use the
 * SCALED update (the idea of BLAS nrm2 / LAPACK dlassq), with one power-of-
 * two scale PER SUM FAMILY: s_aa is kept relative to scale_a >= max |a_i|,
 * s_ee to scale_e >= max |e_i|, the cross sum s_ae to scale_a*scale_e, and
 * s_dd, s_d to scale_d >= max |d_i| (maxima of the pairs seen so far); a
 * family is rescaled exactly (by a power of two) when a larger value of its
 * quantity arrives.  Each sum of squares thus holds its own maximum as a term
 * >= 1/4 (>= 2^-148 when all its values are below the floor 2^-1000 of the
 * scales), so no vector underflows against ANOTHER vector's magnitude:
 * 1e300 and 1e-310,
 * a ~ 1e-200 against e ~ 1, or d ~ 1e-300 next to |a|,|e| ~ 1e300 all give
 * correct norms, ratios and cosines.  d_i = a_i - e_i can overflow although
 * a_i and e_i are finite (|a|,|e| near DBL_MAX, opposite signs): max_abs and
 * the quantile keys keep that +Inf (the float64 difference), while the sums
 * use d_i/scale_d computed as (a_i/2 - e_i/2)*(2/scale_d), exact up to one
 * rounding like every other d_i/scale_d.  For every other dtype the squares
 * of finite values fit float64 with room to spare (float32 max^2 ~ 1.2e77,
 * int64 max^2 ~ 8.5e37, smallest float32 subnormal^2 ~ 2e-90), so the
 * UNSCALED update (every scale == 1) is exact in range and cheaper.  Scales
 * never go below 2^-1000 so that 1/scale stays finite, nor above 2^1023 (the
 * largest power of two; |x|/2^1023 <= 2 still squares far from overflow).
 * Finalisation combines scales of different families only as ratios of
 * powers of two applied with ldexp (vgct_ldexp_ratio), so a result is +Inf
 * or 0 only when its true value is beyond the float64 range.
 */
#ifndef VGCT_STATS_H_
#define VGCT_STATS_H_

#include <stdint.h>
#include <math.h>
#include "vgct_dtypes.h"

/* Classes of a value. */
enum { VGCT_FINITE = 0, VGCT_NAN = 1, VGCT_POSINF = 2, VGCT_NEGINF = 3 };

VGCT_HD int vgct_class(double x) {
  if (x != x) return VGCT_NAN;
  if (x == (double)INFINITY) return VGCT_POSINF;
  if (x == -(double)INFINITY) return VGCT_NEGINF;
  return VGCT_FINITE;
}

#define VGCT_MIN_SCALE 0x1p-1000

/* Whole-tensor accumulator.  Plain old data: engines copy it to and from the
 * device and across ranks ([E]) as bytes; the layout is part of the record
 * format (VGCT_ACC_VERSION). */
#define VGCT_ACC_VERSION 2
typedef struct {
  double scale_a;     /* powers of two (1 in the unscaled update); the sums */
  double scale_e;     /* below are relative to the scale of their family    */
  double scale_d;
  double s_aa;        /* sum (a/scale_a)^2                                  */
  double s_ee;        /* sum (e/scale_e)^2                                  */
  double s_ae;        /* sum (a/scale_a)(e/scale_e)                         */
  double s_dd;        /* sum (d/scale_d)^2                                  */
  double s_d;         /* sum d/scale_d                                      */
  double max_abs;     /* max |d|; -1 when no finite pair yet                */
  double max_abs_a;   /* a at max_abs_i                                     */
  double max_abs_e;   /* e at max_abs_i                                     */
  double max_rel;     /* max |d|/|e| over e != 0; -1 when none              */
  double worst_excess;/* max |d| - (atol + rtol |e|) over mismatches; -1 none */
  double max_abs_ref; /* max |e| over finite pairs; -1 none (zero-ref gates) */
  int64_t max_abs_i;  /* flat index, -1 when none                           */
  int64_t max_rel_i;
  int64_t worst_i;
  int64_t n;          /* pairs visited                                      */
  int64_t n_finite;
  int64_t n_unequal;
  int64_t n_mismatch;
  int64_t n_nan_a, n_posinf_a, n_neginf_a;
  int64_t n_nan_e, n_posinf_e, n_neginf_e;
  int64_t n_class_diff;
  int64_t first_class_diff; /* lowest flat index whose classes differ; -1 none */
} vgct_acc;

/* Per-slice accumulator for compare(dim=k): one per index along axis k. */
typedef struct {
  double scale_e, scale_d;
  double s_dd, s_ee, s_d; /* relative to scale_d, scale_e, scale_d, as in vgct_acc */
  double max_abs;         /* -1 when no finite pair               */
  int64_t n_finite;
} vgct_slice_acc;

VGCT_HD void vgct_acc_init(vgct_acc *s, int scaled) {
  s->scale_a = s->scale_e = s->scale_d = scaled ? VGCT_MIN_SCALE : 1.0;
  s->s_aa = s->s_ee = s->s_ae = s->s_dd = s->s_d = 0.0;
  s->max_abs = s->max_rel = s->worst_excess = s->max_abs_ref = -1.0;
  s->max_abs_a = s->max_abs_e = 0.0;
  s->max_abs_i = s->max_rel_i = s->worst_i = -1;
  s->n = s->n_finite = s->n_unequal = s->n_mismatch = 0;
  s->n_nan_a = s->n_posinf_a = s->n_neginf_a = 0;
  s->n_nan_e = s->n_posinf_e = s->n_neginf_e = 0;
  s->n_class_diff = 0;
  s->first_class_diff = -1;
}

VGCT_HD void vgct_slice_init(vgct_slice_acc *s, int scaled) {
  s->scale_e = s->scale_d = scaled ? VGCT_MIN_SCALE : 1.0;
  s->s_dd = s->s_ee = s->s_d = 0.0;
  s->max_abs = -1.0;
  s->n_finite = 0;
}

/* A power of two > m (m > 0): 2^(floor(log2 m) + 1), clamped to
 * [VGCT_MIN_SCALE, 2^1023]; 2^1023 for m = +Inf (an overflowing float64
 * difference of finite values, |d| < 2^1025). */
VGCT_HD double vgct_pow2_ceil(double m) {
  if (!(m <= 0x1.fffffffffffffp+1023)) return 0x1p1023;
  int ex;
  double f = frexp(m, &ex); /* m = f * 2^ex, f in [0.5, 1) */
  (void)f;
  if (ex > 1023) ex = 1023; /* m >= 2^1023: 2^1024 is not a double; |x|/2^1023 <= 2 still
                               squares far below overflow (fixes |x| >= 2^1023 zeroing sums) */
  double p = ldexp(1.0, ex);
  return p < VGCT_MIN_SCALE ? VGCT_MIN_SCALE : p;
}

/* (value, index) is better than (bv, bi): larger value, or equal value and
 * lower index.  Index -1 means "none" and always loses. */
VGCT_HD int vgct_better(double v, int64_t i, double bv, int64_t bi) {
  if (i < 0) return 0;
  if (bi < 0) return 1;
  return v > bv || (v == bv && i < bi);
}

/* a*b rounded on its own: nvcc contracts a*b+c into one fused multiply-add
 * by default, which would make `atol + rtol*|e|` (an exact decision, not a
 * sum) differ between the engines (added for the CUDA engine, [B]). */
VGCT_HD double vgct_mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/* The tolerance of a pair whose reference has magnitude ae: atol + rtol*ae,
 * the product rounded on its own (vgct_mul).  A finite pair mismatches when
 * |a - e| > vgct_tol(rtol, atol, |e|) (docs/metrics.md, `mismatches`); every
 * engine and kernel decides it with this one expression. */
VGCT_HD double vgct_tol(double rtol, double atol, double ae) { return atol + vgct_mul(rtol, ae); }

/* Exact shortcut for max_rel (added for the CUDA engine, [B]; results are
 * unchanged): 0 only when (ad/ae, idx) (ae > 0) certainly does not beat
 * (best, best_i) under vgct_better, so the float64 division -- the costliest
 * step of an update on a GPU -- can be skipped.  ad == 0: the quotient is
 * exactly +0, which wins only a tie at a lower index.  Otherwise, with
 * p = fl(fl(best*ae)*(1-2^-40)) a normal number: ad <= p implies
 * ad/ae <= best*(1-2^-40)(1+2^-53)^2 < best*(1-2^-41), and rounding the
 * quotient cannot reach best.  In every other case (no best yet, p
 * subnormal, infinite or NaN) the caller divides as before. */
VGCT_HD int vgct_rel_may_win(double ad, double ae, int64_t idx, double best, int64_t best_i) {
  if (best_i < 0) return 1;
  if (ad == 0.0) return best == 0.0 && idx < best_i;
  double p = best * ae * (1.0 - 0x1p-40);
  return !(p >= 0x1p-1000 && p <= 0x1.fffffffffffffp+1023 && ad <= p);
}

/* ---- the scaled update (float64 inputs) ---------------------------------
 * Each family's scale is a power of two >= the largest magnitude of its
 * quantity seen so far; r = old/new is an exact power of two (or 0 when it
 * is below 2^-1074: the old sums are then below 2^-1074 of the new term,
 * which alone is >= 1/4).  1/scale is exact (scale in [2^-1000, 2^1023]).
 * d/scale_d, not a/scale_d - e/scale_d: the float64 difference rounded once,
 * then scaled exactly. */

/* 1/p for a power of two p in [2^-1000, 2^1023], exactly, without a
 * division (the definition path runs per pair on the GPU): 2^-k from the
 * exponent bits; 2^-1023 (subnormal) for p = 2^1023.  x*(1/p) == x/p bit
 * for bit (both are the exact quotient rounded once). */
VGCT_HD double vgct_pow2_inv(double p) {
  uint64_t eb = vgct_bits_from_f64(p) >> 52; /* biased exponent, p > 0 */
  return eb < 2046 ? vgct_f64_from_bits((uint64_t)(2046 - eb) << 52) : 0x1p-1023;
}

/* Scaled difference d/scale_d: d*(1/scale_d) when the float64 difference is
 * finite, else (opposite signs, the larger magnitude above 2^1023 - 2^970 and
 * the smaller above 2^970, so both are normal; scale_d == 2^1023)
 * (a/2 - e/2)*(2/scale_d): halving such values is exact and the subtraction
 * rounds once, as a - e would in a wider exponent range. */
VGCT_HD double vgct_scaled_diff(double a, double e, double d, double ad, double inv_d) {
  return ad <= 0x1.fffffffffffffp+1023 ? d * inv_d : (a * 0.5 - e * 0.5) * (2.0 * inv_d);
}

/* Raise a family's scale to cover the magnitude m (no-op when it does):
 * the new scale is pow2_ceil(m), r = old/new is an exact power of two (or 0),
 * the family's sum of squares *sq is multiplied by r*r and its linear sum
 * *lin (NULL: none) by r.  The one rescaling rule of every family of
 * vgct_acc and vgct_slice_acc (s_ae is the linear sum of both the a and the
 * e family: it is relative to scale_a*scale_e). */
VGCT_HD void vgct_scale_grow(double *scale, double m, double *sq, double *lin) {
  if (!(m > *scale)) return;
  double ns = vgct_pow2_ceil(m);
  double r = *scale / ns;
  *sq *= r * r;
  if (lin) *lin *= r;
  *scale = ns;
}

/* The d family (s_dd, s_d relative to *scale_d), shared by vgct_acc_update
 * and vgct_slice_update: rescale for |d| = ad, then add the pair. */
VGCT_HD void vgct_scaled_sums(double *scale_d, double *s_dd, double *s_d, double a, double e,
                              double d, double ad) {
  vgct_scale_grow(scale_d, ad, s_dd, s_d);
  double ds = vgct_scaled_diff(a, e, d, ad, vgct_pow2_inv(*scale_d));
  *s_dd += ds * ds; *s_d += ds;
}

/* The maxima of a FINITE pair (a, e) at flat index idx: max_abs (with the
 * pair), max_rel and the worst mismatch excess, each with the lowest-index
 * tie rule of vgct_better.  Part of vgct_acc_update (which adds the counters
 * and sums); the CUDA fast path also calls it alone, for the pairs whose
 * counters and sums it has already folded (cuda/vgct_cuda_internal.cuh). */
VGCT_HD void vgct_acc_maxima(vgct_acc *s, double a, double e, int64_t idx, double rtol,
                             double atol) {
  double d = a - e;
  double ad = fabs(d), ae = fabs(e);
  /* ad >= max_abs first: one compare on the common path (max_abs is -1
     while none is set, so the first pair still reaches vgct_better) */
  if (ad >= s->max_abs && vgct_better(ad, idx, s->max_abs, s->max_abs_i)) {
    s->max_abs = ad; s->max_abs_i = idx; s->max_abs_a = a; s->max_abs_e = e;
  }
  if (e != 0.0 && vgct_rel_may_win(ad, ae, idx, s->max_rel, s->max_rel_i)) {
    double r = ad / ae;
    if (vgct_better(r, idx, s->max_rel, s->max_rel_i)) { s->max_rel = r; s->max_rel_i = idx; }
  }
  double tol = vgct_tol(rtol, atol, ae);
  if (ad > tol) {
    double ex = ad - tol;
    if (vgct_better(ex, idx, s->worst_excess, s->worst_i)) { s->worst_excess = ex; s->worst_i = idx; }
  }
}

/* Fold one pair (a, e) at flat index idx.  `scaled` is a compile-time
 * constant in the engines' instantiations (0 unless an input is float64). */
VGCT_HD void vgct_acc_update(vgct_acc *s, double a, double e, int64_t idx,
                             double rtol, double atol, int scaled) {
  s->n += 1;
  int ca = vgct_class(a), ce = vgct_class(e);
  if ((ca | ce) != VGCT_FINITE) {
    s->n_nan_a += ca == VGCT_NAN;
    s->n_posinf_a += ca == VGCT_POSINF;
    s->n_neginf_a += ca == VGCT_NEGINF;
    s->n_nan_e += ce == VGCT_NAN;
    s->n_posinf_e += ce == VGCT_POSINF;
    s->n_neginf_e += ce == VGCT_NEGINF;
    if (ca != ce) {
      s->n_class_diff += 1;
      if (s->first_class_diff < 0 || idx < s->first_class_diff) s->first_class_diff = idx;
    }
    /* unequal unless equal infinities or both NaN */
    s->n_unequal += !(a == e || (ca == VGCT_NAN && ce == VGCT_NAN));
    return;
  }
  s->n_finite += 1;
  s->n_unequal += (a != e);
  double d = a - e;
  double ad = fabs(d), ae = fabs(e);
  vgct_acc_maxima(s, a, e, idx, rtol, atol);
  if (ae > s->max_abs_ref) s->max_abs_ref = ae;
  s->n_mismatch += ad > vgct_tol(rtol, atol, ae);
  if (scaled) {
    vgct_scale_grow(&s->scale_a, fabs(a), &s->s_aa, &s->s_ae);
    vgct_scale_grow(&s->scale_e, ae, &s->s_ee, &s->s_ae);
    vgct_scaled_sums(&s->scale_d, &s->s_dd, &s->s_d, a, e, d, ad);
    double as = a * vgct_pow2_inv(s->scale_a), es = e * vgct_pow2_inv(s->scale_e);
    s->s_aa += as * as; s->s_ee += es * es; s->s_ae += as * es;
  } else {
    s->s_aa += a * a; s->s_ee += e * e; s->s_ae += a * e;
    s->s_dd += d * d; s->s_d += d;
  }
}

VGCT_HD void vgct_slice_update(vgct_slice_acc *s, double a, double e, int scaled) {
  if (vgct_class(a) != VGCT_FINITE || vgct_class(e) != VGCT_FINITE) return;
  s->n_finite += 1;
  double d = a - e;
  double ad = fabs(d);
  if (ad > s->max_abs) s->max_abs = ad;
  if (scaled) {
    vgct_scale_grow(&s->scale_e, fabs(e), &s->s_ee, NULL);
    vgct_scaled_sums(&s->scale_d, &s->s_dd, &s->s_d, a, e, d, ad);
    double es = e * vgct_pow2_inv(s->scale_e);
    s->s_ee += es * es;
  } else {
    s->s_dd += d * d; s->s_ee += e * e; s->s_d += d;
  }
}

/* Merges bring both operands to the larger scale of each family by exact
 * powers of two; only contributions below 2^-1074 of the new scale (squared)
 * are lost, far below float64 resolution of the result (the new scale's own
 * maximum contributes >= 1/4).  With equal scales (always so in the unscaled
 * update: every scale 1) a merge is a plain add. */
VGCT_HD double vgct_merge_ratio(double *scale, double other, double *r_other) {
  double r_self = 1.0;
  *r_other = 1.0;
  if (other > *scale) { r_self = *scale / other; *scale = other; }
  else if (other < *scale) { *r_other = other / *scale; }
  return r_self;
}

VGCT_HD void vgct_acc_merge(vgct_acc *VGCT_RESTRICT s, const vgct_acc *VGCT_RESTRICT o) {
  double oa, oe, od;
  double ra = vgct_merge_ratio(&s->scale_a, o->scale_a, &oa);
  double re = vgct_merge_ratio(&s->scale_e, o->scale_e, &oe);
  double rd = vgct_merge_ratio(&s->scale_d, o->scale_d, &od);
  s->s_aa = s->s_aa * (ra * ra) + o->s_aa * (oa * oa);
  s->s_ee = s->s_ee * (re * re) + o->s_ee * (oe * oe);
  s->s_ae = s->s_ae * ra * re + o->s_ae * oa * oe;
  s->s_dd = s->s_dd * (rd * rd) + o->s_dd * (od * od);
  s->s_d = s->s_d * rd + o->s_d * od;
  if (vgct_better(o->max_abs, o->max_abs_i, s->max_abs, s->max_abs_i)) {
    s->max_abs = o->max_abs; s->max_abs_i = o->max_abs_i;
    s->max_abs_a = o->max_abs_a; s->max_abs_e = o->max_abs_e;
  }
  if (vgct_better(o->max_rel, o->max_rel_i, s->max_rel, s->max_rel_i)) {
    s->max_rel = o->max_rel; s->max_rel_i = o->max_rel_i;
  }
  if (vgct_better(o->worst_excess, o->worst_i, s->worst_excess, s->worst_i)) {
    s->worst_excess = o->worst_excess; s->worst_i = o->worst_i;
  }
  if (o->max_abs_ref > s->max_abs_ref) s->max_abs_ref = o->max_abs_ref;
  s->n += o->n;
  s->n_finite += o->n_finite;
  s->n_unequal += o->n_unequal;
  s->n_mismatch += o->n_mismatch;
  s->n_nan_a += o->n_nan_a; s->n_posinf_a += o->n_posinf_a; s->n_neginf_a += o->n_neginf_a;
  s->n_nan_e += o->n_nan_e; s->n_posinf_e += o->n_posinf_e; s->n_neginf_e += o->n_neginf_e;
  s->n_class_diff += o->n_class_diff;
  if (o->first_class_diff >= 0 &&
      (s->first_class_diff < 0 || o->first_class_diff < s->first_class_diff))
    s->first_class_diff = o->first_class_diff;
}

VGCT_HD void vgct_slice_merge(vgct_slice_acc *VGCT_RESTRICT s,
                              const vgct_slice_acc *VGCT_RESTRICT o) {
  double oe, od;
  double re = vgct_merge_ratio(&s->scale_e, o->scale_e, &oe);
  double rd = vgct_merge_ratio(&s->scale_d, o->scale_d, &od);
  s->s_dd = s->s_dd * (rd * rd) + o->s_dd * (od * od);
  s->s_ee = s->s_ee * (re * re) + o->s_ee * (oe * oe);
  s->s_d = s->s_d * rd + o->s_d * od;
  if (o->max_abs > s->max_abs) s->max_abs = o->max_abs;
  s->n_finite += o->n_finite;
}

/* The slice accumulator of the pairs folded into *s (added for the CUDA
 * engine, [B]).  vgct_slice_update/vgct_slice_merge apply to (scale_e,
 * scale_d, s_dd, s_ee, s_d, max_abs, n_finite) exactly the operations vgct_acc_update/
 * vgct_acc_merge apply to the fields of the same names (same rescaling
 * rule, same order; max_abs is the same maximum), so when every pair of an
 * accumulator belongs to one slice, its projection IS that slice's
 * accumulator, bit for bit, and merges commute with the projection. */
VGCT_HD void vgct_slice_from_acc(const vgct_acc *s, vgct_slice_acc *o) {
  o->scale_e = s->scale_e;
  o->scale_d = s->scale_d;
  o->s_dd = s->s_dd;
  o->s_ee = s->s_ee;
  o->s_d = s->s_d;
  o->max_abs = s->max_abs;
  o->n_finite = s->n_finite;
}

/* ---- finalisation ------------------------------------------------------ */

/* sqrt(s) * scale: the norm of a family (+Inf only when the true norm
 * exceeds DBL_MAX, which only float64 inputs near DBL_MAX reach). */
VGCT_HD double vgct_norm(double s, double scale) { return sqrt(s) * scale; }

/* q * (num/den) for powers of two num, den (scales, in [2^-1000, 2^1023]):
 * one ldexp, so the result over- or underflows only when the true value
 * does (num/den itself may be out of range).  Equal scales (the unscaled
 * update): q itself. */
VGCT_HD double vgct_ldexp_ratio(double q, double num, double den) {
  if (num == den) return q;
  return ldexp(q, ilogb(num) - ilogb(den));
}

/* (s_d / n) * scale_d, the mean of a d family.  s_d below 2^-900 (only a
 * float64 input's cancelling sum reaches it: a sum of values of any other
 * dtype is 0 or >= 2^-149) is divided at 2^600 times its size and brought
 * back with one ldexp, so s_d / n never rounds as a subnormal. */
VGCT_HD double vgct_mean(double s_d, double n, double scale_d) {
  if (s_d != 0.0 && fabs(s_d) < 0x1p-900) return ldexp((s_d * 0x1p600) / n, ilogb(scale_d) - 600);
  return (s_d / n) * scale_d;
}

typedef struct {
  double norm_a, norm_e, norm_d; /* L2 norms over finite pairs        */
  double rel_l2;                 /* NaN encodes "undefined" (zero ref) */
  double cosine;                 /* NaN encodes "undefined"            */
  double mean_diff;              /* NaN when n_finite == 0             */
  int zero_reference;            /* ||e|| == 0                         */
} vgct_derived;

VGCT_HD void vgct_acc_finalize(const vgct_acc *s, vgct_derived *out) {
  double ra = sqrt(s->s_aa), re = sqrt(s->s_ee), rd = sqrt(s->s_dd);
  out->norm_a = vgct_norm(s->s_aa, s->scale_a);
  out->norm_e = vgct_norm(s->s_ee, s->scale_e);
  out->norm_d = vgct_norm(s->s_dd, s->scale_d);
  /* max |e| == 0; with per-family scales the same as s_ee == 0 (the largest
   * |e| contributes >= 1/4 to s_ee) */
  out->zero_reference = !(s->max_abs_ref > 0.0);
  out->rel_l2 = out->zero_reference ? (double)NAN : vgct_ldexp_ratio(rd / re, s->scale_d, s->scale_e);
  if (s->s_aa == 0.0 || s->s_ee == 0.0) {
    out->cosine = (double)NAN;
  } else {
    /* s_ae is relative to scale_a*scale_e: the scales cancel.  s_ae /
       sqrt(s_aa s_ee), so that an identical pair (s_ae == s_aa == s_ee: the
       same products summed in the same order) gives exactly 1: sqrt(RN(s*s))
       is s in binary floating point (no over- or underflow), where s /
       sqrt(s) / sqrt(s) misses 1 by an ulp for about half of all s -- a
       bit-identical output would fail a cosine bar of 1 recorded from other
       identical runs.  The product stays in range for every input (unscaled
       sums of non-float64 values lie within 2^-298..2^320; scaled ones are
       relative to their family's scale); the guard keeps the old two
       divisions for a product out of the normal range all the same. */
    const double prod = s->s_aa * s->s_ee;
    double c = prod >= 0x1p-1022 && prod <= 0x1.fffffffffffffp+1023 ? s->s_ae / sqrt(prod)
                                                                   : s->s_ae / ra / re;
    out->cosine = c > 1.0 ? 1.0 : (c < -1.0 ? -1.0 : c);
  }
  out->mean_diff = s->n_finite ? vgct_mean(s->s_d, (double)s->n_finite, s->scale_d) : (double)NAN;
}

/* Per-slice results (SliceStats), defined from vgct_slice_acc exactly as
 * vgct_acc_finalize defines the whole-tensor ones; NaN encodes "undefined". */
typedef struct {
  double mean_shift;  /* sum(d) / n_finite; NaN when n_finite == 0        */
  double rel_l2;      /* ||d|| / ||e||; NaN when ||e|| == 0 (zero ref)     */
  double max_abs_err; /* max |d|; NaN when n_finite == 0                   */
  double ref_rms;     /* sqrt(sum(e^2) / n_finite); NaN when n_finite == 0 */
} vgct_slice_derived;

VGCT_HD void vgct_slice_finalize(const vgct_slice_acc *s, vgct_slice_derived *out) {
  double nf = (double)s->n_finite;
  out->mean_shift = s->n_finite ? vgct_mean(s->s_d, nf, s->scale_d) : (double)NAN;
  out->rel_l2 = s->s_ee == 0.0 ? (double)NAN
                               : vgct_ldexp_ratio(sqrt(s->s_dd) / sqrt(s->s_ee), s->scale_d, s->scale_e);
  out->max_abs_err = s->n_finite ? s->max_abs : (double)NAN;
  out->ref_rms = s->n_finite ? sqrt(s->s_ee / nf) * s->scale_e : (double)NAN;
}

/* ---- quantiles (numpy's default, method="linear") ----------------------
 * numpy.quantile(x, q, method="linear") (Hyndman & Fan type 7), as
 * numpy/lib/_function_base_impl.py computes it:
 *   h = (n - 1) * q                       (_QuantileMethods['linear'])
 *   lo = floor(h), hi = lo + 1; when h >= n - 1 both are n - 1 (_get_indexes)
 *   gamma = h - floor(h)                  (_get_gamma)
 *   result = _lerp(x_(lo), x_(hi), gamma): a + (b - a)*t, replaced by
 *            b - (b - a)*(1 - t) where t >= 0.5.
 * The expressions are evaluated in the same order, so results match numpy
 * bit for bit given the same order statistics.  Requires n >= 1, 0 <= q <= 1.
 * lo/hi are 0-based ranks among the n finite |d| values (ascending). */
VGCT_HD void vgct_quantile_ranks(int64_t n, double q, int64_t *lo, int64_t *hi, double *gamma) {
  double h = (double)(n - 1) * q;
  double f = floor(h);
  *gamma = h - f;
  if (h >= (double)(n - 1)) {
    *lo = n - 1; *hi = n - 1;
  } else {
    *lo = (int64_t)f; *hi = (int64_t)f + 1;
  }
}

/* Order statistics the reduction's record already decides (docs/metrics.md,
 * "Quantiles", "Ranks the reduction answers"), so that no selection runs for
 * them: x_(r) of the n_finite keys |d_i|, i in F, ascending.
 *   - A finite pair has |d| = 0 exactly when a == e: the float64 difference
 *     of two finite doubles is 0 only for equal values (IEEE 754 subtraction
 *     with gradual underflow; the GPU build passes -ftz=false), and a 64-bit
 *     integer pair's exact |a - e| >= 1 when a != e (vgct_int_pair).  n_unequal
 *     counts the unequal pairs among ALL pairs, so at most n_unequal finite
 *     keys are nonzero and at least z = n_finite - n_unequal are 0: every rank
 *     r < z is 0.  (Equality when every pair is finite.)
 *   - Rank n_finite - 1 is the largest key: max_abs (the same float64 value,
 *     +Inf included).
 * Returns 1 and sets *x when rank r is one of these, else 0 (r outside
 * [0, n_finite) is never answered here).  Typical use: bit-identical outputs
 * and sparse differences (a cache, a mask: fewer than 1% of the pairs
 * differ) have p99 = 0 without a pass. */
VGCT_HD int vgct_rank_known(const vgct_acc *s, int64_t r, double *x) {
  if (r < 0 || r >= s->n_finite) return 0;
  if (r < s->n_finite - s->n_unequal) {
    *x = 0.0;
    return 1;
  }
  if (r == s->n_finite - 1) {
    *x = s->max_abs;
    return 1;
  }
  return 0;
}

/* The zero count vgct_rank_known will use, z = n_finite - n_unequal over n
 * pairs, estimated from a sample of `seen` pairs that held `zeros` finite
 * pairs with |d| = 0 and `nonfinite` non-finite pairs: each non-finite pair
 * is taken as unequal (n_unequal counts NaN against a number; an equal
 * non-finite pair only lowers n_finite), a lower bound of z in expectation,
 * n (zeros - nonfinite) / seen.  The engines' windows (csrc/cpu_select.inc,
 * cuda/select.cu win_record_answers) leave a window to the record when every
 * rank lies below it: a guess that sets speed, never a result. */
VGCT_HD double vgct_zero_count_estimate(int64_t n, int64_t zeros, int64_t nonfinite, int64_t seen) {
  return seen > 0 ? (double)n * (double)(zeros - nonfinite) / (double)seen : 0.0;
}

/* vgct_rank_known over ranks[0..n): vals[j] set and known[j] = 1 for each
 * answered rank, known[j] = 0 for the others; returns how many are left. */
VGCT_HD int vgct_ranks_known(const vgct_acc *s, const int64_t *ranks, int n, double *vals,
                             unsigned char *known) {
  int left = 0;
  for (int j = 0; j < n; ++j) {
    known[j] = (unsigned char)vgct_rank_known(s, ranks[j], &vals[j]);
    left += !known[j];
  }
  return left;
}

/* numpy's _lerp, with the limits at an infinite order statistic made
 * explicit (docs/metrics.md, "Quantiles"): t == 0 or a == b gives a exactly
 * (numpy's formula gives NaN for a == b == +Inf: Inf - Inf); b == +Inf with
 * t > 0 gives +Inf, the limit of a + (b - a)*t (numpy's b - (b - a)*(1 - t)
 * is Inf - Inf).  Keys are |a - e| >= 0, so -Inf never occurs.  Used by the
 * host-side finishing of both engines (csrc/module.c lerp_quantiles). */
VGCT_HD double vgct_lerp(double a, double b, double t) {
  if (t == 0.0 || a == b) return a;
  if (b == (double)INFINITY) return b;
  double diff = b - a;
  return t >= 0.5 ? b - diff * (1.0 - t) : a + diff * t;
}

/* Selection key of a finite pair: the bits of |a - e| as an unsigned
 * integer.  For non-negative doubles (including +Inf from an overflowing
 * float64 difference) the integer order is the numeric order, so exact
 * selection is a radix selection over these keys.  Returns 0 for a
 * non-finite pair (excluded from quantiles). */
VGCT_HD int vgct_absdiff_key(double a, double e, uint64_t *key) {
  if (vgct_class(a) != VGCT_FINITE || vgct_class(e) != VGCT_FINITE) return 0;
  *key = vgct_bits_from_f64(fabs(a - e));
  return 1;
}

/* ---- integer pairs ------------------------------------------------------
 * A pair of integer dtypes with a 64-bit side (vgct_pair_is_int64) is not
 * converted to float64 before it is compared: values and differences above
 * 2^53 would round (2^53 + 1 against 2^53 would be "equal").  From the raw
 * values (vgct_load_int: int64 two's complement bits, or uint64):
 *   unequal   a != e, exactly;
 *   |d|       |a - e| exactly, as a 65-bit magnitude (hi:lo; hi is 1 only
 *             for an int64 against a uint64 of opposite signs), then
 *             correctly rounded to float64 (ad); d is ad with the sign of
 *             a - e;
 *   mismatch  |a - e| > atol + rtol*|e| decided EXACTLY in real arithmetic
 *             (vgct_int_exceeds: a float64 estimate when it is certain, else
 *             an exact expansion sum of error-free products and sums);
 *   excess    |a - e| - (atol + rtol*|e|), rounded (faithfully) to float64;
 *   a, e      the values correctly rounded to float64 (the sums, max_rel,
 *             max_abs_err_actual/_expected, max_abs_expected use these).
 * Everything else is the float64 definition above applied to these
 * quantities (vgct_acc_update_int / vgct_slice_update_int mirror
 * vgct_acc_update / vgct_slice_update line by line; integer pairs take the
 * unscaled update: every square of a rounded int64/uint64 is < 2^128).
 * Quantile keys are the bits of ad: rounding is monotonic, so the order
 * statistics of the rounded |d| are the rounded order statistics of the
 * exact |d|.  Maxima compare the float64 values they report (ad, the
 * excess); among differences that round to the same float64 the lowest
 * flat index wins. */
typedef struct {
  double a, e;    /* the values, correctly rounded                     */
  double d, ad;   /* a - e and |a - e|, correctly rounded               */
  double excess;  /* ad - tol as float64, meaningful when mismatch      */
  int unequal;
  int mismatch;
} vgct_int_cmp;

/* A value from vgct_load_int bits: (neg, magnitude). */
VGCT_HD uint64_t vgct_int_mag(uint64_t raw, int u64, int *neg) {
  *neg = !u64 && (int64_t)raw < 0;
  return *neg ? (uint64_t)0 - raw : raw;
}

/* hi*2^64 + lo (hi in {0, 1}) correctly rounded to float64: for hi = 1,
 * (2^64 + lo)/2 = 2^63 + lo/2 keeps lo's low bit as a sticky bit below the
 * 53 that survive, so one rounding of the 64-bit integer is exact rounding. */
VGCT_HD double vgct_u65_to_f64(uint64_t lo, int hi) {
  if (!hi) return (double)lo;
  uint64_t h = 0x8000000000000000ULL | (lo >> 1) | (lo & 1u);
  return (double)h * 2.0;
}

/* (s, err) with s + err == x + y exactly (Knuth's TwoSum; no overflow here:
 * every term is below 2^67). */
VGCT_HD double vgct_two_sum(double x, double y, double *err) {
  double s = x + y;
  double bb = s - x;
  *err = (x - (s - bb)) + (y - bb);
  return s;
}

/* 1 when D > atol + rtol*E exactly (D = dhi*2^64 + dlo, E < 2^64 integers;
 * rtol, atol finite >= 0), else 0; *excess = D - (atol + rtol*E) rounded.
 * dd, ed are D and E correctly rounded.  A float64 estimate t of the
 * tolerance (3 roundings: relative error < 2^-51 when t >= 2^-900) decides
 * whenever D is clear of it by a 2^-48 margin; otherwise (D within 2^-48 of
 * the tolerance, so t < 2^66) the sign of D - atol - rtol*E is that of an
 * exact sum of 8 float64 terms: D and E split into 32-bit halves (exact),
 * rtol*half = p + err exactly (err by fma; exact also when subnormal, as
 * rtol*half is a multiple of 2^-1074), summed as a nonoverlapping expansion
 * (Shewchuk's Grow-Expansion) whose largest nonzero component has the sign
 * of the sum. */
VGCT_HD int vgct_int_exceeds(uint64_t dlo, int dhi, double dd, uint64_t E, double ed, double rtol,
                             double atol, double *excess) {
  *excess = -1.0;
  if (dlo == 0 && !dhi) return 0;
  const double t = vgct_tol(rtol, atol, ed);
  *excess = dd - t;
  if (t < 0x1p-900) return 1;                  /* D >= 1 */
  if (dd > t * (1.0 + 0x1p-48)) return 1;
  if (!(dd >= t * (1.0 - 0x1p-48))) return 0;  /* also t = +Inf */
  const double eh = (double)(E >> 32) * 0x1p32, el = (double)(E & 0xffffffffULL);
  const double p1 = vgct_mul(rtol, eh), p2 = vgct_mul(rtol, el);
  const double x[8] = {dhi ? 0x1p64 : 0.0, (double)(dlo >> 32) * 0x1p32,
                       (double)(dlo & 0xffffffffULL), -atol, -p1, -fma(rtol, eh, -p1),
                       -p2, -fma(rtol, el, -p2)};
  double h[8];
  int m = 0;
  for (int i = 0; i < 8; ++i) {
    double q = x[i];
    for (int j = 0; j < m; ++j) q = vgct_two_sum(q, h[j], &h[j]);
    h[m++] = q;
  }
  double sum = 0.0;
  int sign = 0;
  for (int j = 0; j < m; ++j) {
    sum += h[j];
    if (h[j] != 0.0) sign = h[j] > 0.0 ? 1 : -1;
  }
  *excess = sum;
  return sign > 0;
}

/* The exact comparison of an integer pair (raw bits from vgct_load_int;
 * ua/ue: the side is uint64). */
VGCT_HD void vgct_int_pair(uint64_t ra, int ua, uint64_t re, int ue, double rtol, double atol,
                           vgct_int_cmp *c) {
  int na, ne;
  const uint64_t ma = vgct_int_mag(ra, ua, &na), me = vgct_int_mag(re, ue, &ne);
  uint64_t lo;
  int hi = 0, a_gt_e;
  if (na == ne) {
    lo = ma >= me ? ma - me : me - ma;
    a_gt_e = na ? ma < me : ma > me;
  } else {
    lo = ma + me;
    hi = lo < ma;
    a_gt_e = !na;
  }
  c->a = ua ? (double)ra : (double)(int64_t)ra;
  c->e = ue ? (double)re : (double)(int64_t)re;
  c->unequal = lo != 0 || hi;
  c->ad = vgct_u65_to_f64(lo, hi);
  c->d = a_gt_e ? c->ad : -c->ad;
  c->mismatch = vgct_int_exceeds(lo, hi, c->ad, me, fabs(c->e), rtol, atol, &c->excess);
}

/* vgct_acc_update for an integer pair (unscaled), on vgct_int_pair's
 * quantities; every integer is finite. */
VGCT_HD void vgct_acc_update_int(vgct_acc *s, const vgct_int_cmp *c, int64_t idx) {
  s->n += 1;
  s->n_finite += 1;
  s->n_unequal += c->unequal;
  const double a = c->a, e = c->e, d = c->d, ad = c->ad, ae = fabs(e);
  if (ad >= s->max_abs && vgct_better(ad, idx, s->max_abs, s->max_abs_i)) {
    s->max_abs = ad; s->max_abs_i = idx; s->max_abs_a = a; s->max_abs_e = e;
  }
  if (e != 0.0) {
    double r = ad / ae;
    if (vgct_better(r, idx, s->max_rel, s->max_rel_i)) { s->max_rel = r; s->max_rel_i = idx; }
  }
  if (c->mismatch && vgct_better(c->excess, idx, s->worst_excess, s->worst_i)) {
    s->worst_excess = c->excess; s->worst_i = idx;
  }
  if (ae > s->max_abs_ref) s->max_abs_ref = ae;
  s->n_mismatch += c->mismatch;
  s->s_aa += a * a; s->s_ee += e * e; s->s_ae += a * e;
  s->s_dd += d * d; s->s_d += d;
}

/* vgct_slice_update for an integer pair (unscaled). */
VGCT_HD void vgct_slice_update_int(vgct_slice_acc *s, const vgct_int_cmp *c) {
  s->n_finite += 1;
  if (c->ad > s->max_abs) s->max_abs = c->ad;
  s->s_dd += c->d * c->d; s->s_ee += c->e * c->e; s->s_d += c->d;
}

/* The pair at (pa, da), (pe, de) through the right definition: the exact
 * integer path for an integer pair, else vgct_load + vgct_acc_update.  The
 * generic (run-time dtype) code of both engines folds pairs with this. */
VGCT_HD void vgct_acc_update_at(vgct_acc *s, const void *pa, int da, const void *pe, int de,
                                int64_t idx, double rtol, double atol, int scaled) {
  if (vgct_pair_is_int64(da, de)) {
    vgct_int_cmp c;
    vgct_int_pair(vgct_load_int(pa, da), da == VGCT_UINT64, vgct_load_int(pe, de),
                  de == VGCT_UINT64, rtol, atol, &c);
    vgct_acc_update_int(s, &c, idx);
  } else {
    vgct_acc_update(s, vgct_load(pa, da), vgct_load(pe, de), idx, rtol, atol, scaled);
  }
}

VGCT_HD void vgct_slice_update_at(vgct_slice_acc *s, const void *pa, int da, const void *pe,
                                  int de, double rtol, double atol, int scaled) {
  if (vgct_pair_is_int64(da, de)) {
    vgct_int_cmp c;
    vgct_int_pair(vgct_load_int(pa, da), da == VGCT_UINT64, vgct_load_int(pe, de),
                  de == VGCT_UINT64, rtol, atol, &c);
    vgct_slice_update_int(s, &c);
  } else {
    vgct_slice_update(s, vgct_load(pa, da), vgct_load(pe, de), scaled);
  }
}

/* vgct_absdiff_key of the pair at (pa, da), (pe, de): 0 for a non-finite
 * pair; an integer pair's key is the bits of its exact |a - e| rounded. */
VGCT_HD int vgct_absdiff_key_at(const void *pa, int da, const void *pe, int de, uint64_t *key) {
  if (vgct_pair_is_int64(da, de)) {
    vgct_int_cmp c;
    vgct_int_pair(vgct_load_int(pa, da), da == VGCT_UINT64, vgct_load_int(pe, de),
                  de == VGCT_UINT64, 0.0, 0.0, &c);
    *key = vgct_bits_from_f64(c.ad);
    return 1;
  }
  return vgct_absdiff_key(vgct_load(pa, da), vgct_load(pe, de), key);
}

/* ---- fingerprint ---------------------------------------------------------
 * fingerprint(x): a 64-bit hash of a tensor's logical contents.  Each element
 * contributes vgct_fp_element(bits, i), where bits are its raw storage bits
 * zero-extended to 64 and i its flat (row-major logical) index; contributions
 * are summed modulo 2^64 (order-free, so any reduction tree gives the same
 * value on CPU and GPU), then vgct_fp_finish mixes in the dtype and shape.
 * Bit patterns, not values: -0.0 and +0.0 differ, as do NaN payloads. */
VGCT_HD uint64_t vgct_mix64(uint64_t z) { /* splitmix64 finaliser (Steele et al. 2014) */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

VGCT_HD uint64_t vgct_fp_element(uint64_t bits, int64_t i) {
  return vgct_mix64(bits ^ vgct_mix64((uint64_t)i + 0x9e3779b97f4a7c15ULL));
}

VGCT_HD uint64_t vgct_fp_finish(uint64_t sum, int dtype, int ndim, const int64_t *shape) {
  uint64_t h = vgct_mix64(sum ^ (0x5851f42d4c957f2dULL * (uint64_t)(dtype + 1)));
  h = vgct_mix64(h ^ (uint64_t)ndim);
  for (int k = 0; k < ndim; ++k) h = vgct_mix64(h ^ (uint64_t)shape[k]);
  return h;
}

#endif /* VGCT_STATS_H_ */
