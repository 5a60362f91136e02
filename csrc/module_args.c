/*
 * module_args.c -- vgct_ext._C, first half: argument parsing and Python objects.
 *
 * What the methods of module.c share (interface: module_args.h):
 *   - engine calls: threads per call (vgpy_pick_threads), the GIL released with the
 *     Ctrl-C poll wired in (vgpy_nogil_begin/end, poll_signals), engine error codes ->
 *     one specific exception (vgpy_raise_engine), slice accumulators (vgpy_alloc_slices);
 *   - arguments: rtol/atol, quantiles, dim, stream ([PY] array-API convention), dtype
 *     overrides, devices, shapes, raw records -- each refused with an exception naming the
 *     argument, what it got and what was expected; the two inputs imported zero-copy through
 *     the DLPack bridge (vgpy_open_pair, bridge.h);
 *   - results: the dict of compare() / finalize_raw() (vgpy_result_dict), the PairedStats
 *     field names as keys, NumPy arrays for the slices.
 *
 * Definitions of vgct_stats.h it applies (it computes none of its own): vgct_acc_finalize
 * -> vgct_derived (rel_l2, cosine, norms, mean_diff), vgct_slice_finalize ->
 * vgct_slice_derived (mean_shift, rel_l2, max_abs_err, ref_rms), and the quantile rule
 * vgct_quantile_ranks + vgct_lerp (numpy's "linear" method) in vgpy_lerp_quantiles.
 * docs/metrics.md states the same definitions in prose.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* one NumPy C-API table for the extension: imported by PyInit__C (module.c) */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL vgct_PyArray_API
#define NO_IMPORT_ARRAY
#include <numpy/arrayobject.h>

#include "module_args.h"
#include "vgct_fpenv.h"

/* Worker threads the CPU engine may use: VGCT_NUM_THREADS, else the online
 * CPU count; set once at import. */
int vgpy_max_threads = 1;

/* Threads for n pairs: one per 64 Ki elements, at most vgpy_max_threads. */
int vgpy_pick_threads(int64_t n) {
  int64_t t = n >> 16;
  if (t < 1) t = 1;
  return t < vgpy_max_threads ? (int)t : vgpy_max_threads;
}

/* vgct_ext._C.InputChangedError (a RuntimeError): an input was written
 * while the engines read it (VGCT_ECHANGED). */
PyObject *vgpy_input_changed = NULL;

/* Engine error code -> Python exception.  VGCT_EINTR: the interrupt poll
 * (poll_signals) left the signal handler's exception (KeyboardInterrupt)
 * pending; it is kept as is. */
void vgpy_raise_engine(int rc, const char *msg) {
  if (rc == VGCT_EINTR) {
    if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
    return;
  }
  PyObject *type = rc == VGCT_ENOMEM ? PyExc_MemoryError
                 : rc == VGCT_EVALUE ? PyExc_ValueError
                 : rc == VGCT_ECHANGED ? vgpy_input_changed
                 : PyExc_RuntimeError;
  PyErr_Format(type, "%s", msg[0] ? msg : "vgct_ext engine failed (no message)");
}

/* ---- the floating-point environment (vgct_fpenv.h) ------------------------
 * The environment of the innermost vgpy_in_fpenv_* call on this thread (NULL
 * outside one): the Ctrl-C poll and vgpy_nogil_begin reach it here. */
static _Thread_local vgct_fpenv *vgpy_fpenv_cur = NULL;

/* Enter the engines' environment for a method call on this thread (the
 * previous innermost one returned, for fpenv_pop), and leave it. */
static vgct_fpenv *fpenv_push(vgct_fpenv *env) {
  vgct_fpenv *prev = vgpy_fpenv_cur;
  vgct_fpenv_enter(env);
  vgpy_fpenv_cur = env;
  return prev;
}

static void fpenv_pop(const vgct_fpenv *env, vgct_fpenv *prev) {
  vgpy_fpenv_cur = prev;
  vgct_fpenv_leave(env);
}

PyObject *vgpy_in_fpenv_kw(vgpy_method_kw fn, PyObject *self, PyObject *args, PyObject *kwargs) {
  vgct_fpenv env, *prev = fpenv_push(&env);
  PyObject *r = fn(self, args, kwargs);
  fpenv_pop(&env, prev);
  return r;
}

PyObject *vgpy_in_fpenv_1(vgpy_method_1 fn, PyObject *self, PyObject *arg) {
  vgct_fpenv env, *prev = fpenv_push(&env);
  PyObject *r = fn(self, arg);
  fpenv_pop(&env, prev);
  return r;
}

/* vgct_params.interrupt for engines running with the GIL released by
 * vgpy_nogil_begin: take the GIL back, run PyErr_CheckSignals (the Python-level
 * signal handlers: SIGINT raises KeyboardInterrupt), release it again.
 * Nonzero when a handler raised (its exception stays pending for
 * vgpy_raise_engine).  Called only from the thread that released the GIL. */
