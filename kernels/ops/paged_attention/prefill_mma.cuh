// paged_attention: the mma.sync prefill kernel (the plan's kPrefillMma path): f16/bf16
// prefill-like batches, kernel widths 64 and 128 (head_dim up to 128), sm_80 and up. Same
// semantics, tiles, workspace and split protocol as PagedAttentionMmaKernel (decode.cuh); what
// differs is the tile shape:
//   128 query rows per block, 4 warps x 32 rows (two m16 tiles per warp), so every K/V fragment a
//   warp loads from shared memory feeds four MMAs instead of two (ldmatrix : MMA 1 : 2.7 with the
//   Q reloads, against 1 : 2 in the 64-row kernel, which ncu showed latency-bound at 0.40
//   eligible warps per scheduler).
// K/V tiles of kPrefillTileKeys (32) keys; the tuned values: paged_attention/tuning.h.
// Q stays in shared memory (reloaded per k-step: 32 rows x D in registers would not fit beside the
// 32 x D f32 accumulators); P stays in registers (S accumulators -> A fragments); exp2 on
// log2-domain logits; only tiles a warp's rows partly see are masked element by element, tiles
// they cannot see at all are skipped. Output is staged through the warp's own Q rows in shared
// memory and stored in 16-byte rows.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_MMA_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_MMA_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "core/device_utils.cuh"
#include "ops/paged_attention/decode.cuh"
#include "ops/paged_attention/online_softmax.cuh"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/prefill_grid.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

template <int kD>
struct PrefillConfig {
  static constexpr int kWarps = 4;
  static constexpr int kBlockRows = kPrefillBlockRows;
  static constexpr int kRowsPerWarp = kBlockRows / kWarps;
  static constexpr int kBlockN = kPrefillTileKeys;
  // Blocks of <= 16 rows split each tile's keys over this many warps (16 keys or more each).
  static constexpr int kDecodeKeyWarps = kBlockN / 16 < 4 ? kBlockN / 16 : 4;
  static constexpr int kStages = kPrefillStages;
  // Padded rows (TileOffset): the decode tiles' XOR swizzle spilled 40 bytes here and measured
  // 10-12 % slower (H200).
  static constexpr int kLds = kD + 8;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(kBlockRows + 2 * kStages * kBlockN) * kLds * 2;  // Q, K/V stages
  static_assert(kThreads == kWarps * 32, "4 warps");
  static_assert(kRowsPerWarp == 32, "two m16 tiles per warp (PagedAttentionPrefillKernel)");
};

// Short-region decode blocks (MmaTileBlock, 64-key tiles) run in the prefill launch's shared
// memory, max(prefill, short), with kPrefillShortStages stages (tuning.h).
template <int kD>
using ShortConfig = MmaConfig<kD, 1, kPrefillShortStages>;

