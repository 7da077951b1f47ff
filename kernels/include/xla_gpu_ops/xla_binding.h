// Helpers shared by the per-op XLA bindings (src/*_xla.cc): dtype mapping from XLA FFI buffers,
// XgoStatus -> ffi::Error, and failure reporting for legacy (api_version 2) custom calls.
#ifndef XLA_GPU_OPS_XLA_BINDING_H_
#define XLA_GPU_OPS_XLA_BINDING_H_

#include <stdint.h>

#include <string>

#include "xla/ffi/api/ffi.h"
#include "xla_gpu_ops/c_api.h"

// XLA's opaque status handle of legacy custom calls (xla/service/custom_call_status.h).
typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;

namespace xgo {

// The XgoDtype of a floating-point FFI buffer, or -1 for a dtype the ops do not support.
inline int32_t ToXgoDtype(xla::ffi::DataType dtype) {
  switch (dtype) {
    case xla::ffi::DataType::F32:
      return XGO_F32;
    case xla::ffi::DataType::F16:
      return XGO_F16;
    case xla::ffi::DataType::BF16:
      return XGO_BF16;
    default:
      return -1;
  }
}

// Launcher status -> FFI error carrying this thread's last-error message.
xla::ffi::Error ToFfiError(int32_t status);

// Shape as "(2, 3, 4)" for error messages.
std::string ShapeString(xla::ffi::AnyBuffer::Dimensions dims);

// Marks a legacy custom call as failed with `message`; never throws, never aborts.
void SetLegacyFailure(XlaCustomCallStatus* status, const char* message);

}  // namespace xgo

#endif  // XLA_GPU_OPS_XLA_BINDING_H_
