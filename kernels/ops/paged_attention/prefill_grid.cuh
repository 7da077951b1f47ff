// paged_attention: the grid of a prefill launch, shared by the mma.sync and the sm_90a prefill
// kernels (PrefillGrid, params.cuh): which blocks run prefill tiles and which the short region's
// decodes, each block's work item, and the persistent blocks' work counter.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_GRID_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_GRID_CUH_

#include <stdint.h>

#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// A persistent block's next prefill item (prefill_items: none left): items go one at a time, in
// index order (heaviest first), to whichever block asks first, through the workspace counter the
// prep kernel zeroed; so blocks that start late (beside short blocks, or on a busy GPU) or drew
// short (causal, early) tiles take fewer or more of them.
__device__ __forceinline__ int NextPrefillItem(const PagedAttentionParams& p,
                                               const PrefillGrid& g) {
  return min(g.prefill_items, atomicAdd(p.flags + kWorkCounterWord, 1));
}

// This block's region and its index in it: short and prefill blocks alternate while both last,
// so the memory-bound and the tensor-bound kind share the GPU instead of following each other
// (short blocks first, or prefill first: 1 % slower on the mixed batch, H200).
__device__ __forceinline__ bool IsShortBlock(const PrefillGrid& g, int& index) {
  const int linear = static_cast<int>(blockIdx.x);
  const int pairs = min(g.prefill_blocks, g.short_blocks);
  if (linear < 2 * pairs) {
    index = linear / 2;
    return (linear & 1) == 0;
  }
  index = linear - pairs;
  return g.short_blocks > g.prefill_blocks;
}

// Short region block `index` -> (rank, head block, split), split fastest; rank -> sequence by the
// prep kernel's short_order (longest first). Only sequences of 1..short_tokens query tokens (one
// 16-row tile); the prefill region skips them.
__device__ __forceinline__ bool FindShortTile(const PagedAttentionParams& p, int index,
                                              TileWork& w) {
  if (p.flags[0] == 0) return false;
  const int num_head_blocks = p.num_q_heads / p.heads_per_block;
  const int rest = index / p.short_splits;
  const int rank = rest / num_head_blocks;
  const int n = *p.num_seqs;  // sound (flags[0])
  if (rank >= n) return false;
  const int seq = p.short_order[rank];
  if (seq < 0 || seq >= n) return false;  // a permutation of [0, n) when flags[0] holds
  const int start = p.query_start_loc[seq];
  const int end = p.query_start_loc[seq + 1];
  if (end - start < 1 || end - start > p.short_tokens) return false;
  SetSequenceTile(p, seq, start, end, start, end, (rest % num_head_blocks) * p.heads_per_block, w);
  w.split = index % p.short_splits;
  w.num_splits = p.short_splits;
  w.by_sequence = true;
  w.seq_ok = SequenceChecked(p, seq);
  return true;
}

// Tile lookup as FindTile, but the linear block index walks head blocks fastest and the heaviest
// (last) q tiles of every head first, so the long causal blocks all start in the first wave.
// index: the block's place in the prefill region of split blockIdx.z (a launch with a short
// region has one split and a 1-D grid).
__device__ __forceinline__ bool FindPrefillTile(const PagedAttentionParams& p, int64_t num_q_tiles,
                                                int index, TileWork& w) {
  if (p.flags[0] == 0) return false;
  const int num_head_blocks = p.num_q_heads / p.heads_per_block;
  const int64_t linear = index;
  const int head_block = static_cast<int>(linear % num_head_blocks);
  const int x = static_cast<int>(num_q_tiles - 1 - linear / num_head_blocks);
  const int n = *p.num_seqs;
  const int bq = p.tokens_per_tile;
  const int found = BisectSequenceOfTile(p, x, n, bq);
  if (found < 0) return false;
  const int start = p.query_start_loc[found];
  const int end = p.query_start_loc[found + 1];
  const int tok0 = start + (x - (start / bq + found)) * bq;
  if (tok0 >= end) return false;
  if (p.short_splits > 0 && end - start <= p.short_tokens) return false;  // a short block's
  SetSequenceTile(p, found, start, end, tok0, min(tok0 + bq, end), head_block * p.heads_per_block,
                  w);
  w.split = blockIdx.z;
  w.num_splits = p.num_splits;
  w.by_sequence = false;
  w.seq_ok = SequenceChecked(p, found);
  return true;
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_GRID_CUH_
