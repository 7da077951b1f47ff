// paged_attention: the kernels after the attention kernel: the fill kernel (after decode tiles
// without KV splits: the rows no sequence owns, or NaN everywhere) and the split merge (the
// parts of a row's KV splits weighed by their softmax states).
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_MERGE_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_MERGE_CUH_

#include <math.h>
#include <stdint.h>

#include "core/dtypes.cuh"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// After the decode kernel (no prep kernel ran): rows no sequence owns get zeros, every row gets
// NaN when flags[0] (written by the decode kernel's block 0) says the row partition is broken.
// One block per token (grid-stride); used when there are no splits to merge.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionFillKernel(const __grid_constant__ PagedAttentionParams p) {
  WaitForPreviousKernel();
  AllowNextKernelToLaunch();
  const bool ok = p.flags[0] != 0;
  FillUnownedRows<T>(p, ok, ok ? p.query_start_loc[0] : 0, ok ? p.query_start_loc[*p.num_seqs] : 0);
}

// One block per part row: 4 groups of 32 lanes, each sums every 4th split (4 float columns per
// lane) weighed against the group's maximum, then the groups are combined through shared memory.
// The split parts are loaded before the row's ownership is known (workspace reads are always in
// bounds), so the parts, their states and the metadata arrive in one round trip instead of three
// dependent ones.
//   kTokens: a row per (token, q head), after the prefill / f32 kernels (the prep kernel wrote
//     the zero / NaN rows).
//   kTokensAndFill: the same after the decode kernel; this kernel also writes the zero / NaN rows
//     of PagedAttentionFillKernel.
//   kShortSequences: a row per (sequence slot, token of its one 16-row tile, q head) of the short
//     region (PagedAttentionPlan::short_splits); rows of slots that are not short sequences are
//     skipped.
constexpr int kMergeGroups = kThreads / 32;
enum class MergeRows { kTokens, kTokensAndFill, kShortSequences };

