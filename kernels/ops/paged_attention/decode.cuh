// paged_attention: the mma.sync tile kernel (f16/bf16, mma.sync m16n8k16; fp8 caches read
// through the scales). Decode tiles: 16 query rows, the block's 4 warps split each K/V tile's
// keys, the block checks its own metadata (no prep kernel) and starts under programmatic
// dependent launch. 64-row tiles (4 warps x 16 rows, each over all keys): prefill-like batches at
// D = 256 off Hopper and with fp8 caches. Its body (MmaTileBlock) also runs the short region's
// decode blocks inside both prefill kernels.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_DECODE_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_DECODE_CUH_

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "ops/paged_attention/online_softmax.cuh"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// kRowWarps x kKeyWarps = 4 warps. Warp (wm, wn) owns query rows [16 wm, 16 wm + 16) and keys
// [wn * kBlockN / kKeyWarps, ...) of every tile; with kKeyWarps > 1 (decode) the warps' partial
// softmax states are merged through shared memory at the end.
// Stages and tile keys by default: kDecodeStages / kRowTileStages, kMmaTileKeys (tuning.h).
template <int kD, int kRowWarps,
          int kStagesOfTile = kRowWarps == 1 ? kDecodeStages : kRowTileStages,
          int kTileKeys = kMmaTileKeys>
struct MmaConfig {
  static constexpr int kKeyWarps = 4 / kRowWarps;
  static constexpr int kBlockN = kTileKeys;
  // K/V tiles in flight: kStages - 1 tiles are being copied while one is computed on.
  static constexpr int kStages = kStagesOfTile;
  // Row stride (TileOffset): unpadded, 16-byte chunks XOR-swizzled (a 16-byte pad made cp.async
  // ask L2 twice for half of the sectors), except 64-key tiles at D=256 (row tiles, short
  // blocks): padded rows, whose plain addresses measured faster there at 1 block/SM (352 -> 339
  // us, H200). The 32-key D=256 decode tiles at 2 blocks/SM gained nothing with padded rows.
  static constexpr int kLds = kD <= 128 || kTileKeys < kMmaTileKeys ? kD : kD + 8;
  static constexpr int kBlockRows = 16 * kRowWarps;
  static constexpr int kOutLds = kD + 4;
  // D <= 128 keeps Q in registers, so its shared copy only lives until the loop starts. Prefill
  // tiles: it borrows the last K stage (not written before the loop), saving a block's worth of
  // shared memory. Decode tiles: 16 rows cost 4 KB; with their own space the second K/V tile is
  // issued at once instead of after Q arrives (one memory round trip less per block start).
  static constexpr bool kQInRegisters = kD <= 128;
  static constexpr bool kQBorrowsK = kQInRegisters && kRowWarps != 1;
  static constexpr int kQSmemRows = kQBorrowsK ? 0 : kBlockRows;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(kQSmemRows + 2 * kStages * kBlockN) * kLds * 2;  // Q, stages of K, V
  // Register caps (tuning.h): decode tiles kDecodeMinBlocks, 32-key D = 256 decode tiles
  // kD256DecodeMinBlocks; 64-row tiles and 64-key D = 256 tiles none.
  static constexpr int kMinBlocks = kD > 128 ? (kTileKeys < kMmaTileKeys ? kD256DecodeMinBlocks : 1)
                                             : (kRowWarps == 4 ? 1 : kDecodeMinBlocks);
  static constexpr bool kConvertInRegisters = false;  // fp8 only (MmaFp8Config)
  static_assert(kStages >= 2 && kBlockRows <= kBlockN, "Q borrows one K stage");
  static_assert(static_cast<size_t>(64) * kOutLds * 4 <= 2 * kStages * kBlockN * kLds * 2,
                "epilogue buffer must fit in the K/V buffers");
};

// fp8 caches (the same kernel, KV = __nv_fp8_e4m3): K/V stream through shared memory as fp8 in
// kStages stages of [kBlockN][kD] byte tiles (half a 16-bit stage; k_scale and v_scale stay
// outside: logits and outputs are scaled).
// Decode tiles (kConvertInRegisters) read the fp8 tiles with ldmatrix and convert each fragment in
// registers (FP8 FRAGMENTS below): no 16-bit copy; kFp8DecodeStages stages (tuning.h).
// 64-row tiles: 4 warps read every key of a tile, so each tile is dequantised once into a single
// 16-bit K/V tile pair in MmaConfig's layout, which the mma.sync loop reads unchanged.
template <int kD, int kRowWarps,
          int kStagesOfTile = kRowWarps == 1 ? kFp8DecodeStages<kD> : kRowTileStages>