// One block's attention after FindPrefillTile. kMTiles m16 tiles per warp; kKeyWarps warps split
// each K/V tile's keys (then merge their softmax states in shared memory). Prefill blocks:
// <2, 1> (4 warps x 32 rows). Blocks of at most 16 rows (decode sequences inside a mixed batch):
// <1, 4>, so a long context is not walked by one warp alone.
template <typename T, int kD, int kMTiles, int kKeyWarps>
__device__ __forceinline__ void PrefillBlock(const PagedAttentionParams& p, const TileWork& w,
                                             unsigned char* smem_raw) {
  using Cfg = PrefillConfig<kD>;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kLds = Cfg::kLds;
  constexpr int kBlockRows = Cfg::kBlockRows;
  constexpr int kStages = Cfg::kStages;
  constexpr int kKeysPerWarp = kBlockN / kKeyWarps;
  constexpr int kScoreTiles = kKeysPerWarp / 8;
  constexpr int kDSteps = kD / 16;
  constexpr int kOutTiles = kD / 8;
  constexpr int kKeySteps = kKeysPerWarp / 16;
  constexpr int kStageElems = kBlockN * kLds;
  constexpr int kWarpRows = 16 * kMTiles;
  constexpr int kQRows = kKeyWarps == 1 ? kBlockRows : 16;
  static_assert(kKeyWarps == 1 || kMTiles == 1, "key-split blocks have one m tile");

  T* s_q = reinterpret_cast<T*>(smem_raw);  // [kBlockRows][kLds]
  T* s_k = s_q + kBlockRows * kLds;         // [kStages][kBlockN][kLds]
  T* s_v = s_k + kStages * kStageElems;     // [kStages][kBlockN][kLds]

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int wn = kKeyWarps == 1 ? 0 : warp;
  const int warp_row0 = kKeyWarps == 1 ? warp * kWarpRows : 0;
  const KeyRange range = SplitKeyRange<kBlockN>(p, w);

  LoadQTile<T, kD, kQRows, kLds>(p, w, s_q);
  CpAsyncCommit();
  KvTilePipeline<T, kD, kBlockN, kLds, kStages, kStageElems> kv(s_k, s_v);
  kv.Start(p, w, range);

  // This thread's rows: m tile mi, half h -> row warp_row0 + 16 mi + lane / 4 + 8 h.
  const int offset = w.kv_len - w.q_len - w.q_start;  // absolute key position = offset + token
  // Key positions the warp's real rows see: up to warp_hi_pos, from warp_lo_pos - window + 1.
  // Padding rows (zero Q) get finite logits on unmasked tiles and are never stored.
  const bool warp_active = warp_row0 < w.rows && wn < kKeyWarps;
  const int warp_row_last = min(warp_row0 + kWarpRows - 1, w.rows - 1);
  const int warp_lo_pos = offset + w.tok0 + warp_row0 / p.heads_per_block;
  const int warp_hi_pos = offset + w.tok0 + warp_row_last / p.heads_per_block;

  float acc[kMTiles][kOutTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      acc[mi][i][0] = acc[mi][i][1] = acc[mi][i][2] = acc[mi][i][3] = 0.0f;
    }
  }
  OnlineSoftmax<2 * kMTiles, 4, Exp2Mode::kApprox> softmax;  // row 2 mi + h: m tile mi, half h
  const float scale2 = w.scale * kLog2e;

  for (int tile = range.tile_begin; tile < range.tile_end; ++tile) {
    const int stage = kv.Next(p, w, range, tile);
    __syncthreads();
    const int warp_key0 = range.key_base + tile * kBlockN + wn * kKeysPerWarp;
    const bool warp_sees_keys =
        warp_active && warp_key0 <= warp_hi_pos &&
        (p.sliding_window == 0 || warp_key0 + kKeysPerWarp - 1 > warp_lo_pos - p.sliding_window);
    if (warp_sees_keys) {
      const T* k_tile = s_k + stage * kStageElems + wn * kKeysPerWarp * kLds;
      const T* v_tile = s_v + stage * kStageElems + wn * kKeysPerWarp * kLds;
      float s[kMTiles][kScoreTiles][4];
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
        for (int i = 0; i < kScoreTiles; ++i) {
          s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.0f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kDSteps; ++ks) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          LdMatrixX4(a[mi], s_q + TileOffset<T, kD, kLds>(warp_row0 + mi * 16 + lane % 16,
                                                          ks * 16 + (lane / 16) * 8));
        }
#pragma unroll
        for (int np = 0; np < kScoreTiles / 2; ++np) {
          uint32_t b[4];
          LdMatrixX4(b, k_tile + TileOffset<T, kD, kLds>(np * 16 + (lane / 16) * 8 + lane % 8,
                                                         ks * 16 + ((lane / 8) % 2) * 8));
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            Mma16816<T>(s[mi][2 * np], a[mi], b[0], b[1]);
            Mma16816<T>(s[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
      // Logits in the log2 domain; the mask only where some real row misses some key.
      const bool visible = warp_key0 + kKeysPerWarp - 1 <= warp_lo_pos &&
                           (p.sliding_window == 0 || warp_key0 > warp_hi_pos - p.sliding_window);
      const int key0 = warp_key0 + 2 * (lane % 4);
      float tile_max[2 * kMTiles];
#pragma unroll
      for (int r = 0; r < 2 * kMTiles; ++r) tile_max[r] = -INFINITY;
      if (visible && p.soft_cap == 0.0f) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
          for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              s[mi][nt][e] *= scale2;
              tile_max[2 * mi + (e >> 1)] = fmaxf(tile_max[2 * mi + (e >> 1)], s[mi][nt][e]);
            }
          }
        }
      } else {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
          for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e >> 1;
              const int r = warp_row0 + mi * 16 + lane / 4 + 8 * h;  // recomputed: saves registers
              s[mi][nt][e] = Logit2(p, w.scale, s[mi][nt][e], key0 + nt * 8 + (e & 1),
                                    offset + w.tok0 + r / p.heads_per_block, r < w.rows);
              tile_max[2 * mi + h] = fmaxf(tile_max[2 * mi + h], s[mi][nt][e]);
            }
          }
        }
      }
      // Once the running maxima settle the accumulators need no rescale.
      if (__any_sync(0xffffffffu, softmax.Fold(tile_max))) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) softmax.Rescale(acc[mi], 2 * mi);
      }
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][nt][e] = softmax.Prob(s[mi][nt][e], 2 * mi + (e >> 1));
        }
      }
      // O += P V: the S accumulators are already in the A-operand layout of the next MMA.
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          a[mi][0] = PackPair<T>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
          a[mi][1] = PackPair<T>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
          a[mi][2] = PackPair<T>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
          a[mi][3] = PackPair<T>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
        }