static int poll_signals(void *ctx) {
  PyThreadState **ts = (PyThreadState **)ctx;
  vgct_fpenv *env = vgpy_fpenv_cur;
  PyEval_RestoreThread(*ts);
  /* the handlers are the caller's code: they run in the caller's environment,
     and a mode they set is the caller's from then on (the engine goes on in
     the default) */
  if (env != NULL) vgct_fpenv_leave(env);
  int r = PyErr_CheckSignals();
  if (env != NULL) vgct_fpenv_enter(env);
  *ts = PyEval_SaveThread();
  return r < 0;
}

void vgpy_fpenv_sync(void) {
  if (vgpy_fpenv_cur != NULL) vgct_fpenv_sync(vgpy_fpenv_cur);
}

/* Release the GIL around an engine call, with the interrupt poll wired in
 * (p->interrupt_ctx points at *ts until vgpy_nogil_end); Python code that
 * ran since the method began (a producer's __dlpack__) may have changed the
 * floating-point mode: the engine computes in the default again. */
void vgpy_nogil_begin(vgct_params *p, PyThreadState **ts) {
  vgpy_fpenv_sync();
  *ts = PyEval_SaveThread();
  p->interrupt = poll_signals;
  p->interrupt_ctx = ts;
}

void vgpy_nogil_end(vgct_params *p, PyThreadState **ts) {
  PyEval_RestoreThread(*ts);
  p->interrupt = NULL;
  p->interrupt_ctx = NULL;
}

/* calloc of `count` slice accumulators for compare(dim=...): MemoryError
 * naming the slice count and the bytes when it cannot be had. */
vgct_slice_acc *vgpy_alloc_slices(int64_t count, long dim) {
  const size_t sz = sizeof(vgct_slice_acc);
  if (count < 0 || (uint64_t)count > (uint64_t)(PY_SSIZE_T_MAX / (Py_ssize_t)sz)) {
    PyErr_Format(PyExc_MemoryError,
                 "dim=%ld: %lld slices need %lld x %zu bytes of slice statistics, more than "
                 "this machine can address",
                 dim, (long long)count, (long long)count, sz);
    return NULL;
  }
  vgct_slice_acc *sl = (vgct_slice_acc *)PyMem_RawCalloc(count ? (size_t)count : 1, sz);
  if (sl == NULL)
    PyErr_Format(PyExc_MemoryError,
                 "dim=%ld: cannot allocate the statistics of %lld slices (%llu bytes)", dim,
                 (long long)count, (unsigned long long)count * (unsigned long long)sz);
  return sl;
}


/* ---- small value builders (NULL on failure, exception set) ------------- */

static PyObject *float_or_none(double x, int defined) {
  if (!defined) Py_RETURN_NONE;
  return PyFloat_FromDouble(x);
}

static PyObject *index_or_none(int64_t i) {
  if (i < 0) Py_RETURN_NONE;
  return PyLong_FromLongLong((long long)i);
}

/* d[key] = val, stealing val; -1 on failure (val may be NULL: failure). */
int vgpy_put(PyObject *d, const char *key, PyObject *val) {
  if (val == NULL) return -1;
  int rc = PyDict_SetItemString(d, key, val);
  Py_DECREF(val);
  return rc;
}

/* ---- the keys of the result dicts, interned once ------------------------ */

/* Every key of vgpy_result_dict and slices_dict, in the order they are inserted.
 * PyDict_SetItemString would create, decode, hash and intern each key string on
 * every call (a third of a small compare's C time); vgpy_init_keys makes them
 * once, at import.  The strings are immortal for the process (never freed: the
 * module is single-phase, its statics outlive any module object). */