struct MmaFp8Config : MmaConfig<kD, kRowWarps, kStagesOfTile> {
  using Base = MmaConfig<kD, kRowWarps, kStagesOfTile>;
  static constexpr bool kConvertInRegisters = kRowWarps == 1;
  static constexpr size_t kTileBytes = static_cast<size_t>(Base::kBlockN) * Base::kLds * 2;
  static constexpr size_t kFp8StageBytes = static_cast<size_t>(Base::kBlockN) * kD;  // K or V
  // Q (its own rows, or borrowing the 16-bit K tile, which is not written before the loop),
  // the 16-bit K and V tiles (64-row tiles), then the fp8 stages of K and of V.
  static constexpr size_t kKvBytes =
      (kConvertInRegisters ? 0 : 2 * kTileBytes) + 2 * kStagesOfTile * kFp8StageBytes;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(Base::kQSmemRows) * Base::kLds * 2 + kKvBytes;
  static_assert(static_cast<size_t>(64) * Base::kOutLds * 4 <= kKvBytes,
                "epilogue buffer must fit in the K/V buffers");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

// ---- FP8 FRAGMENTS. ldmatrix reads an fp8 tile as b16 pairs; thread (g = lane / 4, t = lane % 4)
// then holds 4 bytes per 8x8 matrix, and each byte pair becomes one float16 pair of an mma.sync
// operand (bf16 queries too: ScaleQRowsToHalf).
// K (not transposed): key g's bytes d = 4t .. 4t + 3 of a 16-byte chunk serve as the B operand's
// k = 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1). The sum over d does not care about the order, so
// Q's A operand is read in the same order of d (LoadQFp8Order).
// V (transposed): keys 2t and 2t + 1 at bytes d = 2g and 2g + 1. Byte 2g feeds an output tile of
// even columns, 2g + 1 one of odd columns: acc[2j] holds d = 16j + 4t + {0, 2}, acc[2j + 1]
// d = 16j + 4t + {1, 3} (StoreAccFp8Order puts them back in order).
template <typename T, int kD, int kLds>
__device__ __forceinline__ void LoadQFp8Order(const T* s_q, int ks, int lane, uint32_t (&a)[4]) {
  const int g = lane / 4, col = ks * 16 + 4 * (lane % 4);
  const uint2 lo = *reinterpret_cast<const uint2*>(s_q + TileOffset<T, kD, kLds>(g, col));
  const uint2 hi = *reinterpret_cast<const uint2*>(s_q + TileOffset<T, kD, kLds>(g + 8, col));
  a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
}

// bf16 queries meet fp8 fragments as float16 (MmaTileBlock's kQToHalf): every e4m3 value is a
// float16 value, so K and V take one cvt per pair instead of three steps to bf16, and float16
// holds P in [0, 1] with more bits than bf16. First each Q row in shared memory is scaled in place
// by the power of two that puts its largest |q| in [2^15, 2^16) and rounded to float16: exact for
// bf16's 8 significant bits except for elements below 2^-29 of the row's largest, which float32
// accumulation of the row's sum would not see either. The logits are scaled back (`s_unscale`).
// kRows rows of kD, 128 threads: kThreadsPerRow neighbouring lanes share a row.
template <int kD, int kLds, int kRows>
__device__ __forceinline__ void ScaleQRowsToHalf(__nv_bfloat16* s_q, float* s_unscale) {
  constexpr int kThreadsPerRow = 128 / kRows;
  constexpr int kChunksPerThread = kD / 8 / kThreadsPerRow;  // 16-byte chunks of 8 elements
  static_assert(kThreadsPerRow <= 32 && kChunksPerThread >= 1, "rows split within a warp");
  const int row = threadIdx.x / kThreadsPerRow, part = threadIdx.x % kThreadsPerRow;
  uint4 chunk[kChunksPerThread];
  float amax = 0.0f;  // fmaxf skips NaN: a NaN element stays NaN after the scaling
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int col = (part + i * kThreadsPerRow) * 8;
    chunk[i] = *reinterpret_cast<const uint4*>(s_q + TileOffset<__nv_bfloat16, kD, kLds>(row, col));
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&chunk[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  // amax = 1.m * 2^(biased - 127): shift = 15 - that exponent; inf keeps 1; zero and bf16
  // subnormals take 2^126 (their inverse stays a float32 normal).
  const int biased = static_cast<int>(__float_as_uint(amax) >> 23);
  const int shift = biased == 0xff ? 0 : min(15 - (biased - 127), 126);
  const float up = __uint_as_float(static_cast<uint32_t>(127 + shift) << 23);
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    uint32_t* w = reinterpret_cast<uint32_t*>(&chunk[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      w[j] = PackPair<__half>(f.x * up, f.y * up);
    }
    const int col = (part + i * kThreadsPerRow) * 8;
    *reinterpret_cast<uint4*>(s_q + TileOffset<__nv_bfloat16, kD, kLds>(row, col)) = chunk[i];
  }
  if (part == 0) s_unscale[row] = __uint_as_float(static_cast<uint32_t>(127 - shift) << 23);
}

// s[0..1] += Q K^T for the 16 keys from `key0` of an fp8 tile (all kD dims).
template <typename T, int kD, int kLds, bool kQInRegisters, typename KV>
__device__ __forceinline__ void QkFp8(const KV* k_tile, int key0, const uint32_t (*q_frag)[4],
                                      const T* s_q, int lane, float (&s)[2][4]) {
  const int m = lane / 8;  // the matrix this lane addresses: keys +8 (m odd), next k-step (m >= 2)
  const int row = key0 + (m % 2) * 8 + lane % 8;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ks += 2) {
    uint32_t r[4];
    LdMatrixX4(r, k_tile + Fp8TileOffset<kD>(row, (ks + m / 2) * 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint32_t a[4];
      if constexpr (kQInRegisters) {
        a[0] = q_frag[ks + half][0], a[1] = q_frag[ks + half][1];
        a[2] = q_frag[ks + half][2], a[3] = q_frag[ks + half][3];
      } else {
        LoadQFp8Order<T, kD, kLds>(s_q, ks + half, lane, a);
      }
      const uint32_t k_lo = r[2 * half], k_hi = r[2 * half + 1];  // keys 0-7, 8-15
      Mma16816<T>(s[0], a, Fp8PairTo<T>(k_lo & 0xffffu), Fp8PairTo<T>(k_lo >> 16));
      Mma16816<T>(s[1], a, Fp8PairTo<T>(k_hi & 0xffffu), Fp8PairTo<T>(k_hi >> 16));
    }
  }
}

// acc += P V for the 16 keys from `key0` of an fp8 tile; p: P in the A-operand layout.
template <typename T, int kD, typename KV>
__device__ __forceinline__ void PvFp8(const KV* v_tile, int key0, const uint32_t (&p)[4], int lane,
                                      float (&acc)[kD / 8][4]) {
  const int m = lane / 8;
  const int row = key0 + (m % 2) * 8 + lane % 8;
#pragma unroll
  for (int j = 0; j < kD / 16; j += 2) {
    uint32_t r[4];
    LdMatrixX4Trans(r, v_tile + Fp8TileOffset<kD>(row, (j + m / 2) * 16));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // bytes (key 2t: d 2g, 2g+1; key 2t+1: d 2g, 2g+1) -> (even d: keys 2t, 2t+1 | odd d: ...)
      const uint32_t v_lo = __byte_perm(r[2 * half], 0, 0x3120);      // keys 0-7
      const uint32_t v_hi = __byte_perm(r[2 * half + 1], 0, 0x3120);  // keys 8-15
      const int even = 2 * (j + half);
      Mma16816<T>(acc[even], p, Fp8PairTo<T>(v_lo & 0xffffu), Fp8PairTo<T>(v_hi & 0xffffu));
      Mma16816<T>(acc[even + 1], p, Fp8PairTo<T>(v_lo >> 16), Fp8PairTo<T>(v_hi >> 16));
    }
  }
}

// The shared-memory shape of a tile block: MmaConfig, or MmaFp8Config for an fp8 cache; by
// default with the stage count of the kernel's tile kind.
template <typename KV, int kD, int kRowWarps>
inline constexpr int kTileStages =
    kRowWarps != 1 ? kRowTileStages : (IsFp8<KV> ? kFp8DecodeStages<kD> : kDecodeStages);
template <typename KV, int kD, int kRowWarps, int kStages = kTileStages<KV, kD, kRowWarps>,
          int kTileKeys = kMmaTileKeys>
using MmaTileConfig = std::conditional_t<IsFp8<KV>, MmaFp8Config<kD, kRowWarps, kStages>,
                                         MmaConfig<kD, kRowWarps, kStages, kTileKeys>>;
// Keys per tile of the decode kernel (PagedAttentionMmaKernel). 16-bit D = 256 decode:
// kD256DecodeTileKeys (tuning.h); each warp then owns 8 keys of a tile: Q K^T by ldmatrix over
// two d steps, P V by m16n8k8. fp8 keeps 64 (stages of half the size: 2 blocks per SM already).
template <typename KV, int kD, int kRowWarps>
inline constexpr int kKernelTileKeys =
    kRowWarps == 1 && kD > 128 && !IsFp8<KV> ? kD256DecodeTileKeys : kMmaTileKeys;
template <typename KV, int kD, int kRowWarps>
using MmaKernelConfig = MmaTileConfig<KV, kD, kRowWarps, kTileStages<KV, kD, kRowWarps>,
                                      kKernelTileKeys<KV, kD, kRowWarps>>;

// One block's attention after FindTile (or FindShortTile), K/V in kStages stages of Cfg's shape.
// kSelfCheck: no prep kernel ran, so the block checks the pages it reads and those no split reads
// (PagesOutsideRangeBad). kEvictFirst: K/V are read once (decode tiles), copied with the
// evict-first L2 policy.
// KV: the cache's element type, T's or fp8 (MmaFp8Config).
template <typename T, int kD, int kRowWarps, int kStages, bool kSelfCheck, bool kEvictFirst,
          typename KV = T, int kTileKeys = kMmaTileKeys>
__device__ __forceinline__ void MmaTileBlock(const PagedAttentionParams& p, const TileWork& w,
                                             unsigned char* smem_raw) {
  using Cfg = MmaTileConfig<KV, kD, kRowWarps, kStages, kTileKeys>;
  constexpr bool kFp8InRegisters = Cfg::kConvertInRegisters;
  constexpr bool kDequantize = IsFp8<KV> && !kFp8InRegisters;
  // The mma.sync operands' type: fp8 fragments are float16, also under bf16 queries, whose Q
  // rows are scaled into float16 first (ScaleQRowsToHalf).
  using TC = std::conditional_t<kFp8InRegisters, __half, T>;
  constexpr bool kQToHalf = kFp8InRegisters && std::is_same_v<T, __nv_bfloat16>;
  constexpr int kKeyWarps = Cfg::kKeyWarps;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kLds = Cfg::kLds;
  constexpr int kBlockRows = Cfg::kBlockRows;
  constexpr int kKeysPerWarp = kBlockN / kKeyWarps;
  constexpr int kScoreTiles = kKeysPerWarp / 8;
  constexpr int kDSteps = kD / 16;
  constexpr int kOutTiles = kD / 8;
  constexpr int kKeySteps = kKeysPerWarp / 16;
  constexpr bool kQInRegisters = Cfg::kQInRegisters;  // D=256 would not fit beside the accumulators

  // 16-bit K/V: kStages stages of [kBlockN][kLds] each, the loop reads stage `step % kStages`.
  // fp8, 64-row tiles: one 16-bit tile each (stride 0), and the fp8 stages behind them.
  // fp8, decode tiles: only the fp8 stages (the loop reads them).
  constexpr int kStageElems = kBlockN * kLds;
  constexpr int kComputeStride = kDequantize ? 0 : kStageElems;
  constexpr int kComputeStages = kDequantize ? 1 : kStages;
  T* s_k = reinterpret_cast<T*>(smem_raw) + Cfg::kQSmemRows * kLds;
  T* s_v = s_k + kComputeStages * kStageElems;
  constexpr int kCopyElems = IsFp8<KV> ? kBlockN * kD : kStageElems;
  KV* s_k_copy =
      kDequantize ? reinterpret_cast<KV*>(s_v + kStageElems) : reinterpret_cast<KV*>(s_k);
  KV* s_v_copy = IsFp8<KV> ? s_k_copy + kStages * kCopyElems : reinterpret_cast<KV*>(s_v);
  constexpr bool kQBorrowsK = Cfg::kQBorrowsK;
  T* s_q = !kQBorrowsK   ? reinterpret_cast<T*>(smem_raw)
           : kDequantize ? s_k
                         : s_k + (kStages - 1) * kStageElems;
  __shared__ float s_m[4][16], s_l[4][16];

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int wm = warp / kKeyWarps;
  const int wn = warp % kKeyWarps;
  const KeyRange range = SplitKeyRange<kBlockN>(p, w);
  const bool outside_bad = kSelfCheck && PagesOutsideRangeBad(p, w, range);

  LoadQTile<T, kD, kBlockRows, kLds>(p, w, s_q);
  CpAsyncCommit();
  // Decode tiles read each K/V byte once: evict-first (-2 us on the decode anchor, H200).
  KvTilePipeline<KV, kD, kBlockN, kLds, kStages, kCopyElems, kEvictFirst> kv(s_k_copy, s_v_copy);
  kv.Start(p, w, range);

  // This thread's two rows (g and g + 8 of the warp's 16): validity and absolute position.
  bool row_ok[2];
  int row_pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wm * 16 + lane / 4 + 8 * h;
    row_ok[h] = r < w.rows;
    row_pos[h] = w.kv_len - w.q_len + (w.tok0 + r / p.heads_per_block - w.q_start);
  }
  const bool warp_active = wm * 16 < w.rows;

