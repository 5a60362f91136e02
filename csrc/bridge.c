/*
 * bridge.c -- DLPack import: __dlpack__ call, capsule checks, view building.
 *
 * Written against the DLPack specification v1.x
 * (https://dmlc.github.io/dlpack/latest/), its two parts:
 *   [C]  "C API": DLTensor, DLManagedTensor, DLManagedTensorVersioned, the
 *        version and flags fields (csrc/dlpack.h declares them);
 *   [PY] "Python specification for DLPack": __dlpack__(stream=, max_version=),
 *        __dlpack_device__(), the capsule names "dltensor_versioned" /
 *        "dltensor", the renaming to "used_..." on consumption, who calls the
 *        deleter.
 * The structure follows numpy/_core/src/multiarray/dlpack.c (from_dlpack): the
 * capsule is validated while it still carries its original name, so on any
 * failure before consumption dropping our reference lets the producer's
 * capsule destructor free the tensor; once the view is built the capsule is
 * renamed and from then on we own the managed tensor and call its deleter
 * exactly once (vgct_import_release).
 */
#include "bridge.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* [PY] capsule names.  PyCapsule_SetName keeps the pointer: string literals. */
#define NAME_VERSIONED "dltensor_versioned"
#define NAME_LEGACY "dltensor"
#define NAME_USED_VERSIONED "used_dltensor_versioned"
#define NAME_USED_LEGACY "used_dltensor"

/* Made once by vgct_bridge_init (immortal for the process): the protocol
 * method names, max_version=(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION), and
 * the keyword names of call_dlpack's three attempts.  Building them per call
 * (creating, decoding, hashing and interning each string, a keyword dict per
 * export) was a large part of a small compare's C time. */
static PyObject *str_dlpack, *str_dlpack_device, *str_exchange_api, *max_version;
static PyObject *kwnames[3]; /* (stream, max_version, copy), (stream, max_version), (stream,) */

int vgct_bridge_init(void) {
  if (kwnames[2] != NULL) return 0;
  PyObject *s_stream = NULL, *s_max_version = NULL, *s_copy = NULL;
  if ((str_dlpack = PyUnicode_InternFromString("__dlpack__")) == NULL ||
      (str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) == NULL ||
      (str_exchange_api = PyUnicode_InternFromString("__dlpack_c_exchange_api__")) == NULL ||
      (max_version = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)) == NULL ||
      (s_stream = PyUnicode_InternFromString("stream")) == NULL ||
      (s_max_version = PyUnicode_InternFromString("max_version")) == NULL ||
      (s_copy = PyUnicode_InternFromString("copy")) == NULL ||
      (kwnames[0] = PyTuple_Pack(3, s_stream, s_max_version, s_copy)) == NULL ||
      (kwnames[1] = PyTuple_Pack(2, s_stream, s_max_version)) == NULL ||
      (kwnames[2] = PyTuple_Pack(1, s_stream)) == NULL) {
    Py_CLEAR(str_dlpack);
    Py_CLEAR(str_dlpack_device);
    Py_CLEAR(str_exchange_api);
    Py_CLEAR(max_version);
    Py_CLEAR(kwnames[0]);
    Py_CLEAR(kwnames[1]);
    Py_XDECREF(s_stream);
    Py_XDECREF(s_max_version);
    Py_XDECREF(s_copy);
    return -1;
  }
  Py_DECREF(s_stream); /* held by the tuples */
  Py_DECREF(s_max_version);
  Py_DECREF(s_copy);
  return 0;
}

/* Lower-case name of a DLDeviceType for messages, or NULL when unknown. */
static const char *device_type_name(int t) {
  switch (t) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLOpenCL: return "opencl";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    case kDLVPI: return "vpi";
    case kDLROCM: return "rocm";
    case kDLROCMHost: return "rocm_host";
    case kDLExtDev: return "ext_dev";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLOneAPI: return "oneapi";
    case kDLWebGPU: return "webgpu";
    case kDLHexagon: return "hexagon";
    case kDLMAIA: return "maia";
    default: return NULL;
  }
}

/* Name of a DLDataTypeCode for messages ([C] DLDataTypeCode). */
static const char *dtype_code_name(int code) {
  static const char *const names[] = {
      "int",          "uint",          "float",          "opaque_handle",
      "bfloat",       "complex",       "bool",           "float8_e3m4",
      "float8_e4m3",  "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
      "float8_e5m2",  "float8_e5m2fnuz",    "float8_e8m0fnu", "float6_e2m3fn",
      "float6_e3m2fn", "float4_e2m1fn"};
  if (code >= 0 && code < (int)(sizeof names / sizeof names[0])) return names[code];
  return "unknown";
}