#define VGPY_RESULT_KEYS(X)                                                              \
  X(N, "n") X(SHAPE, "shape") X(DTYPE_ACTUAL, "dtype_actual")                            \
  X(DTYPE_EXPECTED, "dtype_expected") X(DEVICE, "device") X(N_FINITE, "n_finite")        \
  X(REL_L2, "rel_l2") X(COSINE, "cosine") X(ZERO_REFERENCE, "zero_reference")            \
  X(NORM_ACTUAL, "norm_actual") X(NORM_EXPECTED, "norm_expected")                        \
  X(NORM_DIFF, "norm_diff") X(MEAN_DIFF, "mean_diff") X(MAX_ABS_ERR, "max_abs_err")      \
  X(MAX_ABS_ERR_INDEX, "max_abs_err_index") X(MAX_ABS_ERR_ACTUAL, "max_abs_err_actual")  \
  X(MAX_ABS_ERR_EXPECTED, "max_abs_err_expected") X(MAX_REL_ERR, "max_rel_err")          \
  X(MAX_REL_ERR_INDEX, "max_rel_err_index") X(MAX_ABS_EXPECTED, "max_abs_expected")      \
  X(RTOL, "rtol") X(ATOL, "atol") X(MISMATCHES, "mismatches")                            \
  X(MISMATCH_FRACTION, "mismatch_fraction") X(WORST_MISMATCH_INDEX, "worst_mismatch_index") \
  X(WORST_MISMATCH_EXCESS, "worst_mismatch_excess") X(N_UNEQUAL, "n_unequal")            \
  X(NAN_ACTUAL, "nan_actual") X(POSINF_ACTUAL, "posinf_actual")                          \
  X(NEGINF_ACTUAL, "neginf_actual") X(NAN_EXPECTED, "nan_expected")                      \
  X(POSINF_EXPECTED, "posinf_expected") X(NEGINF_EXPECTED, "neginf_expected")            \
  X(N_CLASS_MISMATCH, "n_class_mismatch")                                                \
  X(FIRST_CLASS_MISMATCH_INDEX, "first_class_mismatch_index") X(QUANTILES, "quantiles")  \
  X(DIM, "dim") X(SLICES, "slices") X(MEAN_SHIFT, "mean_shift") X(REF_RMS, "ref_rms")    \
  X(COUNT, "count")

#define VGPY_KEY_ENUM(id, name) K_##id,
enum { VGPY_RESULT_KEYS(VGPY_KEY_ENUM) K_NUM_KEYS };
#undef VGPY_KEY_ENUM
#define VGPY_KEY_NAME(id, name) name,
static const char *const key_names[K_NUM_KEYS] = {VGPY_RESULT_KEYS(VGPY_KEY_NAME)};
#undef VGPY_KEY_NAME
static PyObject *keys[K_NUM_KEYS];

/* The dtype names (vgct_dtype_names) and "cpu" as str, for the same reason. */
static PyObject *dtype_strs[VGCT_NUM_DTYPES];
static PyObject *cpu_str;

/* Templates: every key of a result dict (keys[0..K_SLICES]) / of a slices dict
 * (dim, mean_shift, rel_l2, max_abs_err, ref_rms, count) mapped to None, in
 * insertion order.  A result starts as a PyDict_Copy of its template (one
 * allocation of the final size, the keys in the same order) and every value is
 * then replaced: growing a new dict to 40 keys would resize it four times. */
static PyObject *result_template, *slices_template;
static const int slice_keys[] = {K_DIM, K_MEAN_SHIFT, K_REL_L2, K_MAX_ABS_ERR, K_REF_RMS, K_COUNT};

/* A dict of keys[ks[0..n)] -> None (new reference), or NULL with an exception set. */
static PyObject *template_dict(const int *ks, int n) {
  PyObject *d = PyDict_New();
  if (d == NULL) return NULL;
  for (int i = 0; i < n; ++i)
    if (PyDict_SetItem(d, keys[ks[i]], Py_None) < 0) {
      Py_DECREF(d);
      return NULL;
    }
  return d;
}

