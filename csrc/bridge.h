/*
 * bridge.h -- DLPack import for vgct_ext._C (implementation: bridge.c).
 *
 * Turns any Python object implementing the DLPack Python protocol
 * (__dlpack__ / __dlpack_device__: torch.Tensor, numpy.ndarray, CuPy, JAX)
 * into a vgct_view over the producer's memory, without copying.  The caller
 * keeps the imported tensor alive while the engines read it and releases it
 * exactly once with vgct_import_release() (which calls the producer's deleter).
 *
 * Usage (module.c):
 *
 *   vgct_device da, de;
 *   if (vgct_bridge_device(actual, "actual", &da) < 0) return NULL;
 *   ...
 *   vgct_import ia = VGCT_IMPORT_INIT;
 *   if (vgct_bridge_import(actual, "actual", &da, stream, -1, &ia) < 0) goto fail;
 *   ... engines read ia.view (the GIL may be released) ...
 *   vgct_import_release(&ia);     (on every path; a no-op on an empty import)
 *
 * All functions need the GIL.  On failure they return -1 with a Python
 * exception set and own nothing.
 */
#ifndef VGCT_BRIDGE_H_
#define VGCT_BRIDGE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dlpack.h"
#include "vgct_engine.h"

/* Where a tensor lives, as vgct_ext sees it: kDLCUDAHost is read as CPU
 * memory (type kDLCPU, id 0), kDLCUDAManaged as memory of its CUDA device
 * (type kDLCUDA).  `dl_type` keeps what the producer reported. */
typedef struct {
  int type;    /* kDLCPU or kDLCUDA */
  int id;      /* CUDA ordinal; 0 for the CPU */
  int dl_type; /* DLDeviceType as reported by __dlpack_device__ */
  int dl_id;   /* device_id as reported by __dlpack_device__ */
} vgct_device;

/* One imported tensor.  `managed` is owned: a DLManagedTensorVersioned* when
 * `versioned`, else a DLManagedTensor*; NULL when nothing is held. */
typedef struct {
  void *managed;
  int versioned;
  vgct_view view;
} vgct_import;

#define VGCT_IMPORT_INIT {NULL, 0, {0}}

/* Make the strings and tuples the bridge passes to every producer (the protocol
 * method names, __dlpack__'s keyword names and max_version), once, before any
 * other bridge call (PyInit__C); 0, or -1 with an exception set. */
int vgct_bridge_init(void);

/* Check that `obj` implements the DLPack protocol and read its device with
 * __dlpack_device__(); `argname` ("actual", "expected", "x") prefixes every
 * error message.  TypeError: no (callable) __dlpack__/__dlpack_device__, or
 * a malformed device tuple.  BufferError: a device vgct_ext cannot read (only
 * CPU, CUDA host, CUDA and CUDA managed memory are accepted).  An exception
 * other than AttributeError raised by the attribute look-up propagates. */
int vgct_bridge_device(PyObject *obj, const char *argname, vgct_device *dev);

/* Export `obj` (whose device `dev` came from vgct_bridge_device) with
 * __dlpack__(stream=, max_version=(1, 0), copy=False) (legacy fallbacks:
 * bridge.c call_dlpack) and build out->view.  `stream` (None or a Python int)
 * is passed to __dlpack__ for CUDA devices; for host memory it must be None
 * (ValueError otherwise: the DLPack spec allows only None on the CPU).
 * `dtype_override` is a floating vgct_dtype that reinterprets the elements
 * of an unsigned integer view of the same itemsize (uint8/int8 for float8,
 * uint16 for bfloat16/float16, ...), or -1; ValueError otherwise.
 * On success the caller owns the tensor: call vgct_import_release() once. */
int vgct_bridge_import(PyObject *obj, const char *argname, const vgct_device *dev,
                       PyObject *stream, int dtype_override, vgct_import *out);

/* The same import through the producer's C exchange API (DLPack 1.3,
 * __dlpack_c_exchange_api__ on obj's own type), when it needs no stream
 * synchronisation: host memory with stream None, or CUDA memory whose
 * device's current work stream is *stream (the parsed stream the engine
 * computes on).  adopt != 0 (stream_obj NULL): the producer's stream instead (host
 * memory with no stream; the first CUDA tensor sets *stream, 0 on entry, to
 * its device's current work stream, 0 -> 1).  1: imported, *dev set from the
 * tensor, the caller owns it (vgct_import_release); 0: not taken, nothing
 * held, no exception (use vgct_bridge_device + vgct_bridge_import); -1: the
 * tensor was refused (fill_view's errors, as vgct_bridge_import raises
 * them), nothing held. */
int vgct_bridge_import_exchange(PyObject *obj, const char *argname, PyObject *stream_obj,
                                uintptr_t *stream, int adopt, int dtype_override,
                                vgct_device *dev, vgct_import *out);

/* Call the producer's deleter (once) and reset the import; safe to call on an
 * empty or already released import.  Never fails; keeps a pending exception. */
void vgct_import_release(vgct_import *imp);

/* Every vgct_dtype name, comma-separated ("bool, int8, ..."), into buf
 * (truncated to fit). */
void vgct_format_dtype_names(char *buf, size_t len);

/* vgct_dtype for a name ("bfloat16", "float8_e4m3fn", ...), or -1. */
int vgct_dtype_from_name(const char *name);

/* Write "(2, 3, 4)" / "(5,)" / "()" (Python's tuple spelling) into buf. */
void vgct_format_tuple(const int64_t *xs, int n, char *buf, size_t len);
void vgct_format_shape(const vgct_view *v, char *buf, size_t len);

/* "cpu" or "cuda:K" */
void vgct_format_device(int type, int id, char *buf, size_t len);

#endif /* VGCT_BRIDGE_H_ */
