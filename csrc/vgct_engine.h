/*
 * vgct_engine.h -- the C interface between the Python bridge (csrc/module.c,
 * csrc/bridge.c) and the two engines: the CPU core (csrc/cpu_engine.c) and the
 * CUDA kernels (the cuda/ kernels, compiled only when nvcc is found; VGCT_HAVE_CUDA).
 *
 * The bridge turns each DLPack tensor into a vgct_view (no copy) and checks
 * everything the engines rely on: same logical shape, same device, supported
 * dtypes, ndim <= VGCT_MAX_NDIM, strides filled in (compact row-major when
 * the producer gave NULL), data pointer already advanced by byte_offset.
 * Engines only compute; they never touch Python objects and run with the GIL
 * released.
 *
 * Conventions shared by every entry point:
 *   - the "flat index" of an element is its row-major index in the LOGICAL
 *     shape (what numpy's ravel() would give), whatever the strides;
 *   - int64 everywhere for sizes, strides and indices (> 2^31 elements);
 *   - return 0 on success; on failure return a VGCT_E* code and write a
 *     NUL-terminated message (which call failed and why) into err[errlen].
 */
#ifndef VGCT_ENGINE_H_
#define VGCT_ENGINE_H_

#include <stddef.h>
#include <stdint.h>
#include "vgct_dtypes.h"
#include "vgct_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VGCT_MAX_NDIM 32

/* error codes (the bridge maps them to Python exceptions) */
#define VGCT_OK 0
#define VGCT_ENOMEM 1   /* MemoryError                          */
#define VGCT_EVALUE 2   /* ValueError: bad argument             */
#define VGCT_ECUDA 3    /* RuntimeError: a CUDA call failed     */
#define VGCT_EINTERNAL 4
#define VGCT_EINTR 5    /* stopped: params->interrupt returned nonzero (its
                           exception, e.g. KeyboardInterrupt, is pending)  */
#define VGCT_ECHANGED 6 /* an input changed while it was read (counts of two
                           passes over the same pairs differ)             */

typedef struct {
  const char *data;                /* first element (byte_offset applied); may be
                                      NULL when numel == 0                     */
  int ndim;
  int64_t shape[VGCT_MAX_NDIM];
  int64_t strides[VGCT_MAX_NDIM];  /* in ELEMENTS, may be 0 or negative      */
  int dtype;                       /* vgct_dtype                              */
  int device_type;                 /* DLPack DLDeviceType (kDLCPU, kDLCUDA...) */
  int device_id;
} vgct_view;

struct vgct_cpu_presel; /* vgct_cpu_presel_new, below */

typedef struct {
  double rtol, atol;
  int dim;      /* axis for per-slice statistics, or -1 for none         */
  int nthreads; /* CPU only: upper bound on worker threads (>= 1)        */
  /* Cancellation: when non-NULL, engines call interrupt(interrupt_ctx) from
   * the CALLING thread only (the CPU engine's thread 0 between tiles, at most
   * every VGCT_POLL_MS; the CUDA engine between launches) and stop, freeing
   * everything, with VGCT_EINTR when it returns nonzero.  module.c passes a
   * function that takes the GIL back and runs PyErr_CheckSignals. */
  int (*interrupt)(void *ctx);
  void *interrupt_ctx;
  /* select only: the n_finite of the reduction of the same inputs, or -1.
   * A different count of finite pairs in the selection's first pass means
   * the inputs changed in between: VGCT_ECHANGED. */
  int64_t expect_finite;
  /* CPU only (the CUDA engine ignores it): key windows for the exact
   * quantiles, read in the reduction's own pass (vgct_cpu_presel_new). */
  struct vgct_cpu_presel *presel;
} vgct_params;


#define VGCT_POLL_MS 10

/* 1 when the caller asked to stop (p->interrupt returned nonzero).  The CUDA
 * engine asks between launches, after a stream synchronization (the host
 * has nothing in flight then), calling thread only. */
static inline int vgct_interrupted(const vgct_params *p) {
  return p->interrupt != NULL && p->interrupt(p->interrupt_ctx) != 0;
}

/* params with no tolerance, no slices, one thread, no interrupt. */
static inline void vgct_params_init(vgct_params *p) {
  p->rtol = 0.0; p->atol = 0.0; p->dim = -1; p->nthreads = 1;
  p->interrupt = NULL; p->interrupt_ctx = NULL; p->expect_finite = -1;
  p->presel = NULL;
}

