// paged_attention: the f32 kernel (the kF32Fma path): exact f32 FMA arithmetic, no tensor cores.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_F32_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_F32_CUH_

#include <math.h>
#include <stdint.h>

#include "core/device_utils.cuh"
#include "ops/paged_attention/online_softmax.cuh"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// 16 rows x kBlockN keys per tile; thread (r = tid / 8, j = tid % 8) computes the logits of row
// r for keys j, j + 8, ... and the outputs of row r at columns j, j + 8, ... Exact f32 products
// and sums (no TF32), so f32 reaches float64 references to ~1e-6.
template <int kD>
struct FmaConfig {
  static constexpr int kBlockN = kD == 256 ? 16 : 32;
  static constexpr int kLds = kD + 4;  // +16 bytes per row: conflict-free 16-byte reads
  static constexpr int kBlockRows = 16;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(kBlockRows + 4 * kBlockN) * kLds * sizeof(float);
};

template <int kD>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionFmaKernel(const __grid_constant__ PagedAttentionParams p) {
  using Cfg = FmaConfig<kD>;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kLds = Cfg::kLds;
  constexpr int kKeysPerThread = kBlockN / 8;
  constexpr int kColsPerThread = kD / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* s_q = reinterpret_cast<float*>(smem_raw);
  float* s_k = s_q + Cfg::kBlockRows * kLds;
  float* s_v = s_k + 2 * kBlockN * kLds;
  __shared__ float s_p[16][kBlockN + 1];

  TileWork w;
  if (!FindTile(p, w)) return;
  if (!w.seq_ok) {
    PoisonRows<float>(p, w);
    return;
  }
  const int r = threadIdx.x / 8;
  const int j = threadIdx.x % 8;
  const KeyRange range = SplitKeyRange<kBlockN>(p, w);
  LoadQTile<float, kD, 16, kLds>(p, w, s_q);
  CpAsyncCommit();
  KvTilePipeline<float, kD, kBlockN, kLds, 2, kBlockN * kLds> kv(s_k, s_v);
  kv.Start(p, w, range);
  const bool row_ok = r < w.rows;
  const int row_pos = w.kv_len - w.q_len + (w.tok0 + r / p.heads_per_block - w.q_start);

  float acc[kColsPerThread];
#pragma unroll
  for (int c = 0; c < kColsPerThread; ++c) acc[c] = 0.0f;
  OnlineSoftmax<1, 8, Exp2Mode::kFull> softmax;  // row r over its 8 lanes

  for (int tile = range.tile_begin; tile < range.tile_end; ++tile) {
    const int stage = kv.Next(p, w, range, tile);
    __syncthreads();
    const float* k_tile = s_k + stage * kBlockN * kLds;
    const float* v_tile = s_v + stage * kBlockN * kLds;
    float s[kKeysPerThread];
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) s[i] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < kD; d += 4) {
      const float4 q = *reinterpret_cast<const float4*>(s_q + r * kLds + d);
#pragma unroll
      for (int i = 0; i < kKeysPerThread; ++i) {
        const float4 k = *reinterpret_cast<const float4*>(k_tile + (j + 8 * i) * kLds + d);
        s[i] = fmaf(q.x, k.x, s[i]);
        s[i] = fmaf(q.y, k.y, s[i]);
        s[i] = fmaf(q.z, k.z, s[i]);
        s[i] = fmaf(q.w, k.w, s[i]);
      }
    }
    const int key0 = range.key_base + tile * kBlockN + j;
    float tile_max[1] = {-INFINITY};
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      s[i] = Logit2(p, w.scale, s[i], key0 + 8 * i, row_pos, row_ok);
      tile_max[0] = fmaxf(tile_max[0], s[i]);
    }
    softmax.Fold(tile_max);
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) s_p[r][j + 8 * i] = softmax.Prob(s[i], 0);
    __syncwarp();  // a row's 8 threads are in one warp
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) acc[c] *= softmax.rescale[0];
#pragma unroll 4
    for (int key = 0; key < kBlockN; ++key) {
      const float prob = s_p[r][key];
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        acc[c] = fmaf(prob, v_tile[key * kLds + j + 8 * c], acc[c]);
      }
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  softmax.SumRows();
  if (!row_ok) return;
  const int token = w.tok0 + r / p.heads_per_block;
  const int head = w.head0 + r % p.heads_per_block;
  const float inv =
      softmax.Inverse(0, w.num_splits == 1 ? SinkTerm(p, head, softmax.max[0]) : 0.0f);
  const int64_t out_row = static_cast<int64_t>(token) * p.num_q_heads + head;
  // columns j + 8 c of the row: the output's below head_dim, a split part's all (part_dim)
  if (w.num_splits == 1) {
    float* dst = static_cast<float*>(p.out) + out_row * p.head_dim;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) {
      if (j + 8 * c < p.head_dim) dst[j + 8 * c] = acc[c] * inv;
    }
    if (j == 0) p.lse[out_row] = RowLse(p, head, softmax.max[0], softmax.sum[0]);
  } else {
    const int64_t split_row = PartRow(p, w, token, head);
    float* dst = p.partial_out + split_row * kD;  // part_dim == kD
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) dst[j + 8 * c] = acc[c] * inv;
    if (j == 0) p.partial_state[split_row] = {softmax.max[0], softmax.sum[0]};
  }
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_F32_CUH_
