// Thread-local last-error message behind xla_gpu_ops_last_error() (c_api.h), shared by the
// launchers, the FFI handlers and the legacy custom calls. Nothing here throws.
#ifndef XLA_GPU_OPS_STATUS_H_
#define XLA_GPU_OPS_STATUS_H_

#include <stdint.h>

#include "xla_gpu_ops/c_api.h"

namespace xgo {

// Replaces this thread's last-error message (printf format, truncated to 1023 bytes).
void SetLastError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Sets the last error and returns `status` as the launcher's int32_t result:
//   return xgo::Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: ...");
int32_t Fail(XgoStatus status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Clears this thread's message (a later OK call should not show a stale error).
void ClearLastError();

}  // namespace xgo

#endif  // XLA_GPU_OPS_STATUS_H_