/* "bool, int8, ..., float8_e5m2": every vgct_dtype name, from vgct_dtype_names. */
void vgct_format_dtype_names(char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < VGCT_NUM_DTYPES && used < len; ++i) {
    int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", vgct_dtype_names[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/*
 * vgct_format_tuple -- Python's spelling of a tuple of n ints: "()", "(5,)",
 * "(2, 3)" -- the one format of shapes and strides in every message.
 * Truncated (ending "...") when it does not fit; len >= 8.
 */
void vgct_format_tuple(const int64_t *xs, int n, char *buf, size_t len) {
  size_t used = 0;
  int w = snprintf(buf, len, "(");
  used = w > 0 ? (size_t)w : 0;
  for (int k = 0; k < n && used < len; ++k) {
    w = snprintf(buf + used, len - used, "%s%" PRId64, k ? ", " : "", xs[k]);
    if (w < 0) return;
    used += (size_t)w;
  }
  if (used < len) used += (size_t)snprintf(buf + used, len - used, n == 1 ? ",)" : ")");
  if (used >= len && len > 4) memcpy(buf + len - 4, "...", 4);
}

/* vgct_format_tuple of a view's shape. */
void vgct_format_shape(const vgct_view *v, char *buf, size_t len) {
  vgct_format_tuple(v->shape, v->ndim, buf, len);
}

/* "cpu" or "cuda:K". */
void vgct_format_device(int type, int id, char *buf, size_t len) {
  if (type == kDLCUDA) snprintf(buf, len, "cuda:%d", id);
  else snprintf(buf, len, "cpu");
}

/* vgct_dtype for a numpy/torch dtype name, or -1. */
int vgct_dtype_from_name(const char *name) {
  for (int i = 0; i < VGCT_NUM_DTYPES; ++i)
    if (strcmp(name, vgct_dtype_names[i]) == 0) return i;
  return -1;
}

/*
 * protocol_method -- obj.<name> as a new reference, or NULL (name_obj: the
 * interned str of name, which the messages spell).
 *
 * Only an AttributeError means "not implemented" (TypeError naming the
 * argument and its type); anything else raised while looking the attribute
 * up (a __getattr__ or property that fails) propagates unchanged.  An
 * attribute that is not callable (`__dlpack__ = None`) is a TypeError too.
 */
static PyObject *protocol_method(PyObject *obj, const char *argname, PyObject *name_obj,
                                 const char *name) {
  PyObject *m = PyObject_GetAttr(obj, name_obj);
  if (m == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s: expected an object implementing __dlpack__ (a torch.Tensor, "
                 "numpy.ndarray, cupy/jax array), got %.200s",
                 argname, Py_TYPE(obj)->tp_name);
    return NULL;
  }
  if (!PyCallable_Check(m)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: %.200s.%s is %.200s, not a method; expected an object implementing "
                 "the DLPack protocol (__dlpack__ and __dlpack_device__ methods)",
                 argname, Py_TYPE(obj)->tp_name, name, Py_TYPE(m)->tp_name);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}

/* The ints of a __dlpack_device__() tuple; TypeError naming the argument when
 * one does not fit a C long (no bare OverflowError). */
static int device_field(PyObject *o, const char *argname, const char *what, long *out) {
  int overflow = 0;
  long v = PyLong_AsLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow) {
    PyErr_Format(PyExc_TypeError,
                 "%s: __dlpack_device__() returned a %s that does not fit a C long; expected a "
                 "(device_type, device_id) tuple of two small ints (DLPack Python specification)",
                 argname, what);
    return -1;
  }
  *out = v;
  return 0;
}

/*
 * vgct_bridge_device -- check the protocol and read __dlpack_device__().
 *
 * [PY]: __dlpack_device__() returns a (device_type, device_id) tuple of
 * integers (enum members are int subclasses).  The device is read before any
 * export so that the caller can reject a device mismatch without exporting
 * anything, and pass a stream only to CUDA producers.
 *
 * Accepted: kDLCPU; kDLCUDAHost (pinned host memory, read as CPU memory);
 * kDLCUDA; kDLCUDAManaged (read on its CUDA device).
 *
 * Errors: TypeError when obj lacks __dlpack__ or __dlpack_device__ (or they
 * are not callable), or the device is not a tuple of two ints that fit a C
 * long (messages name the type, never call repr(): a failing __repr__ cannot
 * replace the error); BufferError for any other device type; whatever the
 * attribute look-up or __dlpack_device__() itself raised.
 */
static int device_from_dl(long type, long id, const char *argname, vgct_device *dev);

