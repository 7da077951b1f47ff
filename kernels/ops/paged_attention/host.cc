// paged_attention on the host: the XLA:CPU handler (RunHost) and the metadata-value checks
// (CheckHostValues, also behind the eager wrapper's optional validation). The host has the
// metadata in memory, so unlike the CUDA path it checks it fully and fails with
// XGO_INVALID_ARGUMENT naming the argument.
//
// Numerics follow docs/DESIGN.md: products accumulated in f32, softmax in double, output
// rounded once to the input dtype (round-to-nearest-even).
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/host_types.h"
#include "core/scales.h"
#include "ops/paged_attention/paged_attention.h"

namespace xgo {
namespace {

using host::DispatchHost;

// The metadata rules the CUDA kernels guard with NaN rows (docs/DESIGN.md, "Bad input").
int32_t CheckMetadata(const PagedAttentionConfig& c, const int32_t* context_lens,
                      const int32_t* block_tables, const int32_t* query_start_loc,
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
  const int64_t capacity = c.pages_per_seq * c.kv.page_size;
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
    const int64_t used_pages = (kv_len + c.kv.page_size - 1) / c.kv.page_size;
    for (int64_t j = 0; j < used_pages; ++j) {
      const int64_t page = block_tables[i * c.pages_per_seq + j];
      if (page < 0 || page >= c.kv.num_pages) {
        return Fail(XGO_INVALID_ARGUMENT,
                    "paged_attention: block_tables: sequence %lld, entry %lld is page %lld, "
                    "outside [0, %lld)",
                    static_cast<long long>(i), static_cast<long long>(j),
                    static_cast<long long>(page), static_cast<long long>(c.kv.num_pages));
      }
    }
  }
  return XGO_OK;
}

// T: query and out; KV: the cache (T, or float8_e4m3fn read through the scales).
template <typename T, typename KV>
int32_t AttentionTyped(const PagedAttentionConfig& c, const void* query, const void* kv_cache,
                       const int32_t* context_lens, const int32_t* block_tables,
                       const int32_t* query_start_loc, const int32_t* num_seqs, const float* sinks,
                       const float* k_scales, const float* v_scales, const void* value_cache,
                       void* out, float* lse) {
  using S = typename T::Storage;
  using KS = typename KV::Storage;
  const S* q_data = static_cast<const S*>(query);
  const KS* kv_data = static_cast<const KS*>(kv_cache);
  S* out_data = static_cast<S*>(out);
  const int64_t D = c.head_dim;
  const int64_t group = c.num_q_heads / c.kv.num_kv_heads;
  // V: its own cache, or kv_cache from v_offset on (KvCacheLayout strides)
  const KS* v_data =
      c.kv.separate() ? static_cast<const KS*>(value_cache) : kv_data + c.kv.v_offset;
  const int64_t page_stride = c.kv.page_stride, row_stride = c.kv.row_stride;
  const int64_t head_stride = c.kv.head_stride;
  const bool capped = c.soft_cap > 0.0f;
  const KvScales scales =
      MakeKvScales(c.k_scale, c.v_scale, c.k_scales_len, c.v_scales_len, k_scales, v_scales);

  // Every row no sequence writes (padding, and any before query_start_loc[0]) is zero.
  for (int64_t i = 0; i < c.num_tokens * c.num_q_heads * D; ++i) out_data[i] = T::Store(0.0f);
  std::fill(lse, lse + c.num_tokens * c.num_q_heads, -std::numeric_limits<float>::infinity());

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
    for (int64_t kv_head = 0; kv_head < c.kv.num_kv_heads; ++kv_head) {
      const double k_scale = scales.K(kv_head);
      const double v_scale = scales.V(kv_head);
      // Gather this sequence's K and V rows for one kv head from its pages, as float.
      for (int64_t pos = 0; pos < kv_len; ++pos) {
        const int64_t page = block_tables[seq * c.pages_per_seq + pos / c.kv.page_size];
        const int64_t at =
            page * page_stride + (pos % c.kv.page_size) * row_stride + kv_head * head_stride;
        const KS* k = kv_data + at;
        const KS* v = v_data + at;
        for (int64_t d = 0; d < D; ++d) {
          keys[pos * D + d] = KV::Load(k[d]);
          values[pos * D + d] = KV::Load(v[d]);
        }
      }
      for (int64_t r = 0; r < q_len; ++r) {
        // Query row r is token kv_len - q_len + r: causal up to it, window above pos - w.
        const int64_t q_pos = kv_len - q_len + r;
        const int64_t first_key = c.sliding_window > 0 && q_pos - c.sliding_window + 1 > 0
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
            double logit = static_cast<double>(dot) * c.scale * k_scale;
            if (capped) logit = c.soft_cap * std::tanh(logit / c.soft_cap);
            probs[pos] = logit;
            if (logit > max_logit) max_logit = logit;
          }
          // A sink joins the denominator as one more logit, unscaled and uncapped.
          if (sinks != nullptr) max_logit = std::max(max_logit, static_cast<double>(sinks[h]));
          double denominator = sinks != nullptr ? std::exp(sinks[h] - max_logit) : 0.0;
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
          for (int64_t d = 0; d < D; ++d) o[d] = T::Store(static_cast<float>(acc[d] * v_scale));
          if (denominator > 0.0) {
            lse[(q_start + r) * c.num_q_heads + h] =
                static_cast<float>(max_logit + std::log(denominator));
          }
        }
      }
    }
  }
  return XGO_OK;
}

