// paged_attention: the static checks of a call and its entry in the op table. Every entry point
// (eager launch, typed FFI on CUDA and Host, legacy custom call) runs this Describe first, so they
// accept and reject the same calls with the same words.
#include <cmath>
#include <cstdint>

#include "core/op_binding.h"
#include "ops/paged_attention/paged_attention.h"
#include "ops/paged_attention/plan.h"

namespace xgo {
namespace {

constexpr const char* kOp = "paged_attention";
constexpr int64_t kMaxPageSize = 128;

int32_t Invalid(const char* argument, const char* what, long long value) {
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: %s, got %lld", argument, what, value);
}

// Limits of the plan's grids (the 32-bit limits of tokens, sequences and heads are checked before
// the plan is made, in Describe).
int32_t CheckKernelLimits(const PagedAttentionConfig& c, const PagedAttentionPlan& plan) {
  if (plan.num_head_blocks > 65535) {
    return Invalid("query", "num_q_heads is too large", c.num_q_heads);
  }
  if (plan.page_check_chunks > 65535) {
    return Invalid("block_tables", "too many pages per sequence", c.pages_per_seq);
  }
  if (plan.short_splits > 0) {  // one 1-D grid: prefill tiles (one split) + short blocks
    const int64_t tokens_per_tile = kPrefillBlockRows / plan.heads_per_block;
    const int64_t prefill_tiles = c.num_tokens / tokens_per_tile + c.max_num_seqs;
    const int64_t blocks =
        (prefill_tiles + c.max_num_seqs * plan.short_splits) * plan.num_head_blocks;
    if (blocks > INT32_MAX) return Invalid("query", "too many blocks", blocks);
  }
  return XGO_OK;
}

}  // namespace

int32_t PagedAttention::Describe(const OpCall<PagedAttention>& call, Config* config,
                                 XgoResults* results) {
  const Shape& query = call.operands[kQuery];
  const Shape& kv_cache = call.operands[kKvCache];
  const Shape& context_lens = call.operands[kContextLens];
  const Shape& block_tables = call.operands[kBlockTables];
  const Shape& query_start_loc = call.operands[kQueryStartLoc];
  const Shape& num_seqs = call.operands[kNumSeqs];
  const Shape& sinks = call.operands[kSinks];
  const Shape& value_cache = call.operands[kValueCache];
  constexpr int kRanks[] = {3, -1, 1, 2, 1, 1, 1, 1, 1};  // kv_cache, value_cache: below
  for (int i = 0; i < kValueCache; ++i) {
    if (kRanks[i] >= 0) {
      XGO_RETURN_IF_FAILED(CheckRank(kOp, kOperandNames[i], call.operands[i], kRanks[i]));
    }
  }
  KvCacheLayout kv{};
  XGO_RETURN_IF_FAILED(DescribeKvCaches(kOp, kv_cache, value_cache, call.attrs.kv_layout, &kv));
  XGO_RETURN_IF_FAILED(CheckDtype(kOp, "query", query, ComputeDtypes{}));
  if (kv_cache.dtype != query.dtype && kv_cache.dtype != XGO_F8E4M3FN) {
    return Fail(XGO_INVALID_DTYPE,
                "paged_attention: kv_cache: dtype %s is neither query's %s nor float8_e4m3fn",
                DtypeText(kv_cache.dtype).c_str(), DtypeText(query.dtype).c_str());
  }
  for (int i = kContextLens; i <= kNumSeqs; ++i) {
    XGO_RETURN_IF_FAILED(CheckDtype(kOp, kOperandNames[i], call.operands[i], DtypeSet<XGO_S32>{}));
  }
  XGO_RETURN_IF_FAILED(CheckDtype(kOp, "sinks", sinks, DtypeSet<XGO_F32>{}));
  if (sinks.dims[0] != 0 && sinks.dims[0] != query.dims[1]) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: sinks: shape must be (%lld,) (one per query head) or (0,) for "
                "none, got %s",
                static_cast<long long>(query.dims[1]), sinks.Text().c_str());
  }
  const int64_t head_dim = query.dims[2];
  if (kv.head_dim != head_dim) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: kv_cache: head_dim %lld differs from query's %lld",
                static_cast<long long>(kv.head_dim), static_cast<long long>(head_dim));
  }
  const int64_t max_num_seqs = context_lens.dims[0];
  if (block_tables.dims[0] != max_num_seqs) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: block_tables: dim 0 is %lld, context_lens has %lld",
                static_cast<long long>(block_tables.dims[0]), static_cast<long long>(max_num_seqs));
  }
  if (query_start_loc.dims[0] != max_num_seqs + 1) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: query_start_loc: shape must be (%lld,), got %s",
                static_cast<long long>(max_num_seqs + 1), query_start_loc.Text().c_str());
  }
  if (num_seqs.dims[0] != 1) {
    return Fail(XGO_INVALID_ARGUMENT, "paged_attention: num_seqs: shape must be (1,), got %s",
                num_seqs.Text().c_str());
  }
  Config& c = *config;
  c = Config{};
  c.dtype = query.dtype;
  c.kv_dtype = kv_cache.dtype;
  c.num_tokens = query.dims[0];
  c.num_q_heads = query.dims[1];
  c.head_dim = head_dim;
  c.kv = kv;
  c.max_num_seqs = max_num_seqs;
  c.pages_per_seq = block_tables.dims[1];
  c.sliding_window = call.attrs.sliding_window;
  c.scale = call.attrs.scale;
  c.soft_cap = call.attrs.soft_cap;
  c.k_scale = call.attrs.k_scale;
  c.v_scale = call.attrs.v_scale;
  c.has_sinks = sinks.dims[0] > 0;
  XGO_RETURN_IF_FAILED(CheckScales(kOp, "k_scale", call.operands[kKScales], c.kv.num_kv_heads));
  XGO_RETURN_IF_FAILED(CheckScales(kOp, "v_scale", call.operands[kVScales], c.kv.num_kv_heads));
  c.k_scales_len = call.operands[kKScales].dims[0];
  c.v_scales_len = call.operands[kVScales].dims[0];

  // num_tokens may be 0 (an empty batch launches nothing); every other dim must be positive.
  if (c.num_tokens < 0) return Invalid("query", "num_tokens must be >= 0", c.num_tokens);
  if (c.num_q_heads <= 0) return Invalid("query", "num_q_heads must be positive", c.num_q_heads);
  if (!IsSupportedHeadDim(c.head_dim)) {
    return Invalid("query",
                   "head_dim must be a multiple of 16 up to 256 (64, 80, 96, 128, 192, 256, ...)",
                   c.head_dim);
  }
  if (c.num_q_heads % c.kv.num_kv_heads != 0) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: query: num_q_heads %lld is not a multiple of num_kv_heads %lld",
                static_cast<long long>(c.num_q_heads), static_cast<long long>(c.kv.num_kv_heads));
  }
  if (c.kv.page_size < 1 || c.kv.page_size > kMaxPageSize) {
    return Invalid("kv_cache", "page_size must be in [1, 128]", c.kv.page_size);
  }
  if (c.max_num_seqs <= 0) {
    return Invalid("context_lens", "needs at least one sequence slot", c.max_num_seqs);
  }
  if (c.pages_per_seq <= 0) {
    return Invalid("block_tables", "needs at least one page per sequence", c.pages_per_seq);
  }
  // context_lens are int32: a capacity beyond that could never be addressed consistently.
  if (c.pages_per_seq > INT32_MAX / c.kv.page_size) {
    return Invalid("block_tables", "pages_per_seq * page_size must fit in int32", c.pages_per_seq);
  }
  if (c.sliding_window < 0) {
    return Invalid("sliding_window", "must be >= 0 (0 disables it)", c.sliding_window);
  }
  if (!std::isfinite(c.soft_cap) || c.soft_cap < 0.0f) {
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: soft_cap: must be finite and >= 0 (0 disables it), got %g",
                static_cast<double>(c.soft_cap));
  }
  if (!std::isfinite(c.scale)) {
    return Fail(XGO_INVALID_ARGUMENT, "paged_attention: scale: must be finite, got %g",
                static_cast<double>(c.scale));
  }
  for (const auto& [name, value] :
       {std::pair{"k_scale", c.k_scale}, std::pair{"v_scale", c.v_scale}}) {
    if (!std::isfinite(value) || value <= 0.0f) {
      return Fail(XGO_INVALID_ARGUMENT, "paged_attention: %s: must be finite and > 0, got %g", name,
                  static_cast<double>(value));
    }
  }
  if (!std::isfinite(c.scale * c.k_scale)) {  // the CUDA kernels take the product as one float
    return Fail(XGO_INVALID_ARGUMENT,
                "paged_attention: k_scale: scale * k_scale = %g * %g overflows float32",
                static_cast<double>(c.scale), static_cast<double>(c.k_scale));
  }
  // The plan multiplies these; keep them in range first.
  if (c.num_tokens > INT32_MAX / 2)
    return Invalid("query", "num_tokens is too large", c.num_tokens);
  if (c.max_num_seqs > INT32_MAX / 2) {
    return Invalid("context_lens", "too many sequence slots", c.max_num_seqs);
  }
  if (c.num_q_heads > INT32_MAX / c.head_dim) {
    return Invalid("query", "num_q_heads * head_dim is too large", c.num_q_heads * c.head_dim);
  }
  // Planned once, from the shapes: the workspace does not depend on the device, and the grid
  // limits are checked as on a device that runs the sm_90a kernel (an fp8 plan's short region
  // runs there). Launch places c.plan on its device.
  c.plan = PlanShapes(c);
  PlanDevice any_device;
  any_device.sm90_prefill = true;
  const PagedAttentionPlan& plan = c.plan;
  XGO_RETURN_IF_FAILED(CheckKernelLimits(c, PlaceOnDevice(c, plan, any_device)));

  results->results[0] = ToXgoShape(query);
  XgoShape& lse = results->results[1];
  lse.dtype = XGO_F32;
  lse.rank = 2;
  lse.dims[0] = c.num_tokens;
  lse.dims[1] = c.num_q_heads;
  XgoShape& workspace = results->results[2];
  workspace.dtype = XGO_F32;
  workspace.rank = 1;
  workspace.dims[0] = plan.workspace_elems;
  return XGO_OK;
}

}  // namespace xgo

using xgo::PagedAttention;
XGO_DEFINE_OP(PagedAttention);
