/*
 * vgct_dtypes.h -- the element types vgct_ext reads, and their loaders.
 *
 * This header is the ONE place where a stored element becomes a double.  It is
 * included by the CPU core (csrc/, C11) and by the CUDA kernels (cuda/, nvcc):
 * every loader is `VGCT_HD` (host+device inline), works on raw bits, and never
 * rounds: every supported type converts to float64 exactly (float64 holds every
 * float16, bfloat16, float32, float8 value, and every integer up to 2^53;
 * int64/uint64 values beyond 2^53 are rounded to nearest, the same as numpy's
 * `astype(np.float64)`; a pair of integers with a 64-bit side is compared
 * from the raw values instead: vgct_load_int here, vgct_int_pair in
 * vgct_stats.h).
 *
 * Encodings (sources):
 *   float16        IEEE 754-2008 binary16 (1-5-10, bias 15).
 *   bfloat16       upper 16 bits of an IEEE binary32 (1-8-7, bias 127).
 *   float8_e4m3fn  OCP 8-bit FP spec v1.0 "E4M3": 1-4-3, bias 7, no infinities,
 *                  S.1111.111 is NaN, max finite 448.
 *   float8_e5m2    OCP 8-bit FP spec v1.0 "E5M2": 1-5-2, bias 15, IEEE-like
 *                  (S.11111.00 is Inf, S.11111.xx with xx != 0 is NaN).
 * DLPack codes for each (csrc/dlpack.h): see vgct_dtype_from_dlpack().
 */
#ifndef VGCT_DTYPES_H_
#define VGCT_DTYPES_H_

#include <stdint.h>
#include <string.h>
#include <math.h>

#ifndef VGCT_HD
#ifdef __CUDACC__
#define VGCT_HD static __host__ __device__ __forceinline__
#else
#define VGCT_HD static inline
#endif
#endif

/* C99 restrict in C, __restrict__ in CUDA C++ (merges of two records that
 * never alias: the compiler may then load both before storing any field). */
#ifdef __cplusplus
#define VGCT_RESTRICT __restrict__
#else
#define VGCT_RESTRICT restrict
#endif

typedef enum {
  VGCT_BOOL = 0,
  VGCT_INT8,
  VGCT_INT16,
  VGCT_INT32,
  VGCT_INT64,
  VGCT_UINT8,
  VGCT_FLOAT16,
  VGCT_BFLOAT16,
  VGCT_FLOAT32,
  VGCT_FLOAT64,
  VGCT_FLOAT8_E4M3FN,
  VGCT_FLOAT8_E5M2,
  VGCT_UINT16, /* appended after the float8 types: the codes before them (which */
  VGCT_UINT32, /* the fingerprint mixes in) are unchanged                       */
  VGCT_UINT64,
  VGCT_NUM_DTYPES
} vgct_dtype;

/* Names as numpy / torch spell them (used in messages and PairedStats). */
static const char *const vgct_dtype_names[VGCT_NUM_DTYPES] = {
    "bool",    "int8",     "int16",   "int32",   "int64",         "uint8",
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
    "uint16",  "uint32",   "uint64"};

static const int vgct_dtype_itemsize[VGCT_NUM_DTYPES] = {1, 1, 2, 4, 8, 1,
                                                         2, 2, 4, 8, 1, 1, 2, 4, 8};

/* 1 for the integer dtypes (bool included: 0 or 1), 0 for the floating ones. */
VGCT_HD int vgct_dtype_is_int(int dt) {
  return dt == VGCT_BOOL || dt == VGCT_INT8 || dt == VGCT_INT16 || dt == VGCT_INT32 ||
         dt == VGCT_INT64 || dt == VGCT_UINT8 || dt == VGCT_UINT16 || dt == VGCT_UINT32 ||
         dt == VGCT_UINT64;
}

/* 1 when a pair of dtypes is compared in exact integer arithmetic (the
 * "integer pair" of docs/metrics.md): both are integers and one is 64-bit,
 * so that a value or a difference may exceed 2^53.  Every other integer pair
 * is exact in float64 already (values below 2^32, differences below 2^33);
 * a pair with a floating side converts the integer to float64 (rounded to
 * nearest above 2^53, as NumPy's int64 + float64 -> float64 promotion). */
VGCT_HD int vgct_pair_is_int64(int da, int de) {
  return vgct_dtype_is_int(da) && vgct_dtype_is_int(de) &&
         (da == VGCT_INT64 || da == VGCT_UINT64 || de == VGCT_INT64 || de == VGCT_UINT64);
}

/* Map a DLPack dtype (code, bits, lanes) to a vgct_dtype; -1 if unsupported.
 * DLPack spec: lanes must be 1 for a scalar array; bool is kDLBool with 8 bits. */