int vgpy_init_keys(void) {
  for (int i = 0; i < K_NUM_KEYS; ++i)
    if (keys[i] == NULL && (keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL)
      return -1;
  for (int i = 0; i < VGCT_NUM_DTYPES; ++i)
    if (dtype_strs[i] == NULL &&
        (dtype_strs[i] = PyUnicode_InternFromString(vgct_dtype_names[i])) == NULL)
      return -1;
  if (cpu_str == NULL && (cpu_str = PyUnicode_InternFromString("cpu")) == NULL) return -1;
  if (result_template == NULL) {
    int ks[K_SLICES + 1];
    for (int i = 0; i <= K_SLICES; ++i) ks[i] = i;
    if ((result_template = template_dict(ks, K_SLICES + 1)) == NULL) return -1;
  }
  if (slices_template == NULL &&
      (slices_template = template_dict(slice_keys, (int)(sizeof slice_keys / sizeof *slice_keys))) == NULL)
    return -1;
  return 0;
}

/* vgpy_put with the interned key keys[k]: d[key] = val, stealing val; -1 on
 * failure (val may be NULL: failure). */
static int put_k(PyObject *d, int k, PyObject *val) {
  if (val == NULL) return -1;
  int rc = PyDict_SetItem(d, keys[k], val);
  Py_DECREF(val);
  return rc;
}

/* A new reference to a cached str. */
static PyObject *new_ref(PyObject *o) {
  Py_INCREF(o);
  return o;
}

/* The name of vgct dtype dt as a str (new reference). */
static PyObject *dtype_str(int dt) { return new_ref(dtype_strs[dt]); }

/* "cpu" or "cuda:K" as a str (new reference). */
static PyObject *device_str(int type, int id) {
  if (type != kDLCUDA) return new_ref(cpu_str);
  char dev[32];
  vgct_format_device(type, id, dev, sizeof dev);
  return PyUnicode_FromString(dev);
}

PyObject *vgpy_shape_tuple(const vgct_view *v) {
  PyObject *t = PyTuple_New(v->ndim);
  if (t == NULL) return NULL;
  for (int k = 0; k < v->ndim; ++k) {
    PyObject *x = PyLong_FromLongLong((long long)v->shape[k]);
    if (x == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, k, x);
  }
  return t;
}

/* ---- argument helpers --------------------------------------------------- */

/* rtol/atol: finite and >= 0 (a negative or NaN tolerance makes every
 * comparison meaningless); -0.0 becomes 0.0, the same tolerance, so that the
 * result reports the zero it is (here, in the engines' environment: the
 * caller's could flush a subnormal tolerance on the way). */
int vgpy_check_tol(const char *name, double *x) {
  /* by the bits (signbit, the exponent field): the same verdict in any
     floating-point mode (a flushing one would take -5e-310 >= 0.0 as true) */
  const uint64_t b = vgct_bits_from_f64(*x);
  if ((b & 0x7FF0000000000000ull) != 0x7FF0000000000000ull && (b >> 63) == 0) return 0;
  if (b == 0x8000000000000000ull) { /* -0.0: the same tolerance, reported as the 0 it is */
    *x = 0.0;
    return 0;
  }
  PyObject *f = PyFloat_FromDouble(*x);
  if (f == NULL) return -1;
  PyErr_Format(PyExc_ValueError, "%s must be a finite number >= 0, got %R", name, f);
  Py_DECREF(f);
  return -1;
}

/* None or a vgct dtype name -> dtype or -1; -2 on error. */
int vgpy_parse_dtype_override(const char *argname, PyObject *o) {
  if (o == NULL || o == Py_None) return -1;
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s must be None or a dtype name (str), got %.200s", argname,
                 Py_TYPE(o)->tp_name);
    return -2;
  }
  const char *s = PyUnicode_AsUTF8(o);
  if (s == NULL) return -2;
  int dt = vgct_dtype_from_name(s);
  if (dt < 0) {
    char names[256];
    vgct_format_dtype_names(names, sizeof names); /* from vgct_dtype_names */
    PyErr_Format(PyExc_ValueError, "%s: unknown dtype name '%.100s' (expected one of %s)",
                 argname, s, names);
    return -2;
  }
  return dt;
}

/* stream: None or an int ([PY] spec: 1 legacy default, 2 per-thread default,
 * -1 "no synchronization", else a cudaStream_t; 0 is ambiguous and
 * disallowed).  `out` is the stream the engine computes on: -1 is passed to
 * __dlpack__ as given (the producer skips its synchronization) and computes
 * on the legacy default stream (1).  Host-memory inputs take only None: the
 * bridge refuses any other stream for them (vgct_bridge_import). */
int vgpy_parse_stream(PyObject *o, uintptr_t *out) {
  *out = 0;
  if (o == Py_None) return 0;
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "stream must be None or an int (a cudaStream_t), got %.200s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  int overflow = 0;
  long long sv = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (sv == -1 && !overflow && PyErr_Occurred()) return -1;
  if (sv == -1 && !overflow) {
    *out = 1; /* no synchronization requested; compute on the legacy default stream */
    return 0;
  }
  unsigned long long v = (unsigned long long)sv;
  if (overflow > 0) {
    v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ValueError, "stream is out of range for a cudaStream_t");
      return -1;
    }
  } else if (overflow < 0 || sv < -1) {
    PyErr_SetString(PyExc_ValueError,
                    "stream must be -1 (no synchronization) or a positive cudaStream_t, got a "
                    "negative int");
    return -1;
  }
  if (v == 0) {
    PyErr_SetString(PyExc_ValueError,
                    "stream 0 is not allowed by the DLPack spec (ambiguous); use 1 for the "
                    "legacy default stream or 2 for the per-thread default stream");
    return -1;
  }
  *out = (uintptr_t)v;
  return 0;
}

/* Devices of both inputs: same device, CUDA compiled when needed. */
int vgpy_check_devices(const vgct_device *da, const vgct_device *de) {
  if (da->type != de->type || da->id != de->id) {
    char a[32], e[32];
    vgct_format_device(da->type, da->id, a, sizeof a);
    vgct_format_device(de->type, de->id, e, sizeof e);
    PyErr_Format(PyExc_ValueError,
                 "device mismatch: actual is on %s, expected on %s; vgct_ext makes no hidden "
                 "copies: move one tensor to the other's device first",
                 a, e);
    return -1;
  }
#ifndef VGCT_HAVE_CUDA
  if (da->type == kDLCUDA) {
    PyErr_SetString(PyExc_RuntimeError, VGPY_NO_CUDA);
    return -1;
  }
#endif
  return 0;
}