#pragma unroll
        for (int np = 0; np < kOutTiles / 2; ++np) {
          uint32_t b[4];
          const int v_row = kk * 16 + lane % 8 + ((lane / 8) % 2) * 8;
          LdMatrixX4Trans(b, v_tile + TileOffset<T, kD, kLds>(v_row, np * 16 + (lane / 16) * 8));
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            Mma16816<T>(acc[mi][2 * np], a[mi], b[0], b[1]);
            Mma16816<T>(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  softmax.SumRows();

  if constexpr (kKeyWarps > 1) {
    // Key-split block: every warp parks its state in the K/V buffers (free after the loop's last
    // barrier); threads merge the warps of each row and store 4 consecutive values at a time.
    constexpr int kOutLds = kD + 4;
    static_assert(static_cast<size_t>(kKeyWarps) * 16 * kOutLds * 4 <=
                      static_cast<size_t>(2 * kStages) * kStageElems * sizeof(T),
                  "merge buffer must fit in the K/V buffers");
    __shared__ float s_m[kKeyWarps][16], s_l[kKeyWarps][16];
    float* s_out = reinterpret_cast<float*>(s_k);  // [kKeyWarps][16][kOutLds]
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      if (warp >= kKeyWarps) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float* dst = s_out + (warp * 16 + lane / 4 + 8 * h) * kOutLds + i * 8 + 2 * (lane % 4);
        dst[0] = acc[0][i][2 * h];
        dst[1] = acc[0][i][2 * h + 1];
      }
    }
    if (lane % 4 == 0 && warp < kKeyWarps) {
      s_m[warp][lane / 4] = softmax.max[0];
      s_m[warp][lane / 4 + 8] = softmax.max[1];
      s_l[warp][lane / 4] = softmax.sum[0];
      s_l[warp][lane / 4 + 8] = softmax.sum[1];
    }
    __syncthreads();
    MergeKeyWarpsAndStore<T, kD, kKeyWarps, kOutLds, Exp2Mode::kApprox, true>(p, w, s_m, s_l,
                                                                              s_out);
    return;
  } else {
    // Each warp owns whole rows. One split: normalised rows go through the warp's own Q rows in
    // shared memory (no other warp reads them) and out in 16-byte stores. Several splits: f32
    // parts and their softmax states straight from registers.
    if (!warp_active) return;
    float inv[kMTiles][2];
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_row0 + mi * 16 + lane / 4 + 8 * h;
        const float sink =
            w.num_splits == 1 && r < w.rows
                ? SinkTerm(p, w.head0 + r % p.heads_per_block, softmax.max[2 * mi + h])
                : 0.0f;
        inv[mi][h] = softmax.Inverse(2 * mi + h, sink);
        if (w.num_splits == 1 && r < w.rows && lane % 4 == 0) {  // a row's 4 lanes hold its sum
          const int head = w.head0 + r % p.heads_per_block;
          const int64_t row = static_cast<int64_t>(w.tok0 + r / p.heads_per_block) * p.num_q_heads;
          p.lse[row + head] = RowLse(p, head, softmax.max[2 * mi + h], softmax.sum[2 * mi + h]);
        }
      }
    }
    if (w.num_splits == 1) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp_row0 + mi * 16 + lane / 4 + 8 * h;