static inline int vgct_dtype_from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes) {
  if (lanes != 1) return -1;
  switch (code) {
    case 0: /* kDLInt */
      return bits == 8 ? VGCT_INT8 : bits == 16 ? VGCT_INT16 : bits == 32 ? VGCT_INT32
           : bits == 64 ? VGCT_INT64 : -1;
    case 1: /* kDLUInt */
      return bits == 8 ? VGCT_UINT8 : bits == 16 ? VGCT_UINT16 : bits == 32 ? VGCT_UINT32
           : bits == 64 ? VGCT_UINT64 : -1;
    case 2: /* kDLFloat */
      return bits == 16 ? VGCT_FLOAT16 : bits == 32 ? VGCT_FLOAT32 : bits == 64 ? VGCT_FLOAT64 : -1;
    case 4: /* kDLBfloat */
      return bits == 16 ? VGCT_BFLOAT16 : -1;
    case 6: /* kDLBool */
      return bits == 8 ? VGCT_BOOL : -1;
    case 10: /* kDLFloat8_e4m3fn */
      return bits == 8 ? VGCT_FLOAT8_E4M3FN : -1;
    case 12: /* kDLFloat8_e5m2 */
      return bits == 8 ? VGCT_FLOAT8_E5M2 : -1;
    default:
      return -1;
  }
}

/* ---- bit casts (memcpy is the C11-defined way; nvcc has intrinsics) ---- */
VGCT_HD double vgct_f64_from_bits(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)b);
#else
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
#endif
}

VGCT_HD uint64_t vgct_bits_from_f64(double d) {
#ifdef __CUDA_ARCH__
  return (uint64_t)__double_as_longlong(d);
#else
  uint64_t b;
  memcpy(&b, &d, sizeof b);
  return b;
#endif
}

VGCT_HD uint32_t vgct_bits_from_f32(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
#endif
}

VGCT_HD float vgct_f32_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
#endif
}

/* A small binary float with `ebits` exponent bits, `mbits` mantissa bits and
 * exponent bias `bias`, given as its unsigned magnitude bits (sign stripped),
 * whose exponent field is neither all-ones nor handled by the caller.  Exact. */
VGCT_HD double vgct_minifloat_mag(uint32_t mag, int mbits, int bias) {
  uint32_t e = mag >> mbits;
  uint32_t m = mag & ((1u << mbits) - 1u);
  if (e == 0) {
    /* subnormal: m * 2^(1 - bias - mbits); a power-of-two product is exact */
    return (double)m * vgct_f64_from_bits((uint64_t)(1023 + 1 - bias - mbits) << 52);
  }
  return vgct_f64_from_bits(((uint64_t)((int)e - bias + 1023) << 52) |
                            ((uint64_t)m << (52 - mbits)));
}

VGCT_HD double vgct_f16_to_f64(uint16_t h) {
  uint32_t mag = h & 0x7fffu;
  double v;
  if ((mag >> 10) == 0x1fu) v = (mag & 0x3ffu) ? (double)NAN : (double)INFINITY;
  else v = vgct_minifloat_mag(mag, 10, 15);
  return (h & 0x8000u) ? -v : v;
}

/* THE bfloat16 -> float32 conversion: a bfloat16 is the upper half of a
 * float32's bits.  Here the element of a 32-bit word holding two
 * (little-endian: element 0 in the low half), taken by a shift (low) or a
 * mask (high): the scalar loaders pass one element as the low half; the CUDA
 * reduce's vector path (cuda/reduce.cu vg_fold_vec) passes the vector's words,
 * which ptxas sm_90 folds in fewer instructions than a 16-bit extraction and
 * a shift.  Checked on every bfloat16 pattern in both halves against the
 * format's fields (tests/.../cuda_host_check.cu). */
VGCT_HD float vgct_bf16_of_word(uint32_t w, int high) {
  return vgct_f32_from_bits(high ? (w & 0xffff0000u) : (w << 16));
}

VGCT_HD double vgct_bf16_to_f64(uint16_t h) { return (double)vgct_bf16_of_word(h, 0); }

VGCT_HD double vgct_e4m3fn_to_f64(uint8_t x) {
  uint32_t mag = x & 0x7fu;
  double v = (mag == 0x7fu) ? (double)NAN : vgct_minifloat_mag(mag, 3, 7);
  return (x & 0x80u) ? -v : v;
}

VGCT_HD double vgct_e5m2_to_f64(uint8_t x) {
  uint32_t mag = x & 0x7fu;
  double v;
  if ((mag >> 2) == 0x1fu) v = (mag & 0x3u) ? (double)NAN : (double)INFINITY;
  else v = vgct_minifloat_mag(mag, 2, 15);
  return (x & 0x80u) ? -v : v;
}

/* Typed loaders: read one element at an address of any alignment (memcpy on
 * the host; on the device the caller guarantees natural alignment of the
 * element itself, which DLPack data + byte_offset + k*itemsize always has
 * unless the producer is malformed; vectorized wide loads are the kernels'
 * business, not the loaders'). */