/* ---- results ------------------------------------------------------------ */

static PyObject *slices_dict(const vgct_slice_acc *sl, int64_t k, int dim) {
  npy_intp len = (npy_intp)k;
  PyObject *d = PyDict_Copy(slices_template); /* every key set below, in this order */
  PyArrayObject *ms = NULL, *rl = NULL, *mx = NULL, *rr = NULL, *ct = NULL;
  if (d == NULL) return NULL;
  ms = (PyArrayObject *)PyArray_SimpleNew(1, &len, NPY_FLOAT64);
  rl = (PyArrayObject *)PyArray_SimpleNew(1, &len, NPY_FLOAT64);
  mx = (PyArrayObject *)PyArray_SimpleNew(1, &len, NPY_FLOAT64);
  rr = (PyArrayObject *)PyArray_SimpleNew(1, &len, NPY_FLOAT64);
  ct = (PyArrayObject *)PyArray_SimpleNew(1, &len, NPY_INT64);
  if (!ms || !rl || !mx || !rr || !ct) goto fail;
  double *pms = (double *)PyArray_DATA(ms), *prl = (double *)PyArray_DATA(rl);
  double *pmx = (double *)PyArray_DATA(mx), *prr = (double *)PyArray_DATA(rr);
  npy_int64 *pct = (npy_int64 *)PyArray_DATA(ct);
  for (int64_t j = 0; j < k; ++j) {
    vgct_slice_derived r;
    vgct_slice_finalize(&sl[j], &r);
    pms[j] = r.mean_shift;
    prl[j] = r.rel_l2;
    pmx[j] = r.max_abs_err;
    prr[j] = r.ref_rms;
    pct[j] = (npy_int64)sl[j].n_finite;
  }
  if (put_k(d, K_DIM, PyLong_FromLong(dim)) < 0) goto fail;
  if (put_k(d, K_MEAN_SHIFT, (PyObject *)ms) < 0) { ms = NULL; goto fail; }
  ms = NULL;
  if (put_k(d, K_REL_L2, (PyObject *)rl) < 0) { rl = NULL; goto fail; }
  rl = NULL;
  if (put_k(d, K_MAX_ABS_ERR, (PyObject *)mx) < 0) { mx = NULL; goto fail; }
  mx = NULL;
  if (put_k(d, K_REF_RMS, (PyObject *)rr) < 0) { rr = NULL; goto fail; }
  rr = NULL;
  if (put_k(d, K_COUNT, (PyObject *)ct) < 0) { ct = NULL; goto fail; }
  return d;
fail:
  Py_XDECREF(ms);
  Py_XDECREF(rl);
  Py_XDECREF(mx);
  Py_XDECREF(rr);
  Py_XDECREF(ct);
  Py_DECREF(d);
  return NULL;
}


void vgpy_meta_from_views(const vgct_view *a, const vgct_view *e, vgpy_result_meta *m) {
  m->v = *a;
  m->dta = a->dtype;
  m->dte = e->dtype;
}

/* qv[i] = numpy's linear p-quantile qs[i] from the two order statistics
 * vals[2i] (rank lo) and vals[2i+1] (rank hi) of vgct_quantile_ranks(nf, qs[i]). */
void vgpy_lerp_quantiles(int64_t nf, int nq, const double *qs, const double *vals, double *qv) {
  for (int i = 0; i < nq; ++i) {
    int64_t lo, hi;
    double gamma;
    vgct_quantile_ranks(nf, qs[i], &lo, &hi, &gamma);
    qv[i] = vgct_lerp(vals[2 * i], vals[2 * i + 1], gamma);
  }
}