int vgct_bridge_device(PyObject *obj, const char *argname, vgct_device *dev) {
  PyObject *m = protocol_method(obj, argname, str_dlpack, "__dlpack__");
  if (m == NULL) return -1;
  Py_DECREF(m);
  m = protocol_method(obj, argname, str_dlpack_device, "__dlpack_device__");
  if (m == NULL) return -1;
  PyObject *res = PyObject_CallNoArgs(m);
  Py_DECREF(m);
  if (res == NULL) return -1;
  if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2 ||
      !PyLong_Check(PyTuple_GET_ITEM(res, 0)) || !PyLong_Check(PyTuple_GET_ITEM(res, 1))) {
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2)
      PyErr_Format(PyExc_TypeError,
                   "%s: __dlpack_device__() returned a tuple of (%.100s, %.100s), expected a "
                   "(device_type, device_id) tuple of two ints (DLPack Python specification)",
                   argname, Py_TYPE(PyTuple_GET_ITEM(res, 0))->tp_name,
                   Py_TYPE(PyTuple_GET_ITEM(res, 1))->tp_name);
    else if (PyTuple_Check(res))
      PyErr_Format(PyExc_TypeError,
                   "%s: __dlpack_device__() returned a tuple of %zd items, expected a "
                   "(device_type, device_id) tuple of two ints (DLPack Python specification)",
                   argname, PyTuple_GET_SIZE(res));
    else
      PyErr_Format(PyExc_TypeError,
                   "%s: __dlpack_device__() returned %.200s, expected a (device_type, "
                   "device_id) tuple of two ints (DLPack Python specification)",
                   argname, Py_TYPE(res)->tp_name);
    Py_DECREF(res);
    return -1;
  }
  long type = 0, id = 0;
  int rc = device_field(PyTuple_GET_ITEM(res, 0), argname, "device_type", &type);
  if (rc == 0) rc = device_field(PyTuple_GET_ITEM(res, 1), argname, "device_id", &id);
  Py_DECREF(res);
  if (rc < 0) return -1;
  if (id < INT32_MIN || id > INT32_MAX) {
    PyErr_Format(PyExc_BufferError, "%s: __dlpack_device__() device_id %ld out of range",
                 argname, id);
    return -1;
  }
  if (type < INT32_MIN || type > INT32_MAX) {
    PyErr_Format(PyExc_BufferError,
                 "%s: __dlpack_device__() device_type %ld is not a DLPack device type", argname,
                 type);
    return -1;
  }
  return device_from_dl(type, id, argname, dev);
}

/* The vgct_device of DLPack device (type, id), as reported by the producer
 * (__dlpack_device__, or a DLTensor's device): host memory (kDLCPU,
 * kDLCUDAHost) or a CUDA ordinal (kDLCUDA, kDLCUDAManaged).  Returns 0, or -1
 * with a BufferError naming the device. */
static int device_from_dl(long type, long id, const char *argname, vgct_device *dev) {
  dev->dl_type = (int)type;
  dev->dl_id = (int)id;
  switch (type) {
    case kDLCPU:
    case kDLCUDAHost:
      dev->type = kDLCPU;
      dev->id = 0;
      return 0;
    case kDLCUDA:
    case kDLCUDAManaged:
      if (id < 0) {
        PyErr_Format(PyExc_BufferError, "%s: CUDA device_id %ld is negative", argname, id);
        return -1;
      }
      dev->type = kDLCUDA;
      dev->id = (int)id;
      return 0;
    default: {
      const char *nm = device_type_name((int)type);
      PyErr_Format(PyExc_BufferError,
                   "%s: tensor on device %s:%ld (DLPack device type %ld) is not supported; "
                   "vgct_ext reads cpu, cuda_host, cuda and cuda_managed memory",
                   argname, nm ? nm : "unknown", id, type);
      return -1;
    }
  }
}

/* Save / restore the pending exception around code that may run Python
 * (capsule destructors, producers' deleters). */
#if PY_VERSION_HEX >= 0x030C0000
typedef struct { PyObject *exc; } saved_exc;
static void exc_save(saved_exc *s) { s->exc = PyErr_GetRaisedException(); }
static void exc_restore(saved_exc *s) { PyErr_SetRaisedException(s->exc); }
#else
typedef struct { PyObject *type, *value, *tb; } saved_exc;
static void exc_save(saved_exc *s) { PyErr_Fetch(&s->type, &s->value, &s->tb); }
static void exc_restore(saved_exc *s) { PyErr_Restore(s->type, s->value, s->tb); }
#endif

/*
 * drop_capsule -- Py_DECREF(cap) on an error path.  The exception is already
 * set; an unconsumed capsule's destructor runs the producer's clean-up, which
 * may run Python code (numpy's deleter DECREFs the array) and call PyErr_*:
 * the pending exception is saved across it so that it survives.
 */
static void drop_capsule(PyObject *cap) {
  saved_exc s;
  exc_save(&s);
  Py_DECREF(cap);
  exc_restore(&s);
}

/* The pending exception as a normalized value (new reference), cleared; or
 * NULL when none is set. */
static PyObject *take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
  return PyErr_GetRaisedException();
#else
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (t == NULL) return NULL;
  PyErr_NormalizeException(&t, &v, &tb);
  if (tb != NULL && v != NULL) PyException_SetTraceback(v, tb);
  Py_XDECREF(t);
  Py_XDECREF(tb);
  return v;
#endif
}

/* 1 when `exc` is `head` or in its __context__ chain (chaining would make a
 * cycle). */
static int in_context_chain(PyObject *head, PyObject *exc) {
  int found = 0;
  PyObject *e = head;
  Py_INCREF(e);
  for (int depth = 0; e != NULL && depth < 64; ++depth) {
    if (e == exc) {
      found = 1;
      break;
    }
    PyObject *next = PyException_GetContext(e); /* new reference or NULL */
    Py_DECREF(e);
    e = next;
  }
  Py_XDECREF(e);
  return found;
}