  // Q rows scaled into float16 (kQToHalf): their inverse factors, for this thread's two rows.
  float q_unscale[2] = {1.0f, 1.0f};
  if constexpr (kQToHalf) {
    static_assert(kRowWarps == 1, "one 16-row warp per tile");
    CpAsyncWait<kStages - 1>();  // the Q group
    __syncthreads();
    ScaleQRowsToHalf<kD, kLds, kBlockRows>(s_q, s_m[0]);  // s_m is free until the epilogue
    __syncthreads();
    q_unscale[0] = s_m[0][lane / 4];
    q_unscale[1] = s_m[0][lane / 4 + 8];
  }
  const TC* s_q_compute = reinterpret_cast<const TC*>(s_q);

  uint32_t q_frag[kQInRegisters ? kDSteps : 1][4];
  if constexpr (kQBorrowsK) {
    CpAsyncWait<kStages - 1>();  // the Q group
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kDSteps; ++ks) {
      LdMatrixX4(q_frag[ks],
                 s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16, ks * 16 + (lane / 16) * 8));
    }
    __syncthreads();  // every warp has its Q before the loop refills the borrowed K stage
  } else if constexpr (!kQInRegisters) {
    CpAsyncWait<kStages - 1>();  // the Q group
    __syncthreads();
  }

  float acc[kOutTiles][4];