/* Element count.  0 as soon as a dim is 0, before any product is formed:
 * the other dims of an empty tensor may multiply past int64 (the bridge
 * checks that the count of a non-empty tensor fits). */
static inline int64_t vgct_numel(const vgct_view *v) {
  for (int i = 0; i < v->ndim; ++i)
    if (v->shape[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < v->ndim; ++i) n *= v->shape[i];
  return n;
}

/* 1 when the scaled (overflow-safe) update is needed: an input is float64. */
static inline int vgct_needs_scaling(const vgct_view *a, const vgct_view *e) {
  return a->dtype == VGCT_FLOAT64 || e->dtype == VGCT_FLOAT64;
}

/* ---- CPU engine (csrc/cpu_engine.c) ----------------------------------- */

/* One pass over all pairs: the whole-tensor accumulator `out`, and when
 * p->dim >= 0 also one vgct_slice_acc per index along that axis in `slices`
 * (caller-allocated, a->shape[p->dim] entries).  Deterministic: the result
 * does not depend on p->nthreads. */
int vgct_cpu_reduce(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                    vgct_acc *out, vgct_slice_acc *slices, char *err, size_t errlen);

/* Exact order statistics of the |a_i - e_i| over finite pairs: for each of
 * the nranks 0-based ranks (each < out->n_finite of the same inputs, any
 * order, duplicates allowed) write the value of that rank in ascending order
 * into values[].  Exact (radix selection over the float64 bit patterns), extra
 * memory bounded independently of n (O(2^16) counters + a bounded candidate
 * buffer), deterministic.  With p->presel filled by vgct_cpu_reduce of the
 * same inputs and p->expect_finite its n_finite, the ranks inside the
 * windows are finished without a pass (vgct_cpu_presel_new). */
int vgct_cpu_select(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                    const int64_t *ranks, int nranks, double *values,
                    char *err, size_t errlen);

/* The exact quantiles in (usually) no pass of their own.  Before the
 * reduction, vgct_cpu_presel_new reads a sample of ~n/256 pairs (1024..256K:
 * n/16, at least 1024, below 2^18 pairs; evenly spaced tiles of 512, or 32-36
 * chunks below 2^18 pairs) and, for the quantiles qs[0..nq), predicts key windows
 * [lo, hi] (vgct_absdiff_key order) around their ranks, with generous
 * binomial margins, plus the values that recur often inside a window (ties:
 * bf16 differences, identical inputs).  Given as params->presel to
 * vgct_cpu_reduce, the reduction's pass also counts, per window, the keys
 * below lo and equal to each such value, and stores the other keys inside
 * the window (a buffer of at most VGCT_PRESEL_MAX_KEYS keys in all; a window
 * that would overflow it is abandoned).  vgct_cpu_select with the same
 * params then finishes every rank that fell inside a complete window in
 * memory, and the others by its own passes: exact either way.  Returns NULL
 * (no windows: the plain passes) for n < VGCT_PRESEL_MIN_N, when the sample
 * holds too few finite pairs, when every window is the key 0 alone (an
 * identical pair: the caller answers those ranks from the reduction's zero
 * count, vgct_rank_known, and selects only what that leaves), or when memory
 * is short.  Free with
 * vgct_cpu_presel_free (NULL is fine).  No GIL needed; reads the inputs. */
#define VGCT_PRESEL_MIN_N ((int64_t)1 << 12) /* 4096 pairs (docs/metrics.md) */
#define VGCT_PRESEL_MAX_KEYS ((int64_t)1 << 22) /* 32 MiB */
struct vgct_cpu_presel;
struct vgct_cpu_presel *vgct_cpu_presel_new(const vgct_view *a, const vgct_view *e,
                                            const double *qs, int nq);
void vgct_cpu_presel_free(struct vgct_cpu_presel *s);

/* Histogram of selection keys, for the distributed radix selection of
 * compare_sharded ([E]; vgct_ext/core/sharded.py).  For every finite pair, its key
 * k (vgct_absdiff_key) is counted when its top `prefix_bits` bits equal one
 * of the `nprefix` prefixes (prefix_bits == 0: every key, prefixes == {0}),
 * in bin (k >> (64 - prefix_bits - width)) & (2^width - 1) of that prefix's
 * row: the next `width` bits are the digit.  counts: caller-allocated
 * int64[nprefix << width], row g for prefixes[g], OVERWRITTEN with exact
 * counts (summed over ranks, they are the histogram of the whole tensor).
 * Requires 0 <= prefix_bits, 1 <= width <= VGCT_HIST_MAX_WIDTH,
 * prefix_bits + width <= 64, 1 <= nprefix <= VGCT_HIST_MAX_PREFIXES, distinct
 * prefixes < 2^prefix_bits.  Deterministic; extra memory bounded
 * (per-thread counters, at most 64 MiB in all). */
#define VGCT_HIST_MAX_PREFIXES 128
#define VGCT_HIST_MAX_WIDTH 16
int vgct_cpu_histogram(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                       const uint64_t *prefixes, int nprefix, int prefix_bits, int width,
                       int64_t *counts, char *err, size_t errlen);

/* 64-bit content hash of one tensor (definition: vgct_stats.h, "fingerprint"). */
int vgct_cpu_fingerprint(const vgct_view *x, int nthreads, uint64_t *out, char *err, size_t errlen);

/* ---- CUDA engine (the cuda/ kernels), only when built with VGCT_HAVE_CUDA ------- */

/* Same contracts as the CPU functions, for views on one CUDA device
 * (device_id), enqueued on `stream` (a cudaStream_t as an integer, as the
 * DLPack spec numbers them: 1 = the legacy default stream (cudaStreamLegacy),
 * 2 = the per-thread default stream (cudaStreamPerThread), else a stream
 * handle; never 0).  The caller's current device is restored.  Results
 * are copied to the host once per call (the only synchronization is on that
 * stream). */
int vgct_cuda_reduce(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                     uintptr_t stream, vgct_acc *out, vgct_slice_acc *slices,
                     char *err, size_t errlen);
int vgct_cuda_select(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                     uintptr_t stream, const int64_t *ranks, int nranks, double *values,
                     char *err, size_t errlen);

/* compare() on one CUDA device in one call: vgct_cuda_reduce into out (and
 * slices), then, when out->n_finite > 0, the exact order statistics of the
 * 2*nq ranks of vgct_quantile_ranks(out->n_finite, qs[i]) (lower rank of
 * quantile i at values[2i], upper at values[2i+1]) -- as vgct_cuda_select
 * with expect_finite = out->n_finite, except that the ranks the reduction's
 * record decides (vgct_rank_known: below its zero count, the largest) are
 * answered from it with no selection.  The device stays held throughout, so
 * the quantiles' key windows can be read by the reduction's own pass
 * (cuda/select.cu, vgct_cuda_compare).  0 <= nq <= VGCT_MAX_QUANTILES. */
#define VGCT_MAX_QUANTILES 64
int vgct_cuda_compare(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                      uintptr_t stream, const double *qs, int nq, vgct_acc *out,
                      vgct_slice_acc *slices, double *values, char *err, size_t errlen);

int vgct_cuda_fingerprint(const vgct_view *x, uintptr_t stream, uint64_t *out,
                          char *err, size_t errlen);

/* vgct_cpu_histogram's contract for views on one CUDA device, enqueued on
 * `stream`; `counts` is HOST memory (nprefix << width int64), filled when the
 * call returns.  Needed by compare_sharded on CUDA tensors ([E]), which asks
 * for digits of width <= 15 there (one 32768-bin row of 32-bit counters per
 * prefix fits a block's shared memory), at most 2 * VGCT_MAX_QUANTILES
 * prefixes per call, usually 1 or 2.  Defined in cuda/histogram.cu. */
int vgct_cuda_histogram(const vgct_view *a, const vgct_view *e, const vgct_params *p,
                        uintptr_t stream, const uint64_t *prefixes, int nprefix,
                        int prefix_bits, int width, int64_t *counts, char *err, size_t errlen);

/* Build/run-time facts for build_info(): never fails; a machine without a
 * driver or GPU reports driver_version 0 / device_count 0. */
typedef struct {
  int runtime_version; /* cudaRuntimeGetVersion, e.g. 13000 */
  int driver_version;  /* cudaDriverGetVersion, 0 without a driver */
  int device_count;    /* 0 without a GPU */
  char archs[128];     /* the -gencode list the kernels were built for */
} vgct_cuda_info;
void vgct_cuda_get_info(vgct_cuda_info *info);

/* Name and compute capability of a device, for reports; 0 on success. */
int vgct_cuda_device_props(int device, char *name, size_t namelen, int *major, int *minor);

#ifdef __cplusplus
}
#endif
#endif /* VGCT_ENGINE_H_ */
