// paged_attention: the kernels' parameters: PagedAttentionParams (one __grid_constant__ struct
// for every kernel), the page-size divisor and the prefill launches' grid (PrefillGrid). Plain
// C++: the launchers fill them.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PARAMS_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_PARAMS_CUH_

#include <stdint.h>

#include "ops/paged_attention/plan.h"

namespace xgo {

// Division by a runtime constant (the page size) as a multiply-high and a shift, valid for
// dividends in [0, 2^31): every key index. A plain '/' by a runtime int costs ~20 dependent
// instructions per key and showed as the top stall of the decode kernel.
struct FastDivisor {
  int32_t divisor;
  uint32_t multiplier;
  int32_t shift;
};

inline FastDivisor MakeFastDivisor(int32_t divisor) {
  FastDivisor f{divisor, 0, 0};
  if (divisor != 1) {
    int log2_ceil = 0;
    while ((int64_t{1} << log2_ceil) < divisor) ++log2_ceil;
    const int p = 31 + log2_ceil;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << p) + divisor - 1) / divisor);
    f.shift = p - 32;
  }
  return f;
}

struct PagedAttentionParams {
  const void* query;
  const void* kv_cache;  // K (and V at + head_dim when interleaved)
  // V's address minus K's, in elements: head_dim when interleaved, else value_cache - kv_cache
  // (one 64-bit parameter read where a V row is addressed, not a second pointer in registers).
  int64_t v_offset;
  // Elements between a cache's pages, a page's rows and its KV heads, the same for K and V
  // (KvCacheLayout, core/kv_cache.h: NHD or HND, interleaved, separate or paired).
  int64_t kv_page_stride;
  int kv_row_stride;
  int kv_head_stride;
  const int32_t* context_lens;
  const int32_t* block_tables;
  const int32_t* query_start_loc;
  const int32_t* num_seqs;
  void* out;
  float* lse;          // [T, Hq]: each finished row's log-sum-exp (natural log, sink included)
  const float* sinks;  // [Hq], or nullptr: one more logit per query head in each row's softmax
  // Scales per KV head (entry kv_head * stride; stride 0: one entry), or nullptr: k_scales
  // multiply `scale` per block (TileWork::scale), v_scales the output (ScaleRowsKernel).
  const float* k_scales;
  const float* v_scales;
  int k_scale_stride, v_scale_stride;
  int32_t* flags;            // workspace words [0, state_offset)
  PartState* partial_state;  // [splits, T, Hq]
  float* partial_out;        // [splits, T, Hq, part_dim]
  // Row length of partial_out and short_out: the kernel's width (KernelHeadDim), so the kernels
  // that store a split's rows from their accumulators store them whole, padded columns included,
  // without a test; the merge reads head_dim of each.
  int part_dim;
  int num_tokens, num_q_heads, num_kv_heads, head_dim, num_pages, page_size, max_num_seqs,
      pages_per_seq;
  int group_size, heads_per_block, tokens_per_tile, num_splits, page_check_chunks;
  FastDivisor page_size_div;
  int sliding_window;     // 0: off
  float scale, soft_cap;  // soft_cap 0: off
  // Short sequences of a prefill-like batch (PagedAttentionPlan::short_splits): q_len <=
  // short_tokens; short_splits 0 when there is no short region.
  PartState* short_state;  // [short_splits, S, short_tokens, Hq]
  float* short_out;        // [short_splits, S, short_tokens, Hq, part_dim]
  int* short_order;        // [S]: written by the prep kernel
  int short_tokens, short_splits;
  // Decode kernel grid: (head blocks, q tiles, splits) when set, else (q tiles, head blocks,
  // splits).
  int head_blocks_fastest;
};

// The launch's block counts: prefill blocks and short sequence blocks (S x head blocks x
// short_splits; 0 without a short region). The prefill region has prefill_items work items per
// split (num_q_tiles x head blocks, FindPrefillTile): one per block (prefill_blocks = items x
// splits), or, for a persistent launch (one split), prefill_blocks blocks that take every item
// from NextPrefillItem.
struct PrefillGrid {
  int64_t num_q_tiles;
  int prefill_blocks;
  int short_blocks;
  int prefill_items;
  bool persistent;
};

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PARAMS_CUH_
