// paged_attention: ragged paged attention with torch_xla `ragged_paged_attention` semantics
// (docs/DESIGN.md). The op struct of core/op.h; beside it: Describe in op.cc, Launch in launch.cu,
// RunHost and CheckHostValues in host.cc, the plan in plan.h, the kernels in their .cuh files.
//
//   query           [num_tokens, num_q_heads, head_dim]                 float32/float16/bfloat16
//   kv_cache        [num_pages, page_size, 2 * num_kv_heads, head_dim]  query's dtype or
//                   float8_e4m3fn (K even, V odd; fp8 with an f32 query: host handler only);
//                   with value_cache, K alone: [num_pages, page_size, num_kv_heads, head_dim]
//   context_lens    int32 [max_num_seqs]
//   block_tables    int32 [max_num_seqs, pages_per_seq]
//   query_start_loc int32 [max_num_seqs + 1]
//   num_seqs        int32 [1]
//   sinks           float32 [num_q_heads], or [0] for none: one logit per query head that joins
//                   the softmax's denominator and adds no value (gpt-oss; docs/DESIGN.md)
//   k_scales        float32 [num_kv_heads] or [1], or [0] for none: key scales read at run time,
//                   times k_scale (a tensor k_scale in the front ends)
//   v_scales        float32 [num_kv_heads] or [1], or [0]: value scales, times v_scale
//   value_cache     kv_cache's shape and dtype: V apart from K; or [0] (rank 1): interleaved
//   out             [num_tokens, num_q_heads, head_dim]                 query's dtype
//   lse             float32 [num_tokens, num_q_heads]: each row's log-sum-exp of its logits
//                   (natural log, after scale, k_scale and soft cap, the sink included); -inf
//                   on rows past query_start_loc[num_seqs]
//   workspace       float32 [plan.workspace_elems]: scratch, sized from static shapes only
// Attributes: scale (f32), sliding_window (i64, 0 = none), soft_cap (f32, 0 = none), k_scale and
// v_scale (f32, > 0; 1 = none): logits = q.k * scale * k_scale, out = softmax . v * v_scale (the
// dequantisation scales of an fp8 cache; K/V are never dequantised in memory).
// Metadata values live on the device and are never read by the host on the GPU path: the
// kernels guard them (NaN rows); CheckHostValues checks them on host copies.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_H_
#define XLA_GPU_OPS_PAGED_ATTENTION_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <array>

#include "core/op.h"
#include "ops/paged_attention/plan.h"

namespace xgo {

// Everything static a launch needs: dims from the operand shapes, dtypes, attributes.

struct PagedAttention {
  static constexpr const char* kName = "paged_attention";
  enum {
    kQuery,
    kKvCache,
    kContextLens,
    kBlockTables,
    kQueryStartLoc,
    kNumSeqs,
    kSinks,
    kKScales,
    kVScales,
    kValueCache
  };
  static constexpr std::array<const char*, 10> kOperandNames = {
      "query",    "kv_cache", "context_lens", "block_tables", "query_start_loc",
      "num_seqs", "sinks",    "k_scales",     "v_scales",     "value_cache"};
  enum { kOut = 10, kLse = 11, kWorkspace = 12 };  // buffer indices: results follow the operands
  static constexpr std::array<const char*, 3> kResultNames = {"out", "lse", "workspace"};
  struct Attrs {
    float scale;
    int64_t sliding_window;
    float soft_cap;
    float k_scale;
    float v_scale;
    int64_t kv_layout;  // KvLayout (core/op.h)
  };
  static constexpr std::array<AttrSpec, 6> kAttrs = {{
      {"scale", XGO_ATTR_F32, offsetof(Attrs, scale)},
      {"sliding_window", XGO_ATTR_I64, offsetof(Attrs, sliding_window)},
      {"soft_cap", XGO_ATTR_F32, offsetof(Attrs, soft_cap)},
      {"k_scale", XGO_ATTR_F32, offsetof(Attrs, k_scale)},
      {"v_scale", XGO_ATTR_F32, offsetof(Attrs, v_scale)},
      {"kv_layout", XGO_ATTR_I64, offsetof(Attrs, kv_layout)},
  }};
  // The call's static facts and its plan from the shapes, made once per call by Describe; Launch
  // places the plan on the device it runs on (PlaceOnDevice).
  struct Config : PagedAttentionConfig {
    PagedAttentionPlan plan;
  };

  static int32_t Describe(const OpCall<PagedAttention>& call, Config* config, XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config& config, const void* const* operands);
};

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_H_