/*
 * call_dlpack -- obj.__dlpack__(stream=stream, max_version=(1, 0), copy=False),
 * falling back to obj.__dlpack__(stream=stream, max_version=(1, 0)) and then
 * to the legacy obj.__dlpack__(stream=stream) when a call raises TypeError or
 * NotImplementedError.
 *
 * [PY] / array API: "max_version ... consumers must pass it as a keyword;
 * producers that do not support it raise TypeError, and the consumer may
 * retry without it to receive a legacy 'dltensor' capsule" (numpy's
 * from_dlpack does the same); some producers refuse a versioned export with
 * NotImplementedError.  copy=False asks for a zero-copy export ("the function
 * must never copy, and raise a BufferError in case a copy is deemed
 * necessary"): vgct_ext reads the producer's memory, and a producer that
 * cannot export without copying says so instead of silently copying.  The
 * `copy` keyword came with max_version (array API 2023.12), so a producer
 * that rejects it gets the plain versioned call first.  A capsule flagged
 * DLPACK_FLAG_BITMASK_IS_COPIED is still accepted (the copy already
 * happened; the values are the same).  A new producer may still answer with
 * a legacy capsule (it supports no versioned export); the caller accepts both
 * names.
 *
 * Any other exception propagates at once.  When every attempt fails, the last
 * attempt's exception is raised with the earlier ones as its __context__
 * ("During handling of the above exception, another exception occurred"), so
 * a producer's own TypeError is never hidden by the retry's.
 *
 * Returns a new reference, or NULL with an exception set.
 */
static PyObject *call_dlpack(PyObject *obj, PyObject *stream) {
  PyObject *meth = PyObject_GetAttr(obj, str_dlpack);
  if (meth == NULL) return NULL;
  PyObject *cap = NULL, *prev = NULL;
  /* args[0]: the slot PY_VECTORCALL_ARGUMENTS_OFFSET lends the callee; then the
   * keyword values, kwnames[attempt] naming the first 3 - attempt of them */
  PyObject *args[4] = {NULL, stream, max_version, Py_False};
  for (int attempt = 0;; ++attempt) {
    cap = PyObject_Vectorcall(meth, args + 1, 0 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                              kwnames[attempt]);
    if (cap != NULL) break;
    PyObject *exc = take_exception();
    if (prev != NULL && exc != NULL && !in_context_chain(prev, exc))
      PyException_SetContext(exc, prev); /* steals prev */
    else
      Py_XDECREF(prev); /* e.g. a producer re-raising one instance: no cycle */
    prev = exc;
    int retry = exc != NULL && attempt < 2 &&
                (PyErr_GivenExceptionMatches(exc, PyExc_TypeError) ||
                 PyErr_GivenExceptionMatches(exc, PyExc_NotImplementedError));
    if (!retry) break;
  }
  if (cap == NULL && prev != NULL) {
    /* re-raise the last attempt's exception (its chain holds the others) */
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(prev);
#else
    PyObject *tb = PyException_GetTraceback(prev);
    PyObject *type = (PyObject *)Py_TYPE(prev);
    Py_INCREF(type);
    PyErr_Restore(type, prev, tb);
#endif
  } else {
    Py_XDECREF(prev); /* an earlier attempt's exception, a later one exported */
  }
  Py_DECREF(meth);
  return cap;
}

/*
 * fill_view -- build a vgct_view from a DLTensor, checking everything the
 * engines rely on ([C] DLTensor field comments decide each rule):
 *   - device equals what __dlpack_device__ reported (else BufferError);
 *   - 0 <= ndim <= VGCT_MAX_NDIM (negative: BufferError; too many: ValueError);
 *   - shape non-NULL when ndim > 0, entries >= 0 (BufferError), element count
 *     fits int64 (ValueError);
 *   - dtype one of vgct_dtype (lanes 1) (TypeError naming code/bits/lanes and
 *     the supported list); an override must have the same itemsize and apply
 *     to a uint8/int8 byte view (ValueError);
 *   - strides: NULL means compact row-major ([C]: "strides ... can be NULL,
 *     indicating tensor is compact and row-majored"); 0 and negative strides
 *     are accepted; every reachable byte offset must fit int64 (ValueError);
 *     an empty tensor (a 0 in its shape) gets all strides 0, whatever the
 *     producer said (nothing is read; no product of its dims is formed);
 *   - data: may be NULL only for an empty tensor ([C] allows NULL data for
 *     size-0 tensors); data + byte_offset is the first element ([C]
 *     "byte_offset: the offset in bytes to the beginning pointer to data").
 *     Any alignment on the CPU (the loaders use memcpy); on a CUDA device the
 *     kernels load elements naturally aligned (BufferError otherwise).
 * Returns 0, or -1 with an exception set.
 */
