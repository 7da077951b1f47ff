// Static validation of the config structs (c_api.h), shared by the launchers, the FFI handlers
// and the legacy custom calls so every entry point rejects the same things with the same words.
// Header-only (inline) so nvcc- and g++-compiled sources both use it. Checks static fields only;
// metadata values are never read here (see docs/DESIGN.md, "Bad input").
#ifndef XLA_GPU_OPS_CONFIG_CHECK_H_
#define XLA_GPU_OPS_CONFIG_CHECK_H_

#include <math.h>
#include <stdint.h>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/status.h"

namespace xgo {

constexpr uint32_t kConfigVersion = 1;
constexpr int64_t kMaxPageSize = 128;

inline bool IsSupportedDtype(int32_t dtype) {
  return dtype == XGO_F32 || dtype == XGO_F16 || dtype == XGO_BF16;
}

inline bool IsSupportedHeadDim(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// XGO_OK, or XGO_INVALID_ARGUMENT with the last error naming the offending argument.
inline XgoStatus CheckSimpleAddConfig(const XgoSimpleAddConfig& config) {
  if (config.magic != XGO_SIMPLE_ADD_MAGIC) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "simple_add: config: bad magic 0x%08x (expected 0x%08x)",
                                       config.magic, XGO_SIMPLE_ADD_MAGIC));
  }
  if (config.version != kConfigVersion) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "simple_add: config: version %u, this library reads %u",
                                       config.version, kConfigVersion));
  }
  if (!IsSupportedDtype(config.dtype)) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "simple_add: a: dtype code %d is not f32/f16/bf16",
                                       config.dtype));
  }
  if (config.num_elements < 0) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "simple_add: a: num_elements %lld is negative",
                                       static_cast<long long>(config.num_elements)));
  }
  return XGO_OK;
}

// Argument names in messages are those of the op (query, kv_cache, ...), not struct fields, so a
// user can tell which input to fix.
inline XgoStatus CheckPagedAttentionConfig(const XgoPagedAttentionConfig& c) {
  auto fail = [](const char* argument, const char* what, long long value) {
    return static_cast<XgoStatus>(
        Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: %s, got %lld", argument, what, value));
  };
  if (c.magic != XGO_PAGED_ATTENTION_MAGIC) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "paged_attention: config: bad magic 0x%08x (expected 0x%08x)",
                                       c.magic, XGO_PAGED_ATTENTION_MAGIC));
  }
  if (c.version != kConfigVersion) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "paged_attention: config: version %u, this library reads %u",
                                       c.version, kConfigVersion));
  }
  if (!IsSupportedDtype(c.dtype)) {
    return fail("query", "dtype code must be f32 (0), f16 (1) or bf16 (2)", c.dtype);
  }
  // num_tokens may be 0 (an empty batch launches nothing); every other dim must be positive.
  if (c.num_tokens < 0) return fail("query", "num_tokens must be >= 0", c.num_tokens);
  if (c.num_q_heads <= 0) return fail("query", "num_q_heads must be positive", c.num_q_heads);
  if (c.num_kv_heads <= 0) {
    return fail("kv_cache", "num_kv_heads (dim 2 / 2) must be positive", c.num_kv_heads);
  }
  if (!IsSupportedHeadDim(c.head_dim)) {
    return fail("query", "head_dim must be 64, 128 or 256", c.head_dim);
  }
  if (c.num_q_heads % c.num_kv_heads != 0) {
    return static_cast<XgoStatus>(
        Fail(XGO_INVALID_ARGUMENT,
             "paged_attention: query: num_q_heads %lld is not a multiple of num_kv_heads %lld",
             static_cast<long long>(c.num_q_heads), static_cast<long long>(c.num_kv_heads)));
  }
  if (c.num_pages <= 0) return fail("kv_cache", "num_pages must be positive", c.num_pages);
  if (c.page_size < 1 || c.page_size > kMaxPageSize) {
    return fail("kv_cache", "page_size must be in [1, 128]", c.page_size);
  }
  if (c.max_num_seqs <= 0) {
    return fail("context_lens", "max_num_seqs must be positive", c.max_num_seqs);
  }
  if (c.pages_per_seq <= 0) {
    return fail("block_tables", "pages_per_seq must be positive", c.pages_per_seq);
  }
  // context_lens are int32: a capacity beyond that could never be addressed consistently.
  if (c.pages_per_seq > INT32_MAX / c.page_size) {
    return fail("block_tables", "pages_per_seq * page_size must fit in int32", c.pages_per_seq);
  }
  if (c.sliding_window < 0) {
    return fail("sliding_window", "must be >= 0 (0 disables it)", c.sliding_window);
  }
  if (!isfinite(c.soft_cap) || c.soft_cap < 0.0f) {
    return static_cast<XgoStatus>(Fail(
        XGO_INVALID_ARGUMENT,
        "paged_attention: soft_cap: must be finite and >= 0 (0 disables it), got %g",
        static_cast<double>(c.soft_cap)));
  }
  if (!isfinite(c.scale)) {
    return static_cast<XgoStatus>(Fail(XGO_INVALID_ARGUMENT,
                                       "paged_attention: scale: must be finite, got %g",
                                       static_cast<double>(c.scale)));
  }
  return XGO_OK;
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_CONFIG_CHECK_H_
