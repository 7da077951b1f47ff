// Library-wide plumbing: the op table (filled by XGO_DEFINE_OP as the library loads), dtype names,
// the thread-local last-error message (one per thread, so concurrent callers never see each other's
// errors) and the shared check helpers.
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/op.h"
#include "core/status.h"
#include "xla_gpu_ops/c_api.h"

namespace xgo {
namespace {

constexpr size_t kMaxMessage = 1024;
thread_local char last_error[kMaxMessage] = "";

void FormatLastError(const char* fmt, va_list args) {
  std::vsnprintf(last_error, kMaxMessage, fmt, args);
}

// The op table, in name order. Plain arrays: zero-initialised before any op's registration runs,
// whatever the order in which the library's files initialise.
constexpr int kMaxOps = 64;
const XgoOpInfo* ops[kMaxOps];
int32_t num_ops = 0;

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

bool RegisterOp(const XgoOpInfo* info) {
  if (num_ops == kMaxOps) return false;
  int at = num_ops++;
  for (; at > 0 && std::strcmp(ops[at - 1]->name, info->name) > 0; --at) ops[at] = ops[at - 1];
  ops[at] = info;
  return true;
}

std::string Shape::Text() const {
  std::string text = "(";
  for (int i = 0; i < rank; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + (rank == 1 ? ",)" : ")");
}

int32_t CheckRank(const char* op, const char* argument, const Shape& shape, int rank) {
  if (shape.rank == rank) return XGO_OK;
  return Fail(XGO_INVALID_ARGUMENT, "%s: %s: expected rank %d, got shape %s", op, argument, rank,
              shape.Text().c_str());
}

int32_t CheckSameDtype(const char* op, const char* argument, const Shape& shape,
                       const char* other_name, const Shape& other) {
  if (shape.dtype == other.dtype) return XGO_OK;
  return Fail(XGO_INVALID_DTYPE, "%s: %s: dtype %s differs from %s's %s", op, argument,
              DtypeText(shape.dtype).c_str(), other_name, DtypeText(other.dtype).c_str());
}

int32_t CheckScales(const char* op, const char* attribute, const Shape& scales,
                    int64_t num_kv_heads) {
  if (scales.rank != 1 || scales.dtype != XGO_F32) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: %s: a tensor must be float32 of shape [], [1] or [num_kv_heads = %lld], got "
                "%s %s",
                op, attribute, static_cast<long long>(num_kv_heads),
                DtypeText(scales.dtype).c_str(), scales.Text().c_str());
  }
  const int64_t n = scales.dims[0];
  if (n == 0 || n == 1 || n == num_kv_heads) return XGO_OK;
  return Fail(XGO_INVALID_ARGUMENT,
              "%s: %s: a tensor must have 1 or num_kv_heads = %lld entries (one per KV head), "
              "got shape %s",
              op, attribute, static_cast<long long>(num_kv_heads), scales.Text().c_str());
}

}  // namespace xgo

extern "C" {

XGO_EXPORT int32_t xla_gpu_ops_abi_version(void) { return XGO_ABI_VERSION; }

XGO_EXPORT const XgoOpInfo* const* xla_gpu_ops_ops(int32_t* num_ops) {
  if (num_ops != nullptr) *num_ops = xgo::num_ops;
  return xgo::ops;
}

XGO_EXPORT const char* xla_gpu_ops_dtype_name(int32_t dtype) { return xgo::DtypeName(dtype); }

XGO_EXPORT const char* xla_gpu_ops_last_error(void) { return xgo::last_error; }

XGO_EXPORT int64_t xla_gpu_ops_sizeof(const char* type_name) {
  if (type_name == nullptr) return -1;
  const std::string name = type_name;
  if (name == "XgoCall") return sizeof(XgoCall);
  if (name == "XgoResults") return sizeof(XgoResults);
  if (name == "XgoOpInfo") return sizeof(XgoOpInfo);
  return -1;
}

}  // extern "C"