static int fill_view(const DLTensor *t, const char *argname, const vgct_device *dev,
                     int dtype_override, vgct_view *v) {
  memset(v, 0, sizeof *v);
  if ((int)t->device.device_type != dev->dl_type || (int)t->device.device_id != dev->dl_id) {
    const char *n1 = device_type_name(dev->dl_type), *n2 = device_type_name(t->device.device_type);
    PyErr_Format(PyExc_BufferError,
                 "%s: the DLPack capsule is on device %s:%d but __dlpack_device__() said %s:%d",
                 argname, n2 ? n2 : "unknown", (int)t->device.device_id, n1 ? n1 : "unknown",
                 dev->dl_id);
    return -1;
  }
  if (t->ndim < 0) {
    PyErr_Format(PyExc_BufferError, "%s: malformed DLTensor: ndim is %d", argname, (int)t->ndim);
    return -1;
  }
  if (t->ndim > VGCT_MAX_NDIM) {
    PyErr_Format(PyExc_ValueError, "%s: tensor has %d dimensions; vgct_ext supports at most %d",
                 argname, (int)t->ndim, VGCT_MAX_NDIM);
    return -1;
  }
  if (t->ndim > 0 && t->shape == NULL) {
    PyErr_Format(PyExc_BufferError, "%s: malformed DLTensor: shape is NULL with ndim %d",
                 argname, (int)t->ndim);
    return -1;
  }
  int dt = vgct_dtype_from_dlpack(t->dtype.code, t->dtype.bits, t->dtype.lanes);
  if (dt < 0) {
    char list[256];
    vgct_format_dtype_names(list, sizeof list);
    PyErr_Format(PyExc_TypeError,
                 "%s: unsupported dtype (DLPack code %d '%s', bits %d, lanes %d); "
                 "supported: %s",
                 argname, (int)t->dtype.code, dtype_code_name(t->dtype.code),
                 (int)t->dtype.bits, (int)t->dtype.lanes, list);
    return -1;
  }
  if (dtype_override >= 0) {
    if (vgct_dtype_itemsize[dtype_override] != vgct_dtype_itemsize[dt]) {
      PyErr_Format(PyExc_ValueError,
                   "%s: dtype override %s (itemsize %d) cannot reinterpret %s (itemsize %d)",
                   argname, vgct_dtype_names[dtype_override], vgct_dtype_itemsize[dtype_override],
                   vgct_dtype_names[dt], vgct_dtype_itemsize[dt]);
      return -1;
    }
    /* the override exists for bit views of floating data DLPack cannot
     * carry (a torch without float8 export hands over x.view(torch.uint8),
     * NumPy's ml_dtypes bfloat16/float8 arrays a uint16/uint8 view): it
     * turns an UNSIGNED integer view into a FLOATING dtype of the same
     * width; anything else (float32 bits as int32, int8 read as uint8)
     * would be silently wrong */
    if (dt != VGCT_UINT8 && dt != VGCT_UINT16 && dt != VGCT_UINT32 && dt != VGCT_UINT64 &&
        dt != VGCT_INT8) {
      PyErr_Format(PyExc_ValueError,
                   "%s: dtype override %s applies only to an unsigned integer view of the same "
                   "width (uint8/int8 for float8, uint16 for float16/bfloat16), but the tensor is %s",
                   argname, vgct_dtype_names[dtype_override], vgct_dtype_names[dt]);
      return -1;
    }
    if (vgct_dtype_is_int(dtype_override)) {
      PyErr_Format(PyExc_ValueError,
                   "%s: dtype override %s is an integer dtype; an override names the floating "
                   "dtype of a bit view (float16, bfloat16, float32, float64, float8_e4m3fn, "
                   "float8_e5m2)",
                   argname, vgct_dtype_names[dtype_override]);
      return -1;
    }
    dt = dtype_override;
  }
  v->dtype = dt;
  v->ndim = (int)t->ndim;
  v->device_type = dev->type;
  v->device_id = dev->id;

  int64_t numel = 1;
  int empty = 0;
  for (int k = 0; k < v->ndim; ++k) {
    if (t->shape[k] < 0) {
      PyErr_Format(PyExc_BufferError, "%s: malformed DLTensor: shape[%d] = %" PRId64,
                   argname, k, t->shape[k]);
      return -1;
    }
    v->shape[k] = t->shape[k];
    empty |= t->shape[k] == 0;
  }
  if (empty) {
    numel = 0;
  } else {
    for (int k = 0; k < v->ndim; ++k) {
      if (v->shape[k] > INT64_MAX / numel) {
        char sh[256];
        vgct_format_shape(v, sh, sizeof sh);
        PyErr_Format(PyExc_ValueError, "%s: the element count of shape %s overflows int64",
                     argname, sh);
        return -1;
      }
      numel *= v->shape[k];
    }
  }

  if (empty) {
    /* no element is ever addressed: all strides 0.  (The compact row-major
     * products below could overflow int64 for a shape like (0, 2^62, 2^62),
     * and engines may multiply shapes by strides.) */
    for (int k = 0; k < v->ndim; ++k) v->strides[k] = 0;
  } else if (t->strides == NULL) {
    int64_t s = 1;
    for (int k = v->ndim - 1; k >= 0; --k) {
      v->strides[k] = s;
      s *= v->shape[k]; /* <= numel, checked above: no overflow */
    }
  } else {
    for (int k = 0; k < v->ndim; ++k) v->strides[k] = t->strides[k];
  }

  const int64_t isz = vgct_dtype_itemsize[dt];
  if (numel > 0) {
    /* the lowest and highest element offsets must fit int64 in bytes */
    const int64_t lim = INT64_MAX / isz;
    int64_t lo = 0, hi = 0;
    for (int k = 0; k < v->ndim; ++k) {
      int64_t m = v->shape[k] - 1, st = v->strides[k];
      if (m == 0 || st == 0) continue;
      if (st == INT64_MIN || (st < 0 ? -st : st) > lim / m) goto range;
      int64_t span = st * m;
      if (span > 0) {
        if (hi > lim - span) goto range;
        hi += span;
      } else {
        if (lo < -lim - span) goto range;
        lo += span;
      }
    }
    if (t->data == NULL) {
      PyErr_Format(PyExc_BufferError,
                   "%s: malformed DLTensor: data is NULL for a tensor of %" PRId64 " elements",
                   argname, numel);
      return -1;
    }
  }
  v->data = t->data ? (const char *)t->data + t->byte_offset : NULL;
  if (numel > 0 && v->device_type == kDLCUDA && ((uintptr_t)v->data % (uintptr_t)isz) != 0) {
    PyErr_Format(PyExc_BufferError,
                 "%s: CUDA data pointer %p is not aligned to the %s itemsize %d "
                 "(the GPU kernels load naturally aligned elements)",
                 argname, (const void *)v->data, vgct_dtype_names[dt], (int)isz);
    return -1;
  }
  return 0;
range: {
  /* name the offending layout: which producer sent what is the first question
   * (every axis, in vgct_format_tuple's one format; "..." only past 256 bytes) */
  char sh[256], st[256];
  vgct_format_tuple(v->shape, v->ndim, sh, sizeof sh);
  vgct_format_tuple(v->strides, v->ndim, st, sizeof st);
  PyErr_Format(PyExc_ValueError,
               "%s: strides reach beyond the int64 byte range (shape x strides overflow): "
               "shape %s strides %s in elements of %d bytes",
               argname, sh, st, (int)isz);
  return -1;
}
}

