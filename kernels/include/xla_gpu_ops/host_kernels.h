// Host (XLA:CPU) implementations of the ops: the typed FFI handlers registered for platform Host
// call these. They read the metadata on the host (it is there already), so unlike the CUDA path
// they fully validate it and fail with XGO_INVALID_ARGUMENT naming the argument.
//
// Numerics follow docs/DESIGN.md: products accumulated in f32, softmax in double, output
// rounded once to the input dtype (round-to-nearest-even).
#ifndef XLA_GPU_OPS_HOST_KERNELS_H_
#define XLA_GPU_OPS_HOST_KERNELS_H_

#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/status.h"

namespace xgo {
namespace host {

// ------------------------------------------------------------------ 16-bit float conversions
// Written out (not _Float16 / __bf16) so any host compiler builds them with identical results.

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float Bf16ToFloat(uint16_t bf16) { return BitsToFloat(static_cast<uint32_t>(bf16) << 16); }

inline uint16_t FloatToBf16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet bit set)
  }
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is correct (and
  // rounds the largest finite values up to infinity exactly when they should).
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);  // signed zero
    // Subnormal half: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a multiple of 2^-24. Scaling by
    // 2^24 is exact, and nearbyint rounds to nearest even in the default rounding mode.
    const float scaled = BitsToFloat(magnitude) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  const uint32_t rounded = magnitude + 0x0fffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// Element access by XgoDtype, so the kernels below are written once.
struct F32 {
  using Storage = float;
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};
struct F16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
struct BF16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return Bf16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBf16(v); }
};

// Calls fn(F32{}) / fn(F16{}) / fn(BF16{}) for the dtype code; an unknown code is an error.
template <typename Fn>
int32_t DispatchDtype(int32_t dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case XGO_F32:
      return fn(F32{});
    case XGO_F16:
      return fn(F16{});
    case XGO_BF16:
      return fn(BF16{});
  }
  return Fail(XGO_INVALID_ARGUMENT, "%s: dtype code %d is not f32/f16/bf16", op, dtype);
}

// ------------------------------------------------------------------ simple_add
// The sum is formed in f32 and rounded once: for f16/bf16 inputs this equals the correctly
// rounded sum (f32 has more than 2p+2 bits, so the double rounding is innocuous).
inline int32_t SimpleAdd(const XgoSimpleAddConfig& config, const void* a, const void* b,
                         void* out) {
  return DispatchDtype(config.dtype, "simple_add", [&](auto type) -> int32_t {
    using T = decltype(type);
    using S = typename T::Storage;
    const S* lhs = static_cast<const S*>(a);
    const S* rhs = static_cast<const S*>(b);
    S* sum = static_cast<S*>(out);
    for (int64_t i = 0; i < config.num_elements; ++i) {
      sum[i] = T::Store(T::Load(lhs[i]) + T::Load(rhs[i]));
    }
    return XGO_OK;
  });
}

// ------------------------------------------------------------------ paged_attention

// Checks the metadata values against the static config (the rules of
// xla_gpu_ops._validation.check_paged_attention_metadata). XGO_OK or XGO_INVALID_ARGUMENT.
inline int32_t CheckPagedAttentionMetadata(const XgoPagedAttentionConfig& c,
                                           const int32_t* context_lens,
                                           const int32_t* block_tables,
                                           const int32_t* query_start_loc,
                                           const int32_t* num_seqs) {
  const int64_t n = num_seqs[0];
  if (n < 0 || n > c.max_num_seqs) {
    return Fail(XGO_INVALID_ARGUMENT, "paged_attention: num_seqs: %lld is outside [0, %lld]",
                static_cast<long long>(n), static_cast<long long>(c.max_num_seqs));
  }
  for (int64_t i = 0; i <= n; ++i) {
    const int64_t start = query_start_loc[i];
    if (start < 0 || start > c.num_tokens) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "paged_attention: query_start_loc: entry %lld is %lld, outside [0, %lld]",
                  static_cast<long long>(i), static_cast<long long>(start),
                  static_cast<long long>(c.num_tokens));
    }
    if (i > 0 && start < query_start_loc[i - 1]) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "paged_attention: query_start_loc: must be non-decreasing, entry %lld is %lld "
                  "after %lld",
                  static_cast<long long>(i), static_cast<long long>(start),
                  static_cast<long long>(query_start_loc[i - 1]));
    }
  }
  const int64_t capacity = c.pages_per_seq * c.page_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t kv_len = context_lens[i];
    const int64_t q_len = static_cast<int64_t>(query_start_loc[i + 1]) - query_start_loc[i];
    if (kv_len < 0 || kv_len > capacity) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "paged_attention: context_lens: sequence %lld has %lld tokens; must be in "
                  "[0, %lld] (pages_per_seq * page_size)",
                  static_cast<long long>(i), static_cast<long long>(kv_len),
                  static_cast<long long>(capacity));
    }
    if (q_len > kv_len) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "paged_attention: context_lens: sequence %lld: q_len %lld exceeds context_len "
                  "%lld",
                  static_cast<long long>(i), static_cast<long long>(q_len),
                  static_cast<long long>(kv_len));
    }
    const int64_t used_pages = (kv_len + c.page_size - 1) / c.page_size;
    for (int64_t j = 0; j < used_pages; ++j) {
      const int64_t page = block_tables[i * c.pages_per_seq + j];
      if (page < 0 || page >= c.num_pages) {
        return Fail(XGO_INVALID_ARGUMENT,
                    "paged_attention: block_tables: sequence %lld, entry %lld is page %lld, "
                    "outside [0, %lld)",
                    static_cast<long long>(i), static_cast<long long>(j),
                    static_cast<long long>(page), static_cast<long long>(c.num_pages));
      }
    }
  }
  return XGO_OK;
}

