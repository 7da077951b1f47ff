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

int32_t CheckSameDims(const char* op, const char* argument, const Shape& shape,
                      const char* other_name, const Shape& other) {
  if (shape.SameDims(other)) return XGO_OK;
  return Fail(XGO_INVALID_ARGUMENT, "%s: %s: shape %s differs from %s's %s", op, argument,
              shape.Text().c_str(), other_name, other.Text().c_str());
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

int32_t DescribeKvCaches(const char* op, const Shape& kv_cache, const Shape& value_cache,
                         int64_t kv_layout, KvCacheLayout* layout) {
  XGO_RETURN_IF_FAILED(CheckKvLayout(op, kv_layout));
  const bool head_major = kv_layout == kKvLayoutHnd;
  // value_cache absent: the [0] array every front end passes for a left-out optional operand
  const bool separate = !(value_cache.rank == 1 && value_cache.dims[0] == 0);
  const bool paired = kv_cache.rank == 5;
  const char* dims_text =
      head_major ? "[P, heads, page_size, D] (kv_layout HND)" : "[P, page_size, heads, D]";
  if (kv_cache.rank != 4 && !paired) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: kv_cache: expected rank 4 %s or 5 [P, 2, ...] (K and V in one tensor), got "
                "shape %s",
                op, dims_text, kv_cache.Text().c_str());
  }
  if (paired && kv_cache.dims[1] != 2) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: kv_cache: a rank-5 cache is [P, 2, ...] with K at [:, 0] and V at [:, 1], got "
                "shape %s",
                op, kv_cache.Text().c_str());
  }
  if (paired && separate) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: value_cache: kv_cache %s already holds V at [:, 1]; leave value_cache out", op,
                kv_cache.Text().c_str());
  }
  if (separate) {
    XGO_RETURN_IF_FAILED(CheckRank(op, "value_cache", value_cache, 4));
    XGO_RETURN_IF_FAILED(CheckSameDtype(op, "value_cache", value_cache, "kv_cache", kv_cache));
    XGO_RETURN_IF_FAILED(CheckSameDims(op, "value_cache", value_cache, "kv_cache", kv_cache));
  }
  for (int d = 0; d < kv_cache.rank; ++d) {
    if (kv_cache.dims[d] <= 0) {
      return Fail(XGO_INVALID_ARGUMENT, "%s: kv_cache: shape %s has an empty dimension", op,
                  kv_cache.Text().c_str());
    }
  }
  // [P, (2,) a, b, D]: the dims of heads and of a page's rows
  const int first = paired ? 2 : 1;
  const int heads_dim = first + (head_major ? 0 : 1), page_dim = first + (head_major ? 1 : 0);
  const int64_t heads = kv_cache.dims[heads_dim];
  const bool interleaved = !separate && !paired;
  if (interleaved && heads % 2 != 0) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: kv_cache: dim %d must be 2 * num_kv_heads (%sK and V interleaved), got %lld; "
                "give value_cache for K and V in caches of their own, or one [P, 2, ...] cache",
                op, heads_dim, head_major ? "kv_layout HND, " : "", static_cast<long long>(heads));
  }
  KvCacheLayout& l = *layout;
  l.caches = separate ? KvCaches::kSeparate : paired ? KvCaches::kPaired : KvCaches::kInterleaved;
  l.head_major = head_major;
  l.num_pages = kv_cache.dims[0];
  l.page_size = kv_cache.dims[page_dim];
  l.num_kv_heads = interleaved ? heads / 2 : heads;
  l.head_dim = kv_cache.dims[kv_cache.rank - 1];
  // A page of one tensor's heads (block): every element offset of the cache must fit in int64,
  // and the row and head strides in the kernels' int32.
  int64_t rows = 0, block = 0, page = 0, elems = 0;
  if (__builtin_mul_overflow(heads, l.page_size, &rows) ||
      __builtin_mul_overflow(rows, l.head_dim, &block) ||
      __builtin_mul_overflow(block, paired ? 2 : 1, &page) ||
      __builtin_mul_overflow(page, l.num_pages, &elems) || 2 * block > INT32_MAX) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: kv_cache: shape %s is too large", op,
                kv_cache.Text().c_str());
  }
  // One head's extent: a row of D (NHD) or a page of rows (HND); interleaved V is the next head.
  const int64_t head_extent = head_major ? l.page_size * l.head_dim : l.head_dim;
  l.row_stride = head_major ? l.head_dim : heads * l.head_dim;
  l.head_stride = interleaved ? 2 * head_extent : head_extent;
  l.page_stride = page;
  l.v_offset = interleaved ? head_extent : paired ? block : 0;
  return XGO_OK;
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
