// paged_attention: the prep kernel, run before the prefill, 64-row and f32 kernels (decode tiles
// check their own sequences instead): it checks the device-side metadata once (flags in the
// workspace), zero-fills rows no sequence owns, NaN-fills everything if num_seqs /
// query_start_loc are inconsistent, and orders the short region's sequences.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PREP_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_PREP_CUH_

#include <limits.h>
#include <stdint.h>

#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// Sort key of the short region's slot order: the context length of a sequence of
// 1..short_tokens query tokens, INT_MIN for every other sequence (they go last).
__device__ __forceinline__ int ShortSequenceKey(const PagedAttentionParams& p, int seq) {
  const int q_len = p.query_start_loc[seq + 1] - p.query_start_loc[seq];
  return q_len >= 1 && q_len <= p.short_tokens ? p.context_lens[seq] : INT_MIN;
}

// Used before the prefill and f32 kernels; the 16-row tensor-core (decode) kernel checks its own
// sequence instead and a fill/merge kernel runs after it (LaunchAll).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionPrepKernel(const __grid_constant__ PagedAttentionParams p) {
  const int tid = threadIdx.x;
  const int n = *p.num_seqs;
  const bool ok = RowPartitionIsSound(p);
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
    p.flags[0] = ok ? 1 : 0;
    p.flags[kWorkCounterWord] = 0;  // NextPrefillItem's counter
  }

  // Short region: slot order longest short sequence first, so the longest decodes start in the
  // first wave and the short ones fill the tail (the launcher cannot see the lengths). A slot's
  // rank counts the sequences before it (longer, or as long with a smaller slot); each thread
  // counts its share with independent loads, then one block sum.
  if (p.short_splits > 0 && blockIdx.y == 0 && ok) {
    __shared__ int s_rank;
    for (int seq = blockIdx.x; seq < p.max_num_seqs; seq += gridDim.x) {
      if (seq >= n) {  // uniform over the block; slots past num_seqs keep their place
        if (tid == 0) p.short_order[seq] = seq;
        continue;
      }
      if (tid == 0) s_rank = 0;
      __syncthreads();
      const int key = ShortSequenceKey(p, seq);
      int before = 0;
#pragma unroll 4
      for (int j = tid; j < n; j += blockDim.x) {
        const int other = ShortSequenceKey(p, j);
        before += other > key || (other == key && j < seq);
      }
      for (int offset = 16; offset > 0; offset >>= 1) {
        before += __shfl_xor_sync(0xffffffffu, before, offset);
      }
      if (tid % 32 == 0 && before > 0) atomicAdd(&s_rank, before);
      __syncthreads();
      if (tid == 0) p.short_order[s_rank] = seq;
      __syncthreads();  // s_rank is read before the next slot resets it
    }
  }

  // Block (x, y) checks entries [y * kPrepPages, ...) of the used pages of sequences x, x +
  // gridDim.x..
  const int64_t capacity = static_cast<int64_t>(p.pages_per_seq) * p.page_size;
  for (int seq = blockIdx.x; seq < p.max_num_seqs; seq += gridDim.x) {
    if (!ok || seq >= n) continue;  // uniform over the block
    const int kv_len = p.context_lens[seq];
    const int q_len = p.query_start_loc[seq + 1] - p.query_start_loc[seq];
    const bool lens_ok = kv_len >= 0 && kv_len <= capacity && q_len <= kv_len;
    const int used_pages = lens_ok ? (kv_len + p.page_size - 1) / p.page_size : 0;
    const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.pages_per_seq;
    int bad_page = 0;
#pragma unroll
    for (int i = 0; i < kPrepPagesPerThread; ++i) {
      const int entry = static_cast<int>(blockIdx.y) * kPrepPages + i * kThreads + tid;
      if (entry < used_pages) {
        const int page = table[entry];
        bad_page |= page < 0 || page >= p.num_pages;
      }
    }
    const bool seq_ok = !__syncthreads_or(bad_page || !lens_ok);
    if (tid == 0) {
      p.flags[kFlagsHeader + static_cast<int64_t>(seq) * p.page_check_chunks + blockIdx.y] =
          seq_ok ? 1 : 0;
    }
  }
  if (blockIdx.y != 0) return;

  FillUnownedRows<T>(p, ok, ok ? p.query_start_loc[0] : 0, ok ? p.query_start_loc[n] : 0);
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PREP_CUH_