#pragma unroll
          for (int i = 0; i < kOutTiles; ++i) {
            *reinterpret_cast<uint32_t*>(s_q + TileOffset<T, kD, kLds>(r, i * 8 + 2 * (lane % 4))) =
                PackPair<T>(acc[mi][i][2 * h] * inv[mi][h], acc[mi][i][2 * h + 1] * inv[mi][h]);
          }
        }
      }
      __syncwarp();
      constexpr int kChunk = 16 / sizeof(T);
      constexpr int kChunksPerRow = kD / kChunk;
      T* out = static_cast<T*>(p.out);
      for (int c = lane; c < kWarpRows * kChunksPerRow; c += 32) {
        const int r = warp_row0 + c / kChunksPerRow;
        if (r >= w.rows) break;  // rows ascend with c
        const int col = (c % kChunksPerRow) * kChunk;
        if (col >= p.head_dim) continue;  // a padded column
        const int token = w.tok0 + r / p.heads_per_block;
        const int head = w.head0 + r % p.heads_per_block;
        const uint4 staged = *reinterpret_cast<const uint4*>(s_q + TileOffset<T, kD, kLds>(r, col));
        *reinterpret_cast<uint4*>(
            out + (static_cast<int64_t>(token) * p.num_q_heads + head) * p.head_dim + col) = staged;
      }
    } else {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp_row0 + mi * 16 + lane / 4 + 8 * h;
          if (r >= w.rows) continue;
          const int token = w.tok0 + r / p.heads_per_block;
          const int head = w.head0 + r % p.heads_per_block;
          const int64_t split_row = PartRow(p, w, token, head);
          float* dst = p.partial_out + split_row * kD + 2 * (lane % 4);  // part_dim == kD
#pragma unroll
          for (int i = 0; i < kOutTiles; ++i) {
            *reinterpret_cast<float2*>(dst + i * 8) =
                make_float2(acc[mi][i][2 * h] * inv[mi][h], acc[mi][i][2 * h + 1] * inv[mi][h]);
          }
          if (lane % 4 == 0) {
            p.partial_state[split_row] = {softmax.max[2 * mi + h], softmax.sum[2 * mi + h]};
          }
        }
      }
    }
  }
}

// Prefill tiles, and (with a short region) the short sequences as 16-row decode blocks with their
// own KV splits: the decode kernel's body (MmaTileBlock) in ShortConfig's stages.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads, kPrefillMinBlocks)
    PagedAttentionPrefillKernel(const __grid_constant__ PagedAttentionParams p, PrefillGrid g) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  TileWork w;
  int index = 0;
  if (!IsShortBlock(g, index)) {
    if (!FindPrefillTile(p, g.num_q_tiles, index, w)) return;
    if (!w.seq_ok) {
      PoisonRows<T>(p, w);
    } else if (w.rows <= 16) {
      PrefillBlock<T, kD, 1, PrefillConfig<kD>::kDecodeKeyWarps>(p, w, smem_raw);
    } else {
      PrefillBlock<T, kD, 2, 1>(p, w, smem_raw);
    }
    return;
  }
  if (!FindShortTile(p, index, w)) return;
  if (!w.seq_ok) {
    PoisonRows<T>(p, w);
    return;
  }
  MmaTileBlock<T, kD, 1, kPrefillShortStages, /*kSelfCheck=*/false, /*kEvictFirst=*/true>(p, w,
                                                                                          smem_raw);
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_MMA_CUH_