#pragma unroll
  for (int i = 0; i < kOutTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  OnlineSoftmax<2, 4, Exp2Mode::kFull> softmax;  // this thread's rows g and g + 8

  for (int tile = range.tile_begin; tile < range.tile_end; ++tile) {
    const int stage = kv.Next(p, w, range, tile);
    if constexpr (kDequantize) {  // this thread's own chunks: no barrier before it
      kv.loader.template Dequantize<T, kLds>(s_k_copy + stage * kCopyElems,
                                             s_v_copy + stage * kCopyElems, s_k, s_v);
    }
    __syncthreads();
    if constexpr (kQInRegisters && !kQBorrowsK) {
      if (tile == range.tile_begin) {  // Q's group is older than this tile's: it has landed
#pragma unroll
        for (int ks = 0; ks < kDSteps; ++ks) {
          if constexpr (kFp8InRegisters) {
            LoadQFp8Order<TC, kD, kLds>(s_q_compute, ks, lane, q_frag[ks]);
          } else {
            LdMatrixX4(q_frag[ks], s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16,
                                                                 ks * 16 + (lane / 16) * 8));
          }
        }
      }
    }
    if (warp_active) {
      const T* k_tile = s_k + stage * kComputeStride + wn * kKeysPerWarp * kLds;
      const T* v_tile = s_v + stage * kComputeStride + wn * kKeysPerWarp * kLds;
      float s[kScoreTiles][4];
#pragma unroll
      for (int i = 0; i < kScoreTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      if constexpr (kFp8InRegisters) {
        static_assert(kKeysPerWarp == 16 && kRowWarps == 1, "FP8 FRAGMENTS: one 16-row warp");
        QkFp8<TC, kD, kLds, kQInRegisters>(s_k_copy + stage * kCopyElems, wn * kKeysPerWarp, q_frag,
                                           s_q_compute, lane, s);
        if constexpr (kQToHalf) {
#pragma unroll
          for (int i = 0; i < kScoreTiles; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] *= q_unscale[e >> 1];
          }
        }
      } else if constexpr (kKeysPerWarp == 8) {
        // 8 keys: one ldmatrix.x4 reads two d steps of them; two accumulators halve the chain
        // of dependent mma.sync.
        static_assert(!kQInRegisters && kDSteps % 2 == 0, "8-key warps: Q from shared memory");
        float s_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < kDSteps; ks += 2) {
          uint32_t a0[4], a1[4], b[4];
          LdMatrixX4(a0,
                     s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16, ks * 16 + (lane / 16) * 8));
          LdMatrixX4(a1, s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16,
                                                       ks * 16 + 16 + (lane / 16) * 8));
          LdMatrixX4(b, k_tile + TileOffset<T, kD, kLds>(lane % 8, ks * 16 + (lane / 8) * 8));
          Mma16816<T>(s[0], a0, b[0], b[1]);
          Mma16816<T>(s_odd, a1, b[2], b[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][e] += s_odd[e];
      } else {
#pragma unroll
        for (int ks = 0; ks < kDSteps; ++ks) {
          uint32_t a[4];
          if constexpr (kQInRegisters) {
            a[0] = q_frag[ks][0], a[1] = q_frag[ks][1], a[2] = q_frag[ks][2], a[3] = q_frag[ks][3];
          } else {
            LdMatrixX4(
                a, s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16, ks * 16 + (lane / 16) * 8));
          }
#pragma unroll
          for (int np = 0; np < kScoreTiles / 2; ++np) {
            uint32_t b[4];
            LdMatrixX4(b, k_tile + TileOffset<T, kD, kLds>(np * 16 + (lane / 16) * 8 + lane % 8,
                                                           ks * 16 + ((lane / 8) % 2) * 8));
            Mma16816<T>(s[2 * np], a, b[0], b[1]);
            Mma16816<T>(s[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
      // Masked logits (log2 domain), then the online-softmax update of both rows.
      const int tile_key0 = range.key_base + tile * kBlockN;
      const int key0 = tile_key0 + wn * kKeysPerWarp + 2 * (lane % 4);
      float tile_max[2] = {-INFINITY, -INFINITY};
      if (TileFullyVisible(p, w, tile_key0, kBlockN)) {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[nt][e] = Scaled2(p, w.scale, s[nt][e]);
            tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            s[nt][e] = Logit2(p, w.scale, s[nt][e], key0 + nt * 8 + (e & 1), row_pos[h], row_ok[h]);
            tile_max[h] = fmaxf(tile_max[h], s[nt][e]);
          }
        }
      }
      // Once the running maxima settle (most decode tiles) the accumulators need no rescale.
      if (__any_sync(0xffffffffu, softmax.Fold(tile_max))) softmax.Rescale(acc);
#pragma unroll
      for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = softmax.Prob(s[nt][e], e >> 1);
      }
      // O += P V: the score accumulators are already in the A-operand layout.
      if constexpr (kKeysPerWarp == 8) {  // m16n8k8: one ldmatrix.x4.trans feeds 4 d tiles
        const uint32_t a0 = PackPair<TC>(s[0][0], s[0][1]);
        const uint32_t a1 = PackPair<TC>(s[0][2], s[0][3]);
#pragma unroll
        for (int nq = 0; nq < kOutTiles / 4; ++nq) {
          uint32_t b[4];
          LdMatrixX4Trans(b, v_tile + TileOffset<T, kD, kLds>(lane % 8, nq * 32 + (lane / 8) * 8));
#pragma unroll
          for (int j = 0; j < 4; ++j) Mma1688<T>(acc[4 * nq + j], a0, a1, b[j]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk) {
        uint32_t a[4];
        a[0] = PackPair<TC>(s[2 * kk][0], s[2 * kk][1]);
        a[1] = PackPair<TC>(s[2 * kk][2], s[2 * kk][3]);
        a[2] = PackPair<TC>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = PackPair<TC>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        if constexpr (kFp8InRegisters) {
          PvFp8<TC, kD>(s_v_copy + stage * kCopyElems, wn * kKeysPerWarp, a, lane, acc);
        } else {
#pragma unroll
          for (int np = 0; np < kOutTiles / 2; ++np) {
            uint32_t b[4];
            const int v_row = kk * 16 + lane % 8 + ((lane / 8) % 2) * 8;
            LdMatrixX4Trans(b, v_tile + TileOffset<T, kD, kLds>(v_row, np * 16 + (lane / 16) * 8));
            Mma16816<T>(acc[2 * np], a, b[0], b[1]);
            Mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  if constexpr (kSelfCheck) {
    if (__syncthreads_or(kv.loader.bad_page || outside_bad)) {  // block-uniform
      PoisonRows<T>(p, w);
      return;
    }
  } else {
    __syncthreads();
  }

  // Epilogue: every warp parks its state in shared memory (reusing the K/V buffers); threads then
  // merge the key-warps of each row and store 4 consecutive values at a time.
  constexpr int kOutLds = Cfg::kOutLds;
  float* s_out = reinterpret_cast<float*>(s_k);  // [4 warps][16][kOutLds]
  softmax.SumRows();
  if (warp_active) {
    if constexpr (kFp8InRegisters) {  // FP8 FRAGMENTS: acc[2j], acc[2j + 1] interleave
#pragma unroll
      for (int j = 0; j < kD / 16; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* dst = s_out + (warp * 16 + lane / 4 + 8 * h) * kOutLds + j * 16 + 4 * (lane % 4);
          *reinterpret_cast<float4*>(dst) =
              make_float4(acc[2 * j][2 * h], acc[2 * j + 1][2 * h], acc[2 * j][2 * h + 1],
                          acc[2 * j + 1][2 * h + 1]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* dst = s_out + (warp * 16 + lane / 4 + 8 * h) * kOutLds + i * 8 + 2 * (lane % 4);
          dst[0] = acc[i][2 * h];
          dst[1] = acc[i][2 * h + 1];
        }
      }
    }
    if (lane % 4 == 0) {
      s_m[warp][lane / 4] = softmax.max[0];
      s_m[warp][lane / 4 + 8] = softmax.max[1];
      s_l[warp][lane / 4] = softmax.sum[0];
      s_l[warp][lane / 4 + 8] = softmax.sum[1];
    }
  }
  __syncthreads();
  MergeKeyWarpsAndStore<T, kD, kKeyWarps, kOutLds, Exp2Mode::kFull, false>(p, w, s_m, s_l, s_out);
}

// KV: the cache's element type (T, or __nv_fp8_e4m3 read through the scales).
template <typename T, typename KV, int kD, int kRowWarps>
__global__ void __launch_bounds__(kThreads, (MmaKernelConfig<KV, kD, kRowWarps>::kMinBlocks))
    PagedAttentionMmaKernel(const __grid_constant__ PagedAttentionParams p) {
  // Decode tiles run without the prep kernel (launched with programmatic dependent launch).
  constexpr bool kSelfCheck = kRowWarps == 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if constexpr (kSelfCheck) {
    WaitForPreviousKernel();
    AllowNextKernelToLaunch();  // the fill/merge kernel may be scheduled; it waits for us
  }
  TileWork w;
  if (!FindTile<kSelfCheck>(p, w)) return;
  if (!w.seq_ok) {
    PoisonRows<T>(p, w);
    return;
  }
  // fp8 tiles go without the evict-first hint: with it, ptxas 13.0 emitted the decode kernels'
  // cp.async (LDGSTS) reading uniform registers that nothing wrote, an illegal instruction on an
  // H100 (compute-sanitizer, 2026-11-23).
  MmaTileBlock<T, kD, kRowWarps, kTileStages<KV, kD, kRowWarps>, kSelfCheck,
               /*kEvictFirst=*/kSelfCheck && !IsFp8<KV>, KV, kKernelTileKeys<KV, kD, kRowWarps>>(
      p, w, smem_raw);
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_DECODE_CUH_
