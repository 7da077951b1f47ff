// Library-wide plumbing: ABI version, config sizes for the Python mirror, and the thread-local
// last-error message (one per thread, so concurrent callers never see each other's errors).
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/status.h"

namespace xgo {
namespace {

constexpr size_t kMaxMessage = 1024;
thread_local char last_error[kMaxMessage] = "";

void FormatLastError(const char* fmt, va_list args) {
  std::vsnprintf(last_error, kMaxMessage, fmt, args);
}

}  // namespace

void SetLastError(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  FormatLastError(fmt, args);
  va_end(args);
}

int32_t Fail(XgoStatus status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  FormatLastError(fmt, args);
  va_end(args);
  return static_cast<int32_t>(status);
}

void ClearLastError() { last_error[0] = '\0'; }

}  // namespace xgo

extern "C" {

XGO_EXPORT const char* xla_gpu_ops_last_error(void) { return xgo::last_error; }

XGO_EXPORT int32_t xla_gpu_ops_abi_version(void) { return XGO_ABI_VERSION; }

XGO_EXPORT int64_t xla_gpu_ops_config_size(const char* op_name) {
  if (op_name == nullptr) return -1;
  if (std::strcmp(op_name, "simple_add") == 0) return sizeof(XgoSimpleAddConfig);
  if (std::strcmp(op_name, "paged_attention") == 0) return sizeof(XgoPagedAttentionConfig);
  return -1;
}

}  // extern "C"