PyObject *vgpy_result_dict(const vgpy_result_meta *m, const vgct_params *p,
                             const vgct_acc *s, int nq, const double *qs, const double *qv,
                             const vgct_slice_acc *sl) {
  const vgct_view *a = &m->v;
  vgct_derived r;
  vgct_acc_finalize(s, &r);
  int has = s->max_abs_i >= 0;
  PyObject *d = PyDict_Copy(result_template), *q = NULL; /* every key set below, in this order */
  if (d == NULL) return NULL;
  if (put_k(d, K_N, PyLong_FromLongLong((long long)vgct_numel(a))) < 0 ||
      put_k(d, K_SHAPE, vgpy_shape_tuple(a)) < 0 ||
      put_k(d, K_DTYPE_ACTUAL, dtype_str(m->dta)) < 0 ||
      put_k(d, K_DTYPE_EXPECTED, dtype_str(m->dte)) < 0 ||
      put_k(d, K_DEVICE, device_str(a->device_type, a->device_id)) < 0 ||
      put_k(d, K_N_FINITE, PyLong_FromLongLong((long long)s->n_finite)) < 0 ||
      put_k(d, K_REL_L2, float_or_none(r.rel_l2, !r.zero_reference)) < 0 ||
      put_k(d, K_COSINE, float_or_none(r.cosine, !isnan(r.cosine))) < 0 ||
      put_k(d, K_ZERO_REFERENCE, PyBool_FromLong(r.zero_reference)) < 0 ||
      put_k(d, K_NORM_ACTUAL, PyFloat_FromDouble(r.norm_a)) < 0 ||
      put_k(d, K_NORM_EXPECTED, PyFloat_FromDouble(r.norm_e)) < 0 ||
      put_k(d, K_NORM_DIFF, PyFloat_FromDouble(r.norm_d)) < 0 ||
      put_k(d, K_MEAN_DIFF, float_or_none(r.mean_diff, s->n_finite > 0)) < 0 ||
      put_k(d, K_MAX_ABS_ERR, float_or_none(s->max_abs, has)) < 0 ||
      put_k(d, K_MAX_ABS_ERR_INDEX, index_or_none(s->max_abs_i)) < 0 ||
      put_k(d, K_MAX_ABS_ERR_ACTUAL, float_or_none(s->max_abs_a, has)) < 0 ||
      put_k(d, K_MAX_ABS_ERR_EXPECTED, float_or_none(s->max_abs_e, has)) < 0 ||
      put_k(d, K_MAX_REL_ERR, float_or_none(s->max_rel, s->max_rel_i >= 0)) < 0 ||
      put_k(d, K_MAX_REL_ERR_INDEX, index_or_none(s->max_rel_i)) < 0 ||
      put_k(d, K_MAX_ABS_EXPECTED, float_or_none(s->max_abs_ref, s->n_finite > 0)) < 0 ||
      put_k(d, K_RTOL, PyFloat_FromDouble(p->rtol)) < 0 ||
      put_k(d, K_ATOL, PyFloat_FromDouble(p->atol)) < 0 ||
      put_k(d, K_MISMATCHES, PyLong_FromLongLong((long long)s->n_mismatch)) < 0 ||
      put_k(d, K_MISMATCH_FRACTION,
          PyFloat_FromDouble(s->n_finite ? (double)s->n_mismatch / (double)s->n_finite : 0.0)) < 0 ||
      put_k(d, K_WORST_MISMATCH_INDEX, index_or_none(s->worst_i)) < 0 ||
      put_k(d, K_WORST_MISMATCH_EXCESS, float_or_none(s->worst_excess, s->worst_i >= 0)) < 0 ||
      put_k(d, K_N_UNEQUAL, PyLong_FromLongLong((long long)s->n_unequal)) < 0 ||
      put_k(d, K_NAN_ACTUAL, PyLong_FromLongLong((long long)s->n_nan_a)) < 0 ||
      put_k(d, K_POSINF_ACTUAL, PyLong_FromLongLong((long long)s->n_posinf_a)) < 0 ||
      put_k(d, K_NEGINF_ACTUAL, PyLong_FromLongLong((long long)s->n_neginf_a)) < 0 ||
      put_k(d, K_NAN_EXPECTED, PyLong_FromLongLong((long long)s->n_nan_e)) < 0 ||
      put_k(d, K_POSINF_EXPECTED, PyLong_FromLongLong((long long)s->n_posinf_e)) < 0 ||
      put_k(d, K_NEGINF_EXPECTED, PyLong_FromLongLong((long long)s->n_neginf_e)) < 0 ||
      put_k(d, K_N_CLASS_MISMATCH, PyLong_FromLongLong((long long)s->n_class_diff)) < 0 ||
      put_k(d, K_FIRST_CLASS_MISMATCH_INDEX, index_or_none(s->first_class_diff)) < 0)
    goto fail;
  q = PyDict_New();
  if (q == NULL) goto fail;
  for (int i = 0; i < nq; ++i) {
    PyObject *key = PyFloat_FromDouble(qs[i]);
    PyObject *val = float_or_none(qv[i], s->n_finite > 0);
    int rc = (key && val) ? PyDict_SetItem(q, key, val) : -1;
    Py_XDECREF(key);
    Py_XDECREF(val);
    if (rc < 0) goto fail;
  }
  if (put_k(d, K_QUANTILES, q) < 0) {
    q = NULL;
    goto fail;
  }
  q = NULL;
  if (p->dim >= 0) {
    if (put_k(d, K_DIM, PyLong_FromLong(p->dim)) < 0 ||
        put_k(d, K_SLICES, slices_dict(sl, a->shape[p->dim], p->dim)) < 0)
      goto fail;
  } else {
    if (PyDict_SetItem(d, keys[K_DIM], Py_None) < 0 ||
        PyDict_SetItem(d, keys[K_SLICES], Py_None) < 0)
      goto fail;
  }
  return d;
fail:
  Py_XDECREF(q);
  Py_DECREF(d);
  return NULL;
}