// out = ragged paged attention (docs/DESIGN.md), metadata checked first.
int32_t Attention(const PagedAttentionConfig& c, const void* query, const void* kv_cache,
                  const int32_t* context_lens, const int32_t* block_tables,
                  const int32_t* query_start_loc, const int32_t* num_seqs, const float* sinks,
                  const float* k_scales, const float* v_scales, const void* value_cache, void* out,
                  float* lse) {
  XGO_RETURN_IF_FAILED(CheckMetadata(c, context_lens, block_tables, query_start_loc, num_seqs));
  return DispatchHost(
      ComputeDtypes{}, c.dtype, "paged_attention: query", [&](auto type) -> int32_t {
        using T = typename decltype(type)::Type;
        if (c.kv_dtype == XGO_F8E4M3FN) {
          return AttentionTyped<T, host::F8E4M3FN>(c, query, kv_cache, context_lens, block_tables,
                                                   query_start_loc, num_seqs, sinks, k_scales,
                                                   v_scales, value_cache, out, lse);
        }
        return AttentionTyped<T, T>(c, query, kv_cache, context_lens, block_tables, query_start_loc,
                                    num_seqs, sinks, k_scales, v_scales, value_cache, out, lse);
      });
}

}  // namespace

int32_t PagedAttention::CheckHostValues(const Config& c, const void* const* operands) {
  for (int i = kContextLens; i <= kNumSeqs; ++i) {
    if (operands[i] == nullptr) {
      return Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: pointer is NULL", kOperandNames[i]);
    }
  }
  return CheckMetadata(c, static_cast<const int32_t*>(operands[kContextLens]),
                       static_cast<const int32_t*>(operands[kBlockTables]),
                       static_cast<const int32_t*>(operands[kQueryStartLoc]),
                       static_cast<const int32_t*>(operands[kNumSeqs]));
}

int32_t PagedAttention::RunHost(const Config& c, void* const* buffers) {
  return Attention(
      c, buffers[kQuery], buffers[kKvCache], static_cast<const int32_t*>(buffers[kContextLens]),
      static_cast<const int32_t*>(buffers[kBlockTables]),
      static_cast<const int32_t*>(buffers[kQueryStartLoc]),
      static_cast<const int32_t*>(buffers[kNumSeqs]),
      c.has_sinks ? static_cast<const float*>(buffers[kSinks]) : nullptr,
      static_cast<const float*>(buffers[kKScales]), static_cast<const float*>(buffers[kVScales]),
      buffers[kValueCache], buffers[kOut], static_cast<float*>(buffers[kLse]));
}

}  // namespace xgo
