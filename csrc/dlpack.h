/*
 * dlpack.h -- the DLPack ABI (v1.x) declarations vgct_ext consumes.
 *
 * Written from the DLPack specification (https://dmlc.github.io/dlpack/latest/,
 * "C API" and "Python specification for DLPack"), Apache-2.0 licensed spec.
 * Only what a consumer needs is declared: the device and dtype enums, DLTensor,
 * the legacy DLManagedTensor and the versioned DLManagedTensorVersioned with its
 * flags, and (DLPack 1.3, "DLPack __dlpack_c_exchange_api__ fast exchange
 * protocol") the producer's function table DLPackExchangeAPI.  The layouts are
 * ABI and must match the spec bit for bit.
 */
#ifndef VGCT_DLPACK_H_
#define VGCT_DLPACK_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; NULL means compact row-major */
  uint64_t byte_offset;
} DLTensor;

/* Legacy (pre-1.0) managed tensor, capsule name "dltensor" / "used_dltensor". */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

/* Versioned managed tensor, capsule name "dltensor_versioned" /
 * "used_dltensor_versioned". */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* The C exchange API (DLPack 1.3): a producer's type carries, as the
 * attribute __dlpack_c_exchange_api__, a PyCapsule named "dlpack_exchange_api"
 * holding a process-lifetime DLPackExchangeAPI.  Its functions take the
 * Python object as void*, need the GIL, return 0 on success and -1 with a
 * Python exception set, and never synchronise streams: the consumer asks
 * current_work_stream for the producer's current stream and computes on it.
 * The members a consumer does not call are declared as opaque pointers. */
typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;                   /* the consumer checks major      */
  struct DLPackExchangeAPIHeader *prev_api; /* an older table, or NULL       */
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  void *managed_tensor_allocator;
  /* obj (exactly the type the table came from) -> an owning
     DLManagedTensorVersioned*, no stream synchronisation */
  int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
  void *managed_tensor_to_py_object_no_sync;
  void *dltensor_from_py_object_no_sync;
  /* the producer's current stream on a device (NULL on the CPU) */
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_current_stream);
} DLPackExchangeAPI;

#ifdef __cplusplus
}
#endif
#endif /* VGCT_DLPACK_H_ */