/* quantiles argument -> qs[0..*nq): NULL means the default (0.99,), None
 * none; else a sequence of at most VGCT_MAX_QUANTILES finite floats in [0, 1]. */
int vgpy_parse_quantiles(PyObject *quantiles, double *qs, int *nq) {
  *nq = 0;
  if (quantiles == NULL) {
    qs[0] = 0.99;
    *nq = 1;
    return 0;
  }
  if (quantiles == Py_None) return 0;
  PyObject *seq = PySequence_Fast(quantiles, "quantiles must be a sequence of floats in [0, 1]");
  if (seq == NULL) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  if (len > VGCT_MAX_QUANTILES) {
    PyErr_Format(PyExc_ValueError, "at most %d quantiles per call, got %zd", VGCT_MAX_QUANTILES,
                 len);
    Py_DECREF(seq);
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; ++i) {
    PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
    double v = PyFloat_AsDouble(it);
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "quantiles[%zd] must be a float in [0, 1], got %.200s", i,
                   Py_TYPE(it)->tp_name);
      Py_DECREF(seq);
      return -1;
    }
    if (!isfinite(v) || v < 0.0 || v > 1.0) {
      PyErr_Format(PyExc_ValueError, "quantiles[%zd] must be a finite float in [0, 1], got %R", i,
                   it);
      Py_DECREF(seq);
      return -1;
    }
    qs[(*nq)++] = v;
  }
  Py_DECREF(seq);
  return 0;
}

/* dim argument: None -> *has = 0; else any integer (operator.index: numpy
 * integer scalars too), never a bool -> *dim (range checked by vgpy_check_dim). */
int vgpy_parse_dim(PyObject *dim_obj, int *has, long *dim) {
  *has = dim_obj != Py_None;
  *dim = -1;
  if (!*has) return 0;
  PyObject *ix = PyBool_Check(dim_obj) ? NULL : PyNumber_Index(dim_obj);
  if (ix == NULL) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "dim must be None or an int, got %.200s",
                 Py_TYPE(dim_obj)->tp_name);
    return -1;
  }
  int overflow = 0;
  *dim = PyLong_AsLongAndOverflow(ix, &overflow);
  if (overflow) {
    PyErr_Format(PyExc_ValueError, "dim %S out of range (vgct_ext supports at most %d dims)", ix,
                 VGCT_MAX_NDIM);
    *dim = -1;
  }
  Py_DECREF(ix);
  if (*dim == -1 && PyErr_Occurred()) return -1;
  return 0;
}

/* dim in [-ndim, ndim) -> [0, ndim); ValueError naming the shape otherwise. */
int vgpy_check_dim(const vgct_view *a, long *dim) {
  if (*dim < -a->ndim || *dim >= a->ndim) {
    char sa[256];
    vgct_format_shape(a, sa, sizeof sa);
    PyErr_Format(PyExc_ValueError, "dim %ld out of range for a tensor of %d dims (shape %s)", *dim,
                 a->ndim, sa);
    return -1;
  }
  if (*dim < 0) *dim += a->ndim;
  return 0;
}

/* ValueError unless a and e have the same logical shape. */
static int check_same_shape(const vgct_view *a, const vgct_view *e) {
  int same = a->ndim == e->ndim;
  for (int k = 0; same && k < a->ndim; ++k) same = a->shape[k] == e->shape[k];
  if (same) return 0;
  char sa[256], se[256];
  vgct_format_shape(a, sa, sizeof sa);
  vgct_format_shape(e, se, sizeof se);
  PyErr_Format(PyExc_ValueError,
               "shape mismatch: actual has shape %s, expected has shape %s (vgct_ext does not "
               "broadcast; pass views of the same shape)",
               sa, se);
  return -1;
}

/* The two inputs of compare/reduce_raw/histogram: stream and dtype overrides
 * parsed, devices checked, both imported (zero-copy), same logical shape.
 * On success (0) the caller releases *ia and *ie; on failure (-1, one
 * exception set) nothing is held.
 * `producer` (compare's stream=_C.PRODUCER_STREAM, vgpy_producer_stream; the
 * Python layer passes it for two inputs whose type has the DLPack C exchange
 * API): stream_obj is not read; both inputs go through the exchange API and
 * the stream the engine computes on is adopted from the producer
 * (vgct_bridge_import_exchange's `adopt`: the current work stream of the
 * first CUDA input's device, 0 for host memory) instead of looked up in
 * Python first (vgct_ext/core/_dlpack.py call_on_stream: ~4 us of a small
 * call's Python code, docs/performance.md).  When the exchange path does not
 * take an input (another stream on a second device, managed memory, a
 * refused export) it returns 1: nothing held, no exception, and the caller
 * goes the general way with the stream looked up in Python. */
