/*
 * module_args.h -- the interface between the two halves of vgct_ext._C (private to csrc/).
 *
 *   module_args.c  argument parsing and Python objects: the GIL and the interrupt poll around
 *                  engine calls, engine errors -> exceptions, the checks of every argument
 *                  (tolerances, quantiles, dim, stream, dtype overrides, shapes, raw records),
 *                  the DLPack import of a pair (via bridge.h), and the result dict of compare()
 *                  built from the vgct_stats.h accumulators;
 *   module.c       the module's methods (compare, fingerprint, the sharded steps, build_info,
 *                  device_props), their docstrings, the method table and PyInit__C.
 *
 * Every function here returns NULL / -1 (or -2 where stated) with exactly one Python exception
 * set on failure, and holds nothing on a failure path; its contract is the block comment above
 * its definition in module_args.c.  The names carry the prefix vgpy_ (the symbols are hidden:
 * setup.py compiles with -fvisibility=hidden).
 */
#ifndef VGCT_MODULE_ARGS_H_
#define VGCT_MODULE_ARGS_H_

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "bridge.h"
#include "vgct_engine.h"

#define ERRLEN 512

/* RuntimeError message when a CUDA tensor reaches a CPU-only build. */
#define VGPY_NO_CUDA "vgct_ext was built without CUDA; rebuild with nvcc available"

/* ---- engine calls ------------------------------------------------------- */

extern int vgpy_max_threads;           /* set once by PyInit__C (VGCT_NUM_THREADS / CPU count) */
extern PyObject *vgpy_input_changed;   /* vgct_ext._C.InputChangedError, created by PyInit__C */
int vgpy_pick_threads(int64_t n);
void vgpy_raise_engine(int rc, const char *msg);
void vgpy_nogil_begin(vgct_params *p, PyThreadState **ts);
/* A method of _C run in the engines' floating-point environment (vgct_fpenv.h),
 * the caller's restored on return, on every path. */
typedef PyObject *(*vgpy_method_kw)(PyObject *, PyObject *, PyObject *);
typedef PyObject *(*vgpy_method_1)(PyObject *, PyObject *);
PyObject *vgpy_in_fpenv_kw(vgpy_method_kw fn, PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *vgpy_in_fpenv_1(vgpy_method_1 fn, PyObject *self, PyObject *arg);
/* Before computing after Python code may have run inside the method (a
 * generator of records, an argument's __float__): what that code changed in
 * the floating-point mode becomes the caller's (restored on return), and the
 * computation runs in the default (vgct_fpenv_sync). */
void vgpy_fpenv_sync(void);
void vgpy_nogil_end(vgct_params *p, PyThreadState **ts);
vgct_slice_acc *vgpy_alloc_slices(int64_t count, long dim);

/* ---- arguments ---------------------------------------------------------- */

int vgpy_check_tol(const char *name, double *x);
int vgpy_parse_dtype_override(const char *argname, PyObject *o);
int vgpy_parse_stream(PyObject *o, uintptr_t *out);
int vgpy_check_devices(const vgct_device *da, const vgct_device *de);
int vgpy_parse_quantiles(PyObject *quantiles, double *qs, int *nq);
int vgpy_parse_dim(PyObject *dim_obj, int *has, long *dim);
int vgpy_check_dim(const vgct_view *a, long *dim);
int vgpy_open_pair(PyObject *actual, PyObject *expected, PyObject *stream_obj, int producer,
                   PyObject *dta_obj, PyObject *dte_obj, vgct_import *ia, vgct_import *ie,
                   uintptr_t *stream);
/* _C.PRODUCER_STREAM (made at module init): compare's stream argument that
 * leaves the stream to the inputs' producer (vgpy_open_pair's `producer`). */
extern PyObject *vgpy_producer_stream;
int vgpy_read_record(PyObject *o, const char *what, size_t size, void *out);
int vgpy_parse_shape(PyObject *o, const char *what, vgct_view *v);

/* ---- results ------------------------------------------------------------ */

/* What a result describes besides the accumulators: the logical shape, the
 * dtypes and the device.  compare() takes it from the imported views,
 * finalize_raw() ([E], sharded comparisons) from its arguments, so both build
 * their dict with the one vgpy_result_dict(). */
typedef struct {
  vgct_view v; /* ndim, shape, device_type, device_id used (data and strides unused) */
  int dta, dte;
} vgpy_result_meta;

/* The interned key strings of vgpy_result_dict (and the dtype/device names it puts):
 * made once by PyInit__C, before any result is built; 0, or -1 with an exception set. */
int vgpy_init_keys(void);
int vgpy_put(PyObject *d, const char *key, PyObject *val);
PyObject *vgpy_shape_tuple(const vgct_view *v);
PyObject *vgpy_acc_bytes(const vgct_acc *s);
void vgpy_meta_from_views(const vgct_view *a, const vgct_view *e, vgpy_result_meta *m);
void vgpy_lerp_quantiles(int64_t nf, int nq, const double *qs, const double *vals, double *qv);
PyObject *vgpy_result_dict(const vgpy_result_meta *m, const vgct_params *p,
                           const vgct_acc *s, int nq, const double *qs, const double *qv,
                           const vgct_slice_acc *sl);

#endif /* VGCT_MODULE_ARGS_H_ */