/*
 * vgct_bridge_import -- export obj through DLPack and build out->view.
 *
 * Steps ([PY] "consumer" side):
 *  0. a tensor read as host memory (kDLCPU, kDLCUDAHost) takes only
 *     stream=None ([PY]: "stream must be None" for the CPU; numpy raises
 *     otherwise): any other stream is a ValueError, before any export;
 *  1. call __dlpack__ (call_dlpack): CUDA producers get the consumer's stream
 *     (-1: [PY] "no synchronization") so that they order their pending work
 *     before ours; CPU producers get stream=None;
 *  2. the result must be a PyCapsule (TypeError) named "dltensor_versioned"
 *     or "dltensor" (BufferError; "used_..." means already consumed);
 *  3. versioned: version.major must be 1 ([C]: "the consumer must check the
 *     major version and refuse a tensor whose major version it does not
 *     support"; BufferError naming the version), the rest of the struct is
 *     read only after that check;
 *  4. fill_view (the DLTensor rules above);
 *  5. rename the capsule to "used_dltensor_versioned"/"used_dltensor" ([PY]:
 *     marks it consumed so its destructor no longer calls the deleter) and
 *     take ownership of the managed tensor: vgct_import_release calls the
 *     deleter exactly once.
 * Until step 5 every failure only drops our capsule reference (drop_capsule:
 * the capsule still has its original name and its destructor frees the
 * tensor; the exception set before survives it).  The flags are not refused:
 * READ_ONLY because we never write, IS_COPIED because a producer that copied
 * despite copy=False still hands over the values asked for.
 */