int vgpy_open_pair(PyObject *actual, PyObject *expected, PyObject *stream_obj, int producer,
                   PyObject *dta_obj, PyObject *dte_obj, vgct_import *ia, vgct_import *ie,
                   uintptr_t *stream) {
  *stream = 0;
  if (producer) stream_obj = NULL; /* the producer's stream, adopted below */
  else if (vgpy_parse_stream(stream_obj, stream) < 0) return -1;
  int dta = vgpy_parse_dtype_override("dtype_actual", dta_obj);
  if (dta == -2) return -1;
  int dte = vgpy_parse_dtype_override("dtype_expected", dte_obj);
  if (dte == -2) return -1;
  /* each input through its producer's C exchange API when it can be (no
     Python call into the producer), else __dlpack_device__ + __dlpack__ */
  vgct_device da, de;
  const int xa = vgct_bridge_import_exchange(actual, "actual", stream_obj, stream, producer, dta, &da, ia);
  if (xa < 0) return -1;
  if (producer && !xa) return 1;
  const int xe = vgct_bridge_import_exchange(expected, "expected", stream_obj, stream, producer, dte, &de, ie);
  if (xe < 0) goto fail;
  if (producer && !xe) {
    vgct_import_release(ia);
    return 1;
  }
  if (!xa && vgct_bridge_device(actual, "actual", &da) < 0) goto fail;
  if (!xe && vgct_bridge_device(expected, "expected", &de) < 0) goto fail;
  if (vgpy_check_devices(&da, &de) < 0) goto fail;
  if (!xa && vgct_bridge_import(actual, "actual", &da, stream_obj, dta, ia) < 0) goto fail;
  if (!xe && vgct_bridge_import(expected, "expected", &de, stream_obj, dte, ie) < 0) goto fail;
  if (check_same_shape(&ia->view, &ie->view) < 0) goto fail;
  return 0;
fail:
  vgct_import_release(ie);
  vgct_import_release(ia);
  return -1;
}

PyObject *vgpy_producer_stream = NULL;

/* bytes-like of exactly `size` bytes -> *out; TypeError / ValueError naming `what`. */
int vgpy_read_record(PyObject *o, const char *what, size_t size, void *out) {
  Py_buffer b;
  if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s must be bytes (a raw record from reduce_raw), got %.200s",
                 what, Py_TYPE(o)->tp_name);
    return -1;
  }
  if ((size_t)b.len != size) {
    PyErr_Format(PyExc_ValueError,
                 "%s: a record is %zu bytes in this build, got %zd (ranks running different "
                 "vgct_ext builds?)",
                 what, size, b.len);
    PyBuffer_Release(&b);
    return -1;
  }
  memcpy(out, b.buf, size);
  PyBuffer_Release(&b);
  return 0;
}

PyObject *vgpy_acc_bytes(const vgct_acc *s) {
  return PyBytes_FromStringAndSize((const char *)s, (Py_ssize_t)sizeof *s);
}

/* a sequence of non-negative ints -> shape; ValueError / TypeError naming `what`. */
int vgpy_parse_shape(PyObject *o, const char *what, vgct_view *v) {
  PyObject *seq = PySequence_Fast(o, "shape must be a sequence of ints");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > VGCT_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError, "%s has %zd dims, at most %d are supported", what, n,
                 VGCT_MAX_NDIM);
    Py_DECREF(seq);
    return -1;
  }
  v->ndim = (int)n;
  for (Py_ssize_t k = 0; k < n; ++k) {
    long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
    if (x == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
    if (x < 0) {
      PyErr_Format(PyExc_ValueError, "%s[%zd] is negative (%lld); a shape holds sizes >= 0", what,
                   k, x);
      Py_DECREF(seq);
      return -1;
    }
    v->shape[k] = (int64_t)x;
    v->strides[k] = 0;
  }
  Py_DECREF(seq);
  /* the element count must fit int64 (vgct_numel does not check; 0 when a
   * dim is 0, whatever the others) */
  int empty = 0;
  for (int k = 0; k < v->ndim; ++k) empty |= v->shape[k] == 0;
  int64_t numel = 1;
  for (int k = 0; !empty && k < v->ndim; ++k) {
    if (v->shape[k] > INT64_MAX / numel) {
      char sh[256];
      vgct_format_shape(v, sh, sizeof sh);
      PyErr_Format(PyExc_ValueError, "%s %s has more elements than int64 can count", what, sh);
      return -1;
    }
    numel *= v->shape[k];
  }
  return 0;
}