// kMergeMinBlocks blocks per SM (tuning.h).
template <typename T, MergeRows kRows>
__global__ void __launch_bounds__(kThreads, kMergeMinBlocks)
    PagedAttentionMergeKernel(const __grid_constant__ PagedAttentionParams p) {
  constexpr bool kFill = kRows == MergeRows::kTokensAndFill;
  constexpr bool kShort = kRows == MergeRows::kShortSequences;
  __shared__ float4 s_part[kMergeGroups][64];  // head_dim <= 256: 64 float4 per row
  __shared__ float s_max[kMergeGroups], s_sum[kMergeGroups];
  __shared__ int s_nan[kMergeGroups];
  const int64_t row = blockIdx.x;
  const int64_t num_rows =
      kShort ? static_cast<int64_t>(p.max_num_seqs) * p.short_tokens * p.num_q_heads
             : static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  const int num_splits = kShort ? p.short_splits : p.num_splits;
  const PartState* partial_state = kShort ? p.short_state : p.partial_state;
  const float* partial_out = kShort ? p.short_out : p.partial_out;
  const int tid = threadIdx.x;
  if constexpr (kFill) {
    WaitForPreviousKernel();
    AllowNextKernelToLaunch();
  }
  const bool ok = p.flags[0] != 0;
  const int n = *p.num_seqs;
  // kShortSequences: this row's slot; query_start_loc has S + 1 entries, so both loads are in
  // bounds for any slot.
  const int seq =
      kShort ? static_cast<int>(row / (static_cast<int64_t>(p.short_tokens) * p.num_q_heads)) : 0;
  const int first = p.query_start_loc[seq];
  const int seq_end = kShort ? p.query_start_loc[seq + 1] : 0;

  const int group = tid / 32;
  const int lane = tid % 32;
  const int vecs = p.head_dim / 4;
  // Lane j holds the state of the group's j-th split (split group + 4 j): the group's maximum,
  // each split's weight and their sum come from one round of shuffles, so the parts are summed
  // by a chain of FMAs rather than of exponentials. The parts are loaded kPartBatch splits at a
  // time, the first batch before the states are needed (one round trip for both). Empty splits
  // have the state {-inf, 0} (weight 0) and zero parts.
  static_assert(kMaxSplits <= 32 * kMergeGroups, "one split per lane of a group");
  constexpr int kPartBatch = 4;
  const int lane_split = group + kMergeGroups * lane;
  PartState state{-INFINITY, 0.0f};
  if (lane_split < num_splits) {
    state = partial_state[static_cast<int64_t>(lane_split) * num_rows + row];
  }
  const int group_splits = (num_splits - group + kMergeGroups - 1) / kMergeGroups;
  bool has_nan = false;
  float m = -INFINITY, sum = 0.0f, weight = 0.0f;
  float4 o[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int j0 = 0; j0 < group_splits; j0 += kPartBatch) {
    float4 x[kPartBatch][2];
#pragma unroll
    for (int b = 0; b < kPartBatch; ++b) {
      const int z = group + kMergeGroups * (j0 + b);
      const float4* part = reinterpret_cast<const float4*>(
          partial_out + (static_cast<int64_t>(z) * num_rows + row) * p.part_dim);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int v = lane + 32 * k;
        x[b][k] = z < num_splits && v < vecs ? part[v] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if (j0 == 0) {
      has_nan = __any_sync(0xffffffffu, isnan(state.max) || isnan(state.sum));
      m = state.max;
#pragma unroll
      for (int lanes = 16; lanes >= 1; lanes /= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, lanes));
      }
      weight = state.sum * exp2f(state.max - (m == -INFINITY ? 0.0f : m));
      sum = weight;
#pragma unroll
      for (int lanes = 16; lanes >= 1; lanes /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, lanes);
    }
#pragma unroll
    for (int b = 0; b < kPartBatch; ++b) {
      // past the group's splits: a lane with weight 0, and zero parts
      const float w = __shfl_sync(0xffffffffu, weight, j0 + b);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        o[k].x += w * x[b][k].x, o[k].y += w * x[b][k].y;
        o[k].z += w * x[b][k].z, o[k].w += w * x[b][k].w;
      }
    }
  }

  const bool in_range = n >= 0 && n <= p.max_num_seqs;  // flags[0] == 0 covers this too
  int64_t out_row = row;
  bool owned;
  if constexpr (kShort) {
    // A sound partition (flags[0]) puts first + t in [0, T) for t < q_len.
    const int t = static_cast<int>((row / p.num_q_heads) % p.short_tokens);
    const int q_len = seq_end - first;
    owned = ok && in_range && seq < n && q_len <= p.short_tokens && t < q_len;
    out_row = (static_cast<int64_t>(first) + t) * p.num_q_heads + row % p.num_q_heads;
  } else {
    const int token = static_cast<int>(row / p.num_q_heads);
    owned = ok && in_range && token >= first && token < p.query_start_loc[in_range ? n : 0];
  }
  if (!owned) {  // uniform over the block
    if constexpr (kFill) {
      const float value = ok ? 0.0f : QuietNaN();
      T* out = static_cast<T*>(p.out) + row * p.head_dim;
      for (int d = tid; d < p.head_dim; d += kThreads) out[d] = FromFloat<T>(value);
      if (tid == 0) p.lse[row] = ok ? -INFINITY : value;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (lane + 32 * k < vecs) s_part[group][lane + 32 * k] = o[k];
  }
  if (lane == 0) {  // every lane of a group holds the group's maximum and sum
    s_max[group] = m;
    s_sum[group] = sum;
    s_nan[group] = has_nan;
  }
  __syncthreads();
  float top = -INFINITY;
  bool any_nan = false;
#pragma unroll
  for (int g = 0; g < kMergeGroups; ++g) {
    top = fmaxf(top, s_max[g]);
    any_nan |= s_nan[g] != 0;
  }
  const float base = top == -INFINITY ? 0.0f : top;
  float scale[kMergeGroups];
  float total = 0.0f;
#pragma unroll
  for (int g = 0; g < kMergeGroups; ++g) {
    scale[g] = exp2f(s_max[g] - base);
    total += scale[g] * s_sum[g];
  }
  const int head = static_cast<int>(row % p.num_q_heads);
  if (tid == 0) p.lse[out_row] = any_nan ? QuietNaN() : RowLse(p, head, base, total);
  total += SinkTerm(p, head, base);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  T* out = static_cast<T*>(p.out) + out_row * p.head_dim;
  for (int v = tid; v < vecs; v += kThreads) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int g = 0; g < kMergeGroups; ++g) {
      const float4 part = s_part[g][v];
      acc.x += scale[g] * part.x, acc.y += scale[g] * part.y;
      acc.z += scale[g] * part.z, acc.w += scale[g] * part.w;
    }
    const float nan = QuietNaN();
    out[4 * v + 0] = FromFloat<T>(any_nan ? nan : acc.x * inv);
    out[4 * v + 1] = FromFloat<T>(any_nan ? nan : acc.y * inv);
    out[4 * v + 2] = FromFloat<T>(any_nan ? nan : acc.z * inv);
    out[4 * v + 3] = FromFloat<T>(any_nan ? nan : acc.w * inv);
  }
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_MERGE_CUH_