int vgct_bridge_import(PyObject *obj, const char *argname, const vgct_device *dev,
                       PyObject *stream, int dtype_override, vgct_import *out) {
  out->managed = NULL;
  out->versioned = 0;
  if (dev->type != kDLCUDA && stream != NULL && stream != Py_None) {
    PyErr_Format(PyExc_ValueError,
                 "%s: stream must be None for a tensor in host memory (the DLPack Python "
                 "specification allows only None on the CPU), got %.200s",
                 argname, Py_TYPE(stream)->tp_name);
    return -1;
  }
  PyObject *cap = call_dlpack(obj, dev->type == kDLCUDA ? stream : Py_None);
  if (cap == NULL) return -1;
  if (!PyCapsule_CheckExact(cap)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: __dlpack__() returned %.200s, expected a PyCapsule named "
                 "'dltensor_versioned' or 'dltensor' (DLPack Python specification)",
                 argname, Py_TYPE(cap)->tp_name);
    drop_capsule(cap);
    return -1;
  }
  const char *name = PyCapsule_GetName(cap);
  if (name == NULL && PyErr_Occurred()) {
    drop_capsule(cap);
    return -1;
  }
  int versioned = name != NULL && strcmp(name, NAME_VERSIONED) == 0;
  int legacy = name != NULL && strcmp(name, NAME_LEGACY) == 0;
  if (!versioned && !legacy) {
    int used = name != NULL && strncmp(name, "used_", 5) == 0;
    PyErr_Format(PyExc_BufferError,
                 "%s: __dlpack__() returned a capsule named %s%s%s, expected 'dltensor_versioned' "
                 "or 'dltensor'%s",
                 argname, name ? "'" : "", name ? name : "NULL", name ? "'" : "",
                 used ? " (a 'used_' capsule was already consumed; export a new one)" : "");
    drop_capsule(cap);
    return -1;
  }
  void *ptr = PyCapsule_GetPointer(cap, name); /* never NULL for a valid capsule */
  if (ptr == NULL) {
    drop_capsule(cap);
    return -1;
  }
  const DLTensor *t;
  if (versioned) {
    DLManagedTensorVersioned *mv = (DLManagedTensorVersioned *)ptr;
    if (mv->version.major != DLPACK_MAJOR_VERSION) {
      PyErr_Format(PyExc_BufferError,
                   "%s: the producer exported DLPack version %u.%u; vgct_ext reads DLPack %d.x",
                   argname, (unsigned)mv->version.major, (unsigned)mv->version.minor,
                   DLPACK_MAJOR_VERSION);
      drop_capsule(cap);
      return -1;
    }
    t = &mv->dl_tensor;
  } else {
    t = &((DLManagedTensor *)ptr)->dl_tensor;
  }
  if (fill_view(t, argname, dev, dtype_override, &out->view) < 0) {
    drop_capsule(cap);
    return -1;
  }
  if (PyCapsule_SetName(cap, versioned ? NAME_USED_VERSIONED : NAME_USED_LEGACY) < 0) {
    drop_capsule(cap);
    return -1;
  }
  out->managed = ptr;
  out->versioned = versioned;
  Py_DECREF(cap); /* renamed: its destructor leaves the tensor to us */
  return 0;
}

/* After a producer's exchange function failed (or left an exception set):
 * 0 when the failure is a refusal that the __dlpack__ path will report in the
 * producer's own words -- no exception, or an Exception other than
 * MemoryError (cleared); -1 when the exception must propagate as it is
 * (KeyboardInterrupt, SystemExit, MemoryError: the __dlpack__ path lets them
 * through too). */
static int exchange_refusal(void) {
  if (!PyErr_Occurred()) return 0;
  if (PyErr_ExceptionMatches(PyExc_Exception) && !PyErr_ExceptionMatches(PyExc_MemoryError)) {
    PyErr_Clear();
    return 0;
  }
  return -1;
}

/*
 * vgct_bridge_import_exchange -- vgct_bridge_import through the producer's C
 * exchange API ([X]: dlpack.h 1.3, "DLPackExchangeAPI"; the Python
 * specification's __dlpack_c_exchange_api__): the tensor is exported by a C
 * call, with no Python call into the producer (no __dlpack_device__, no
 * __dlpack__, no capsule).  For torch, whose Python __dlpack__ and
 * __dlpack_device__ were ~4 us a tensor of a small call.
 *
 * Taken only when all of these hold; otherwise it returns 0 with nothing held
 * and no exception, and the caller goes the __dlpack__ way, which reports the
 * producer's own errors in the spec's form (torch: BufferError):
 *  1. obj's own type -- not a base class: [X] "Must have the same type as the
 *     one the DLPackExchangeAPI was discovered from", and a subclass may
 *     override __dlpack__ -- has __dlpack_c_exchange_api__ in its dict, a
 *     capsule named "dlpack_exchange_api" whose table has header major
 *     version 1 and both functions used here;
 *  2. the export succeeds -- returns 0 with a tensor and no exception set --
 *     and gives major version 1 ([C]); a failure's Exception is cleared
 *     (the fallback reports the producer's refusal), but KeyboardInterrupt,
 *     SystemExit and MemoryError propagate (exchange_refusal);
 *  3. the streams need no synchronisation ([X]: the export "does not perform
 *     any stream synchronization.  The consumer should query
 *     DLPackCurrentWorkStream to get the current work stream and launch
 *     kernels on it"): host memory (kDLCPU, kDLCUDAHost) read with stream
 *     None, or kDLCUDA memory whose device's current work stream IS *stream,
 *     the one the engine computes on (0 and 1 both the legacy default).
 *     Anything else -- another stream, managed memory -- is left to
 *     __dlpack__(stream=...), which orders the producer's work first.
 *     `adopt` (compare's PRODUCER_STREAM, vgpy_open_pair's `producer`): the
 *     stream is the producer's own -- *stream, 0 on entry, becomes the
 *     current work stream of the first kDLCUDA tensor's device (0 -> 1, the
 *     legacy default), which every later tensor's device must then have;
 *     host memory is read with no stream (the caller passes stream_obj NULL).
 * The device comes from the DLTensor (dev is set); fill_view checks the rest
 * exactly as for a capsule.  Returns 1 with *out holding the tensor, or -1
 * with an exception set and nothing held (fill_view's, or the producer's
 * KeyboardInterrupt / SystemExit / MemoryError).
 */
