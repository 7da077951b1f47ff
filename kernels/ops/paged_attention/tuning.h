// paged_attention: every tuned constant of the plan and the kernels, each with why it has its
// value (times are of the kernels or calls named, on the GPU named). The rest of the shapes
// follows from these, the hardware and what fits. Plain C++: the host compiler reads it too (the
// plan sizes the workspace from the split constants), so the workspace Describe reports is the
// one the launcher fills.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_TUNING_H_
#define XLA_GPU_OPS_PAGED_ATTENTION_TUNING_H_

#include <stdint.h>

namespace xgo {

// ---------------------------------------------------------------- plan: paths and KV splits
// Query tokens per sequence slot (num_tokens / max_num_seqs) up to which a batch is decode-like:
// 16-row tiles whose 4 warps split the keys; above it, 64- or 128-row prefill tiles.
constexpr int64_t kDecodeLikeTokensPerSeq = 2;
// Query tokens per sequence slot from which a batch with short sequences is mostly prefill and
// runs on the sm_90a kernel: the benchmark's prefills have 2048-8192, its mixed batch 54.
constexpr int64_t kMostlyPrefillTokens = 256;
// Blocks the prefill-like splits aim at (half of it: the static block count overestimates the
// real one); the launcher then uses the fewest splits that fill the GPU.
constexpr int kTargetBlocks = 2048;
// Decode: room for several waves of split blocks (Hq = Hkv = 32, B = 32 has 1024 blocks per
// split, 2.6 waves at 3 blocks per SM); the launcher's cost model picks the count.
constexpr int kDecodeTargetBlocks = 8192;
// Prefill-like KV splits: one of fewer keys costs more to merge than it saves.
constexpr int64_t kMinSplitKeys = 256;
// Keys per K/V tile of the mma.sync tile kernels (decode tiles, 64-row tiles, short blocks) and
// the unit of decode splits.
constexpr int kMmaTileKeys = 64;
// Decode splits go down to one tile: a split of more tiles than the decode stages waits a second
// round trip for its last ones (B1 x 1k on an H100 as 4 splits of 4 tiles: 3.6 us on the last 3).
constexpr int64_t kMinDecodeSplitKeys = kMmaTileKeys;
// Splits of one row; the merge kernel takes one per lane of its 4 warps.
constexpr int kMaxSplits = 128;
// The decode split model's fixed cost of a split block (start-up, epilogue, merge) in key tiles:
// without it, B8 x 16k at Hq 64 / Hkv 8 took 37 splits for a 0.3 % better fill, 169.8 us
// against 152.9 us with 12 (H200).
constexpr int64_t kSplitOverheadTiles = 1;
// Prefill-like batches: the fewest splits whose blocks fill the resident slots within this
// fraction of the best fill.
constexpr double kSplitFillTolerance = 0.02;
// Short region (the decodes of a prefill-like batch): keys of the static capacity per KV split.
// On the mixed batch (capacity 8k) 1 split measured best, 391 us against 411 / 419 / 436 with
// 2 / 4 / 8 (H200): the prefill blocks beside them already fill the GPU.
constexpr int64_t kShortSplitKeys = 8192;
// Short region: at most this many blocks over its splits.
constexpr int kShortTargetBlocks = 4096;

// ---------------------------------------------------------------- mma.sync tile kernels
// Decode tiles: 3 K/V stages (2 in flight while one is computed on); D = 128 then fits 2 blocks
// per SM and one wave on the decode anchor: -1.8 us there, -4.8 us at B32 x 1k, +4 us at B32 x 16k
// against 2 stages at 3 blocks per SM (H200).
constexpr int kDecodeStages = 3;
// 64-row tiles (prefill-like at D = 256 off Hopper, fp8 caches): 3 or 4 stages left fewer blocks
// per SM and measured slower (H200).
constexpr int kRowTileStages = 2;
// fp8 decode tiles: stages of half a 16-bit tile, so 4 keep 3 tiles in flight in 68 KB at
// D = 128 (3 blocks per SM, the register cap); D = 256: 3 (104 KB, 2 blocks per SM).
template <int kD>
inline constexpr int kFp8DecodeStages = kD > 128 ? 3 : 4;
// 16-bit D = 256 decode tiles: 32 keys, so 3 stages fit 2 blocks per SM; with 64 keys one block
// of 4 warps per SM left the kernel latency-bound.
constexpr int kD256DecodeTileKeys = 32;
// Decode tiles at D <= 128: registers capped for 3 blocks per SM; uncapped measured the same, a
// cap for 5 blocks spilled at D = 64 and was slower. (64-row tiles: no cap; capped they spilled
// 200 bytes, 955 against 887 us, H200.)
constexpr int kDecodeMinBlocks = 3;
// 16-bit D = 256 decode tiles: 2 blocks per SM (their shared memory allows 2), at no register cost.
constexpr int kD256DecodeMinBlocks = 2;
// Split merge: 8 blocks per SM (<= 64 registers) merge a decode batch's 1024 rows (B32 x Hq 32) in
// one wave; at 108 registers they took two and B32 x 4k at D = 64 lost 1.2 us.
constexpr int kMergeMinBlocks = 8;

// ---------------------------------------------------------------- mma.sync prefill kernel
// Query rows per block: 4 warps x 32 rows, so each K/V fragment from shared memory feeds 4 MMAs
// (64-row tiles were latency-bound, 0.40 eligible warps per scheduler in ncu).
constexpr int kPrefillBlockRows = 128;
// Keys per K/V tile: 64-key tiles need 32 more score registers and spilled 84 bytes at the
// 2-blocks-per-SM limit: 604 against 553 us (H200).
constexpr int kPrefillTileKeys = 32;
constexpr int kPrefillStages = 2;  // K/V stages: one tile copied while one is computed on
// Blocks per SM the registers are capped for (255 each: the 32-key tiles fit without spills).
constexpr int kPrefillMinBlocks = 2;
// Short-region blocks inside the prefill launch: 2 K/V stages fit in a prefill block's shared
// memory; 3 (100 KB) measured the same on the mixed batch, 391 against 393 us (H200).
constexpr int kPrefillShortStages = 2;

// ---------------------------------------------------------------- sm_90a prefill kernel
// Keys per K/V tile (FlashAttention-3's); D = 256: 64, the most that fits beside its 64 KB Q
// buffer with 2 + 2 stages.
constexpr int kSm90TileKeys = 128;
constexpr int kSm90D256TileKeys = 64;
// Consumer warpgroups at D = 64 (2 elsewhere): its products cost half of D = 128's, so the
// softmax weighs twice as much per tile step and a third consumer keeps one in flight
// (FlashAttention-3's and FlashInfer's D = 64 tile).
constexpr int kSm90D64Consumers = 3;
// K and V stages at D = 128 (FlashAttention-3's): 3 V or 3 K stages stayed within the run-to-run
// spread, about 1 % (H100).
constexpr int kSm90KStages = 2;
constexpr int kSm90VStages = 2;
// K and V stages each at D = 64 with three consumers: 3 measured 0.98x / 0.97x of 2, 4 0.98x /
// 1.00x of 3, 5 1.03x / 1.04x of 4 (B1 x 8k / B8 x 2k, H100).
constexpr int kSm90D64Stages = 4;
constexpr int kSm90D256Stages = 2;  // K and V stages at D = 256: what fits beside one Q buffer
// Short-region blocks own the SM's shared memory there, so 3 stages fit (the mma.sync kernel's
// short blocks measured the same with 2 and 3).
constexpr int kSm90ShortStages = 3;

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_TUNING_H_
