// What every op shares, whatever front end calls it: the shapes of a call's operands as the
// static checks see them, attribute specs, and helpers whose messages name the argument.
//
// An op is a struct (see ops/simple_add/simple_add.cu, ops/paged_attention/paged_attention.h) with
//   kName, kOperandNames, kResultNames         names (std::array), in the order of every ABI
//   Attrs, kAttrs                              attribute struct and its (name, type, offset) list
//   Config                                     everything static a launch needs
//   Describe(const OpCall<Op>&, Config*, XgoResults*)   static checks + result shapes
//   Launch(const Config&, void* const* buffers, cudaStream_t)   GPU
//   RunHost(const Config&, void* const* buffers)   XLA:CPU handler
//   CheckHostValues(const Config&, const void* const* operands)   value checks, host copies
// op_binding.h turns such a struct into the entries of the library's op table (XGO_DEFINE_OP).
#ifndef XLA_GPU_OPS_OP_H_
#define XLA_GPU_OPS_OP_H_

#include <stddef.h>
#include <stdint.h>

#include <array>
#include <string>

#include "core/dtypes.h"
#include "core/kv_cache.h"
#include "core/status.h"
#include "xla_gpu_ops/c_api.h"

namespace xgo {

struct AttrSpec {
  const char* name;
  XgoAttrType type;
  size_t offset;  // of the member in Op::Attrs (float for F32, int64_t for I64)
};

// One operand as the static checks see it (no data).
struct Shape {
  int32_t dtype = -1;
  int rank = 0;
  int64_t dims[XGO_MAX_RANK] = {};

  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool SameDims(const Shape& other) const {
    if (rank != other.rank) return false;
    for (int i = 0; i < rank; ++i) {
      if (dims[i] != other.dims[i]) return false;
    }
    return true;
  }
  std::string Text() const;  // "(2, 3, 4)", "(5,)"
};

inline XgoShape ToXgoShape(const Shape& shape) {
  XgoShape out{};
  out.dtype = shape.dtype;
  out.rank = shape.rank;
  for (int i = 0; i < shape.rank; ++i) out.dims[i] = shape.dims[i];
  return out;
}

template <typename Op>
constexpr int NumOperands() {
  return static_cast<int>(Op::kOperandNames.size());
}
template <typename Op>
constexpr int NumResults() {
  return static_cast<int>(Op::kResultNames.size());
}
template <typename Op>
constexpr int NumAttrs() {
  return static_cast<int>(Op::kAttrs.size());
}

template <typename Op>
struct OpCall {
  Shape operands[NumOperands<Op>()];
  typename Op::Attrs attrs{};
};

// Check helpers: XGO_OK, or the status with the last error "<op>: <argument>: <what>".
int32_t CheckRank(const char* op, const char* argument, const Shape& shape, int rank);
// shape.dtype in Set, else XGO_INVALID_DTYPE naming the accepted types.
template <typename Set>
int32_t CheckDtype(const char* op, const char* argument, const Shape& shape, Set) {
  if (Set::Contains(shape.dtype)) return XGO_OK;
  return Fail(XGO_INVALID_DTYPE, "%s: %s: dtype %s is not %s", op, argument,
              DtypeText(shape.dtype).c_str(), Set::Names().c_str());
}
int32_t CheckSameDtype(const char* op, const char* argument, const Shape& shape,
                       const char* other_name, const Shape& other);
int32_t CheckSameDims(const char* op, const char* argument, const Shape& shape,
                      const char* other_name, const Shape& other);
// A dequantisation-scale tensor (k_scales, v_scales): rank 1, float32, 0 entries (none), 1 (one
// for every KV head) or num_kv_heads. Errors name `attribute`, how callers give it (k_scale).
int32_t CheckScales(const char* op, const char* attribute, const Shape& scales,
                    int64_t num_kv_heads);

// The kv_layout attribute of the ops that read or write a paged cache: its choice's index in
// xla_gpu_ops/ops.py KV_LAYOUT. The dims of a cache [P, a, b, D]: NHD a = page_size, b = heads;
// HND a = heads, b = page_size.
enum KvLayout : int64_t { kKvLayoutNhd = 0, kKvLayoutHnd = 1 };
inline int32_t CheckKvLayout(const char* op, int64_t layout) {
  if (layout == kKvLayoutNhd || layout == kKvLayoutHnd) return XGO_OK;
  return Fail(XGO_INVALID_ARGUMENT, "%s: kv_layout: %lld is neither 0 (NHD) nor 1 (HND)", op,
              static_cast<long long>(layout));
}

// Checks kv_cache and value_cache (absent: the [0] stand-in) against each other and kv_layout:
// ranks, the pair dimension, matching shapes and dtypes, positive dims, an even head count when
// interleaved; errors name `op` and the argument. Fills *layout. Dtypes against the other
// operands and head_dim against query's stay with the op.
int32_t DescribeKvCaches(const char* op, const Shape& kv_cache, const Shape& value_cache,
                         int64_t kv_layout, KvCacheLayout* layout);

// Adds an op to the library's table (XGO_DEFINE_OP, while the library loads); false when the
// table is full (the package then reports the op as missing).
bool RegisterOp(const XgoOpInfo* info);

#define XGO_RETURN_IF_FAILED(expr)                                                     \
  do {                                                                                 \
    if (const int32_t xgo_status_ = (expr); xgo_status_ != XGO_OK) return xgo_status_; \
  } while (0)

}  // namespace xgo

#endif  // XLA_GPU_OPS_OP_H_