int vgct_bridge_import_exchange(PyObject *obj, const char *argname, PyObject *stream_obj,
                                uintptr_t *stream, int adopt, int dtype_override,
                                vgct_device *dev, vgct_import *out) {
  out->managed = NULL;
  out->versioned = 0;
  PyObject *tdict = Py_TYPE(obj)->tp_dict; /* borrowed; the type's own attributes */
  if (tdict == NULL || !PyDict_CheckExact(tdict)) return 0;
  PyObject *cap = PyDict_GetItemWithError(tdict, str_exchange_api); /* borrowed */
  if (cap == NULL) return PyErr_Occurred() ? -1 : 0;
  if (!PyCapsule_IsValid(cap, "dlpack_exchange_api")) return 0;
  const DLPackExchangeAPI *api = (const DLPackExchangeAPI *)PyCapsule_GetPointer(cap, "dlpack_exchange_api");
  if (api == NULL || api->header.version.major != DLPACK_MAJOR_VERSION ||
      api->managed_tensor_from_py_object_no_sync == NULL || api->current_work_stream == NULL)
    return 0;
  /* The table is read here and never again: the capsule is only borrowed from
     the type's dict, and an export that runs Python could drop it (a producer
     breaking [X]'s process-lifetime rule must not make us read freed memory). */
  int (*const export_fn)(void *, DLManagedTensorVersioned **) = api->managed_tensor_from_py_object_no_sync;
  int (*const stream_fn)(int32_t, int32_t, void **) = api->current_work_stream;
  DLManagedTensorVersioned *mv = NULL;
  const int xrc = export_fn((void *)obj, &mv);
  /* what the export handed over (nothing when it failed), released on every path that does not keep it */
  vgct_import tmp = {xrc == 0 ? mv : NULL, 1, {0}};
  if (xrc != 0 || mv == NULL || PyErr_Occurred()) goto not_taken; /* failed, or "succeeded" with an exception set */
  if (mv->version.major != DLPACK_MAJOR_VERSION) goto not_taken;
  const DLDevice d = mv->dl_tensor.device;
  if (d.device_type == kDLCPU || d.device_type == kDLCUDAHost) {
    if (stream_obj != NULL && stream_obj != Py_None) goto not_taken; /* __dlpack__ path refuses it */
  } else if (d.device_type == kDLCUDA) {
    void *cur = NULL;
    if (stream_fn(kDLCUDA, d.device_id, &cur) != 0 || PyErr_Occurred()) goto not_taken;
    const uintptr_t c = (uintptr_t)cur;
    if (adopt && *stream == 0) *stream = c != 0 ? c : 1;
    if (!(c == *stream || (c <= 1 && *stream <= 1))) goto not_taken;
  } else {
    goto not_taken;
  }
  if (device_from_dl((long)d.device_type, (long)d.device_id, argname, dev) < 0 ||
      fill_view(&mv->dl_tensor, argname, dev, dtype_override, &out->view) < 0) {
    vgct_import_release(&tmp); /* keeps fill_view's exception */
    return -1;
  }
  out->managed = mv;
  out->versioned = 1;
  return 1;
not_taken:
  vgct_import_release(&tmp); /* keeps a pending exception for exchange_refusal */
  return exchange_refusal() < 0 ? -1 : 0;
}

/*
 * vgct_import_release -- call the producer's deleter once and forget the
 * tensor.  [C]: the deleter "should be called to destruct the manager_ctx"
 * and may be NULL when the producer needs no clean-up.  Producers' deleters
 * may run Python code (numpy's DECREFs the array), so a pending exception is
 * saved across the call; one the deleter itself leaves set goes to
 * PyErr_WriteUnraisable.
 */
void vgct_import_release(vgct_import *imp) {
  void *m = imp->managed;
  imp->managed = NULL;
  if (m == NULL) return;
  saved_exc s;
  exc_save(&s);
  if (imp->versioned) {
    DLManagedTensorVersioned *mv = (DLManagedTensorVersioned *)m;
    if (mv->deleter) mv->deleter(mv);
  } else {
    DLManagedTensor *ml = (DLManagedTensor *)m;
    if (ml->deleter) ml->deleter(ml);
  }
  /* a deleter has no way to report failure: an exception it left behind is
   * reported like one from a __del__ (sys.unraisablehook), never raised from
   * an unrelated call, nor allowed to replace the caller's own */
  if (PyErr_Occurred()) {
    saved_exc d;
    exc_save(&d);
    PyObject *ctx = PyUnicode_FromString("the DLPack deleter of a tensor read by vgct_ext");
    if (ctx == NULL) PyErr_Clear();
    exc_restore(&d);
    PyErr_WriteUnraisable(ctx);
    Py_XDECREF(ctx);
  }
  exc_restore(&s);
}
