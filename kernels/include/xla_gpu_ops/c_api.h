// The C ABI of libxla_gpu_ops.so. Nothing here depends on a framework.
//
// The library exports one table of its ops (xla_gpu_ops_ops): per op its operand, result and
// attribute names, and the entry points every front end needs:
//   describe    static checks of one call + its result shapes (trace time, no GPU needed)
//   launch      run the op on the GPU: eager front ends, on their current stream
//   check_host_values   the metadata-value checks, on host copies (optional validation)
//   cuda_ffi_handler / host_ffi_handler / cuda_legacy_handler   XLA custom-call handlers
// Front ends read the table and register or call by op name; no symbol name is built anywhere.
//
// A call is described by an XgoCall: the op name, operand shapes and dtypes, and attribute
// values, each in the op's own order. The same bytes are the legacy custom call's opaque.
#ifndef XLA_GPU_OPS_C_API_H_
#define XLA_GPU_OPS_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XGO_EXPORT __attribute__((visibility("default")))

// Version of this header; Python refuses a library whose version differs.
#define XGO_ABI_VERSION 3

typedef enum {
  XGO_OK = 0,
  XGO_INVALID_ARGUMENT = 1,  // bad shape, rank, attribute or value; nothing was launched
  XGO_CUDA_ERROR = 2,        // a CUDA call or launch failed
  XGO_INVALID_DTYPE = 3,     // an operand's element type is not one the op takes
} XgoStatus;

// Element types: the one list. Each entry: enum name, code, name (numpy's / torch's spelling),
// size in bytes. Dispatch and error messages on both sides derive from it (dtypes.h).
#define XGO_DTYPE_LIST(X)            \
  X(F32, 0, "float32", 4)            \
  X(F16, 1, "float16", 2)            \
  X(BF16, 2, "bfloat16", 2)          \
  X(F8E4M3FN, 3, "float8_e4m3fn", 1) \
  X(S32, 4, "int32", 4)              \
  X(S64, 5, "int64", 8)

typedef enum {
#define XGO_DTYPE_ENUM(name, code, text, size) XGO_##name = code,
  XGO_DTYPE_LIST(XGO_DTYPE_ENUM)
#undef XGO_DTYPE_ENUM
} XgoDtype;

#define XGO_MAX_RANK 8
#define XGO_MAX_OPERANDS 12
#define XGO_MAX_RESULTS 4
#define XGO_MAX_ATTRS 12
#define XGO_MAX_OP_NAME 32

typedef struct {
  int32_t dtype;  // XgoDtype
  int32_t rank;
  int64_t dims[XGO_MAX_RANK];
} XgoShape;

typedef enum {
  XGO_ATTR_F32 = 0,  // float; carried in XgoAttrValue.f64, rounded to float by the library
  XGO_ATTR_I64 = 1,
} XgoAttrType;

typedef union {
  double f64;
  int64_t i64;
} XgoAttrValue;

#define XGO_CALL_MAGIC 0x4c4c4358u /* "XCLL" */

// One call's static description. Attributes that "None" turns off carry the op's off value
// (e.g. sliding_window 0): the Python op table (xla_gpu_ops/ops.py) says which.
typedef struct {
  uint32_t magic;            // XGO_CALL_MAGIC
  uint32_t abi_version;      // XGO_ABI_VERSION
  char op[XGO_MAX_OP_NAME];  // NUL-terminated op name; a handler rejects another op's call
  int32_t num_operands;
  int32_t num_attrs;
  XgoShape operands[XGO_MAX_OPERANDS];
  XgoAttrValue attrs[XGO_MAX_ATTRS];
} XgoCall;

typedef struct {
  int32_t num_results;
  int32_t reserved;
  XgoShape results[XGO_MAX_RESULTS];
} XgoResults;

typedef struct {
  const char* name;
  int32_t num_operands;
  int32_t num_results;
  int32_t num_attrs;
  int32_t reserved;
  const char* const* operand_names;
  const char* const* result_names;
  const char* const* attr_names;
  const int32_t* attr_types;  // XgoAttrType per attribute
  // Static checks of `call` (ranks, shapes, dtypes, attributes, kernel limits); fills `results`.
  int32_t (*describe)(const XgoCall* call, XgoResults* results);
  // Runs the op on `cuda_stream`: buffers = device pointers of the operands, then the results
  // (shapes as `describe` gave them). Enqueues only: no sync, no allocation.
  int32_t (*launch)(const XgoCall* call, void* const* buffers, void* cuda_stream);
  // Checks operand values that the GPU path only guards (e.g. metadata), from host pointers;
  // operands the check does not read may be NULL. XGO_OK for ops that have none.
  int32_t (*check_host_values)(const XgoCall* call, const void* const* operands);
  void* cuda_ffi_handler;     // XLA_FFI_Handler*: typed FFI (api_version 4), platform CUDA
  void* host_ffi_handler;     // XLA_FFI_Handler*: typed FFI, platform Host (XLA:CPU)
  void* cuda_legacy_handler;  // legacy status-returning custom call (api_version 2), CUDA
} XgoOpInfo;

XGO_EXPORT int32_t xla_gpu_ops_abi_version(void);
// The op table: an array of *num_ops pointers.
XGO_EXPORT const XgoOpInfo* const* xla_gpu_ops_ops(int32_t* num_ops);
// Name of a dtype code ("bfloat16"), or NULL for an unknown code.
XGO_EXPORT const char* xla_gpu_ops_dtype_name(int32_t dtype);
// Message of the last non-OK status returned on this thread ("" if none).
XGO_EXPORT const char* xla_gpu_ops_last_error(void);
// sizeof() of "XgoCall", "XgoResults" or "XgoOpInfo" (-1 otherwise): bindings that mirror these
// structs (Python's ctypes) check their layout with it.
XGO_EXPORT int64_t xla_gpu_ops_sizeof(const char* type_name);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // XLA_GPU_OPS_C_API_H_