#ifdef __CUDA_ARCH__
#define VGCT_RD(T, p) (*(const T *)(p))
#else
#define VGCT_RD(T, p) vgct_rd_##T(p)
#endif

#ifndef __CUDA_ARCH__
#define VGCT_DEF_RD(T)                      \
  static inline T vgct_rd_##T(const void *p) { \
    T v;                                    \
    memcpy(&v, p, sizeof v);                \
    return v;                               \
  }
VGCT_DEF_RD(uint8_t)
VGCT_DEF_RD(int8_t)
VGCT_DEF_RD(int16_t)
VGCT_DEF_RD(uint16_t)
VGCT_DEF_RD(int32_t)
VGCT_DEF_RD(uint32_t)
VGCT_DEF_RD(int64_t)
VGCT_DEF_RD(uint64_t)
VGCT_DEF_RD(float)
VGCT_DEF_RD(double)
#undef VGCT_DEF_RD
#endif

/* Convert the element at address p of type dt to float64 (exactly, see top). */
VGCT_HD double vgct_load(const void *p, int dt) {
  switch (dt) {
    case VGCT_BOOL: return VGCT_RD(uint8_t, p) ? 1.0 : 0.0;
    case VGCT_INT8: return (double)VGCT_RD(int8_t, p);
    case VGCT_INT16: return (double)VGCT_RD(int16_t, p);
    case VGCT_INT32: return (double)VGCT_RD(int32_t, p);
    case VGCT_INT64: return (double)VGCT_RD(int64_t, p);
    case VGCT_UINT8: return (double)VGCT_RD(uint8_t, p);
    case VGCT_FLOAT16: return vgct_f16_to_f64(VGCT_RD(uint16_t, p));
    case VGCT_BFLOAT16: return vgct_bf16_to_f64(VGCT_RD(uint16_t, p));
    case VGCT_FLOAT32: return (double)VGCT_RD(float, p);
    case VGCT_FLOAT64: return VGCT_RD(double, p);
    case VGCT_FLOAT8_E4M3FN: return vgct_e4m3fn_to_f64(VGCT_RD(uint8_t, p));
    case VGCT_FLOAT8_E5M2: return vgct_e5m2_to_f64(VGCT_RD(uint8_t, p));
    case VGCT_UINT16: return (double)VGCT_RD(uint16_t, p);
    case VGCT_UINT32: return (double)VGCT_RD(uint32_t, p);
    case VGCT_UINT64: return (double)VGCT_RD(uint64_t, p);
    default: return (double)NAN;
  }
}

/* The element at p of an integer dtype dt as 64 raw bits, for the exact
 * integer path (vgct_stats.h, vgct_int_pair): the value itself for uint64,
 * else the value sign- or zero-extended to int64 (every integer dtype but
 * uint64 fits int64), as two's complement bits. */
VGCT_HD uint64_t vgct_load_int(const void *p, int dt) {
  switch (dt) {
    case VGCT_BOOL: return VGCT_RD(uint8_t, p) ? 1u : 0u;
    case VGCT_INT8: return (uint64_t)(int64_t)VGCT_RD(int8_t, p);
    case VGCT_INT16: return (uint64_t)(int64_t)VGCT_RD(int16_t, p);
    case VGCT_INT32: return (uint64_t)(int64_t)VGCT_RD(int32_t, p);
    case VGCT_INT64: return (uint64_t)VGCT_RD(int64_t, p);
    case VGCT_UINT8: return (uint64_t)VGCT_RD(uint8_t, p);
    case VGCT_UINT16: return (uint64_t)VGCT_RD(uint16_t, p);
    case VGCT_UINT32: return (uint64_t)VGCT_RD(uint32_t, p);
    case VGCT_UINT64: return VGCT_RD(uint64_t, p);
    default: return 0u;
  }
}

/* The float32 value of a float16, bfloat16 or float32 element at p (binary32
 * holds every value of the three exactly, so this equals (float)vgct_load(p,
 * dt)).  Used by the CUDA reduce's narrow-dtype fast path, which makes its
 * decisions in float32 (cuda/vgct_cuda_internal.cuh, vg_fast_chunk); any
 * other dtype is a caller error (read as float32). */
VGCT_HD float vgct_load_f32(const void *p, int dt) {
  switch (dt) {
    case VGCT_BFLOAT16: return vgct_bf16_of_word(VGCT_RD(uint16_t, p), 0);
#ifdef __CUDA_ARCH__
    case VGCT_FLOAT16: {
      float f;
      asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(*(const unsigned short *)p));
      return f;
    }
#else
    case VGCT_FLOAT16: return (float)vgct_f16_to_f64(VGCT_RD(uint16_t, p));
#endif
    default: return VGCT_RD(float, p);
  }
}

#endif /* VGCT_DTYPES_H_ */