// out = ragged paged attention (docs/DESIGN.md). The config must already have passed
// CheckPagedAttentionConfig; the metadata is checked here.
inline int32_t PagedAttention(const XgoPagedAttentionConfig& c, const void* query,
                              const void* kv_cache, const int32_t* context_lens,
                              const int32_t* block_tables, const int32_t* query_start_loc,
                              const int32_t* num_seqs, void* out) {
  if (int32_t status =
          CheckPagedAttentionMetadata(c, context_lens, block_tables, query_start_loc, num_seqs);
      status != XGO_OK) {
    return status;
  }
  return DispatchDtype(c.dtype, "paged_attention", [&](auto type) -> int32_t {
    using T = decltype(type);
    using S = typename T::Storage;
    const S* q_data = static_cast<const S*>(query);
    const S* kv_data = static_cast<const S*>(kv_cache);
    S* out_data = static_cast<S*>(out);
    const int64_t D = c.head_dim;
    const int64_t group = c.num_q_heads / c.num_kv_heads;
    const int64_t combined_heads = 2 * c.num_kv_heads;
    const bool capped = c.soft_cap > 0.0f;

    // Every row no sequence writes (padding, and any before query_start_loc[0]) is zero.
    for (int64_t i = 0; i < c.num_tokens * c.num_q_heads * D; ++i) out_data[i] = T::Store(0.0f);

    std::vector<float> keys, values, q_row(D);
    std::vector<double> probs;
    std::vector<double> acc(D);
    for (int64_t seq = 0; seq < num_seqs[0]; ++seq) {
      const int64_t q_start = query_start_loc[seq];
      const int64_t q_len = query_start_loc[seq + 1] - q_start;
      const int64_t kv_len = context_lens[seq];
      if (q_len == 0) continue;
      keys.resize(kv_len * D);
      values.resize(kv_len * D);
      probs.resize(kv_len);
      for (int64_t kv_head = 0; kv_head < c.num_kv_heads; ++kv_head) {
        // Gather this sequence's K and V rows for one kv head from its pages, as float.
        for (int64_t pos = 0; pos < kv_len; ++pos) {
          const int64_t page = block_tables[seq * c.pages_per_seq + pos / c.page_size];
          const S* slot = kv_data + ((page * c.page_size + pos % c.page_size) * combined_heads) * D;
          const S* k = slot + (2 * kv_head) * D;
          const S* v = slot + (2 * kv_head + 1) * D;
          for (int64_t d = 0; d < D; ++d) {
            keys[pos * D + d] = T::Load(k[d]);
            values[pos * D + d] = T::Load(v[d]);
          }
        }
        for (int64_t r = 0; r < q_len; ++r) {
          // Query row r is token kv_len - q_len + r: causal up to it, window above pos - w.
          const int64_t q_pos = kv_len - q_len + r;
          const int64_t first_key =
              c.sliding_window > 0 && q_pos - c.sliding_window + 1 > 0
                  ? q_pos - c.sliding_window + 1
                  : 0;
          for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
            const S* q = q_data + ((q_start + r) * c.num_q_heads + h) * D;
            for (int64_t d = 0; d < D; ++d) q_row[d] = T::Load(q[d]);
            double max_logit = -std::numeric_limits<double>::infinity();
            for (int64_t pos = first_key; pos <= q_pos; ++pos) {
              float dot = 0.0f;
              const float* k = &keys[pos * D];
              for (int64_t d = 0; d < D; ++d) dot += q_row[d] * k[d];
              double logit = static_cast<double>(dot) * c.scale;
              if (capped) logit = c.soft_cap * std::tanh(logit / c.soft_cap);
              probs[pos] = logit;
              if (logit > max_logit) max_logit = logit;
            }
            double denominator = 0.0;
            for (int64_t pos = first_key; pos <= q_pos; ++pos) {
              probs[pos] = std::exp(probs[pos] - max_logit);
              denominator += probs[pos];
            }
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t pos = first_key; pos <= q_pos; ++pos) {
              const double weight = probs[pos] / denominator;
              const float* v = &values[pos * D];
              for (int64_t d = 0; d < D; ++d) acc[d] += weight * v[d];
            }
            S* o = out_data + ((q_start + r) * c.num_q_heads + h) * D;
            for (int64_t d = 0; d < D; ++d) o[d] = T::Store(static_cast<float>(acc[d]));
          }
        }
      }
    }
    return XGO_OK;
  });
}

}  // namespace host
}  // namespace xgo

#endif  // XLA_GPU_OPS_HOST_KERNELS_H_
