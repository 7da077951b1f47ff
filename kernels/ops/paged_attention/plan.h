// paged_attention: the launch plan, the one place that decides which kernel path a call runs
// (AttentionPath), its grid and KV split count and the workspace layout. The path comes from the
// call's static shapes and the device's facts (PlanDevice); the workspace from the shapes alone,
// so Describe (host compiler, no device) sizes it at trace time and the launcher fills the same
// layout. Plain C++: also compiled by the host compiler.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PLAN_H_
#define XLA_GPU_OPS_PAGED_ATTENTION_PLAN_H_

#include <stdint.h>

#include "core/kv_cache.h"
#include "ops/paged_attention/tuning.h"
#include "xla_gpu_ops/c_api.h"

namespace xgo {

// A call's static facts: what the plan, the launchers and the host implementation read.
struct PagedAttentionConfig {
  int32_t dtype;     // query, out
  int32_t kv_dtype;  // kv_cache
  int64_t num_tokens;
  int64_t num_q_heads;
  int64_t head_dim;  // query's, the cache's too (kv.head_dim)
  int64_t max_num_seqs;
  int64_t pages_per_seq;
  int64_t sliding_window;  // 0: no window
  float scale;
  float soft_cap;  // 0: no cap
  float k_scale;
  float v_scale;
  bool has_sinks;  // sinks is [num_q_heads], not [0]
  // Entries of k_scales / v_scales: 0 (none), 1 (one for every KV head) or num_kv_heads.
  int64_t k_scales_len, v_scales_len;
  // The caches: their pages, page size, KV heads, arrangement (interleaved, separate, paired),
  // order (NHD, HND) and strides.
  KvCacheLayout kv;
};

// Workspace (float32 elements), in this order:
//   [0, kFlagsHeader)                 word 0: 1 if num_seqs / query_start_loc are consistent;
//                                     word 1 (kWorkCounterWord): the persistent sm_90a prefill
//                                     blocks' work counter, zeroed by the prep kernel
//   [kFlagsHeader, + round32(S * C))  per sequence slot and chunk of kPrepPages block_tables
//                                     entries (C chunks): 1 if that part of its metadata is sound
//   state [splits, T, Hq] (PartState) per-split softmax state: maximum and sum, two floats
//                                     (only when splits > 1)
//   out   [splits, T, Hq, Dk]         per-split normalised output (only when splits > 1); Dk =
//                                     KernelHeadDim(D), the rows padded as the kernels hold them
//   short order [S] (int32)           sequence slots by rank, longest short sequence first
//                                     (only with a short region)
//   short state [short_splits, S, short_tokens, Hq]   the same as state / out, for the short
//   short out [short_splits, S, short_tokens, Hq, Dk] sequences (only when > 1 split)
constexpr int64_t kFlagsHeader = 32;
constexpr int64_t kWorkCounterWord = 1;

// One KV split's softmax state of a row (log2 domain): the maximum logit and the sum of
// exp2(logit - max), kept apart because one float max + log2(sum) loses the sum once |max| passes
// ~2^24 (its ulp exceeds log2(sum)), and the merge then weighs parts instead of keys. A row that
// saw no key: {-inf, 0}; a poisoned row: NaN.
struct alignas(8) PartState {
  float max, sum;
};
constexpr int64_t kPartStateFloats = sizeof(PartState) / sizeof(float);
constexpr int kThreads = 128;  // every attention block: 4 warps
constexpr int kPrepPagesPerThread = 8;
constexpr int kPrepPages = kThreads * kPrepPagesPerThread;  // page entries checked per prep block

// Which kernels a call runs; MakePagedAttentionPlan is the one place that decides it. (The
// values are what xgo_debug_paged_attention_plan reports.)
enum class AttentionPath {
  kF32Fma = 0,       // f32: prep -> exact-f32 FMA kernel -> merge
  kDecodeMma = 1,    // f16/bf16, decode-like: self-checking mma.sync kernel -> fill or merge
  kPrefillMma = 2,   // f16/bf16, prefill-like, head_dim <= 128: prep -> prefill kernel (+ short
                     // region) -> merges
  kRowsMma = 3,      // f16/bf16, prefill-like, head_dim > 128 or an fp8 cache: prep -> 64-row
                     // mma.sync kernel -> merge
  kPrefillSm90 = 4,  // f16/bf16 (16-bit or fp8 cache), prefill-like, a Hopper device with sm_90a
                     // code: prep -> wgmma kernel (+ short region) -> merges
};

// Which prefill kernel a prefill-like f16/bf16 call may take: the plan's choice, or one kernel
// forced for a comparison of the two (tests, A/B runs; xgo_debug_force_prefill_kernel). Values:
// that hook's argument.
enum class PrefillKernelChoice { kAuto = -1, kMmaSync = 0, kSm90 = 1 };
inline PrefillKernelChoice PrefillKernelChoiceOf(int32_t value) {
  return value < 0 ? PrefillKernelChoice::kAuto
                   : (value == 0 ? PrefillKernelChoice::kMmaSync : PrefillKernelChoice::kSm90);
}

// What the plan needs of the device a call runs on (PagedAttention::Launch asks the device).
// Describe plans as for a device with sm_90a code: the workspace does not depend on the device.
struct PlanDevice {
  bool sm90_prefill = false;  // compute capability 9.x, and this library holds sm_90a code
  PrefillKernelChoice prefill_kernel = PrefillKernelChoice::kAuto;
};

struct PagedAttentionPlan {
  AttentionPath path;
  bool tensor_cores;          // f16/bf16: mma.sync kernel; f32: FMA kernel (exact f32, no TF32)
  bool fp8_kv;                // float8_e4m3fn cache: decode tiles convert in registers; 64-row
                              // tiles and the sm_90a kernel convert each K/V tile in shared memory
  int row_warps;              // warps stacked over query rows (tensor-core kernel: 1 or 4)
  int block_rows;             // query rows (token x head pairs) per block
  int heads_per_block;        // q heads of one kv head handled together (divides the group size)
  int tokens_per_tile;        // block_rows / heads_per_block
  int64_t num_q_tiles;        // grid.x: static upper bound T / tokens_per_tile + S
  int64_t num_head_blocks;    // grid.y: Hq / heads_per_block
  int num_splits;             // grid.z
  int64_t page_check_chunks;  // prep grid.y: ceil(pages_per_seq / kPrepPages)
  // Prefill-like batches with one split (many blocks), head_dim <= 128: sequences of at most
  // short_tokens query tokens (one 16-row tile) run as decode blocks with short_splits KV splits
  // each (0: no short region), their parts indexed by sequence.
  int short_tokens;
  int short_splits;
  int64_t state_offset, out_offset, short_order_offset, short_state_offset, short_out_offset;
  int64_t workspace_elems;
};

inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Head dims: any multiple of kHeadDimStep up to kMaxHeadDim. The kernels are compiled for 64, 128
// and 256 (KernelHeadDim: the smallest that holds head_dim); a call in between runs that kernel
// with Q, K and V read as zeros past head_dim (in shared memory only: no extra bytes move) and
// only head_dim columns stored.
constexpr int64_t kHeadDimStep = 16;  // an fp8 16-byte chunk: every load is whole chunks
constexpr int64_t kMaxHeadDim = 256;
inline bool IsSupportedHeadDim(int64_t head_dim) {
  return head_dim > 0 && head_dim <= kMaxHeadDim && head_dim % kHeadDimStep == 0;
}
inline int KernelHeadDim(int64_t head_dim) {
  return head_dim <= 64 ? 64 : (head_dim <= 128 ? 128 : 256);
}

// Prefill tiles of a prefill-like f16/bf16 plan go to the sm_90a kernel where the device runs it,
// unless forced onto mma.sync. With a 16-bit cache, plans with a short region stay on the mma.sync
// kernel, whose 128-thread blocks share an SM with the short blocks, unless they are mostly
// prefill (kMostlyPrefillTokens) or forced: on the benchmark's mixed batch (54 tokens per
// sequence slot) the wgmma kernel with its own short blocks took 560 us against 450 us, on its
// one-split causal prefills (2048-8192 tokens per slot) 0.71-0.81x the mma.sync time (H100).
// An fp8 cache always takes the sm_90a kernel there: the mma.sync alternative is the 64-row tiles.
inline bool UsesSm90Prefill(const PagedAttentionConfig& c, const PagedAttentionPlan& p,
                            const PlanDevice& device) {
  if (p.path != AttentionPath::kPrefillMma && p.path != AttentionPath::kRowsMma) return false;
  if (!device.sm90_prefill) return false;
  switch (device.prefill_kernel) {
    case PrefillKernelChoice::kMmaSync:
      return false;
    case PrefillKernelChoice::kSm90:
      return true;
    case PrefillKernelChoice::kAuto:
      break;
  }
  const bool mostly_prefill = c.num_tokens >= kMostlyPrefillTokens * c.max_num_seqs;
  return p.fp8_kv || p.short_splits == 0 || mostly_prefill;
}

// The plan of a call from its static shapes alone (Describe makes it once per call): the path as
// on a device without the sm_90a kernel, the grid, the KV splits and the workspace layout.
inline PagedAttentionPlan PlanShapes(const PagedAttentionConfig& c) {
  PagedAttentionPlan p{};
  p.tensor_cores = c.dtype != XGO_F32;
  p.fp8_kv = c.kv_dtype == XGO_F8E4M3FN;
  const int64_t group = c.num_q_heads / c.kv.num_kv_heads;
  // Few query tokens per sequence (decode): one 16-row warp tile, the 4 warps split the keys.
  // Many (prefill): 4 warps x 16 rows, each warp over all keys.
  const bool decode_like = c.num_tokens <= kDecodeLikeTokensPerSeq * c.max_num_seqs;
  p.row_warps = (p.tensor_cores && !decode_like) ? 4 : 1;
  if (!p.tensor_cores) {
    p.path = AttentionPath::kF32Fma;
  } else if (decode_like) {
    p.path = AttentionPath::kDecodeMma;
  } else {
    p.path = c.head_dim <= 128 && !p.fp8_kv ? AttentionPath::kPrefillMma : AttentionPath::kRowsMma;
  }
  p.block_rows = 16 * p.row_warps;
  int heads = 1;
  for (int h = 16; h >= 1; --h) {
    if (group % h == 0) {
      heads = h;
      break;
    }
  }
  p.heads_per_block = heads;
  p.tokens_per_tile = p.block_rows / heads;
  p.num_q_tiles = c.num_tokens / p.tokens_per_tile + c.max_num_seqs;
  p.num_head_blocks = c.num_q_heads / heads;
  const int64_t blocks = p.num_q_tiles * p.num_head_blocks;
  const int64_t capacity = c.pages_per_seq * c.kv.page_size;
  // Prefill-like batches have many real blocks already; their static bound overestimates them.
  const int64_t target = decode_like ? kDecodeTargetBlocks : kTargetBlocks / 2;
  int64_t splits = (target + blocks - 1) / blocks;
  const int64_t min_split_keys =
      p.path == AttentionPath::kDecodeMma ? kMinDecodeSplitKeys : kMinSplitKeys;
  // A decode block's keys under a sliding window: its rows span tokens_per_tile positions and
  // its range starts on a tile edge (SplitKeyRange), whatever the context length. Splits past
  // those keys would find no tile and still be launched and merged.
  int64_t keys = capacity;
  if (p.path == AttentionPath::kDecodeMma && c.sliding_window > 0 && c.sliding_window < capacity) {
    const int64_t window_keys = c.sliding_window + p.tokens_per_tile - 1 + kMmaTileKeys - 1;
    if (window_keys < keys) keys = window_keys;
  }
  const int64_t by_length = (keys + min_split_keys - 1) / min_split_keys;
  if (splits > by_length) splits = by_length;
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  p.num_splits = static_cast<int>(splits);
  p.page_check_chunks = (c.pages_per_seq + kPrepPages - 1) / kPrepPages;
  p.state_offset = kFlagsHeader + RoundUp(c.max_num_seqs * p.page_check_chunks, 32);
  int64_t elems = p.state_offset;
  if (p.num_splits > 1) {
    const int64_t rows = splits * c.num_tokens * c.num_q_heads;
    // 16-byte aligned float4 rows
    p.out_offset = p.state_offset + RoundUp(rows * kPartStateFloats, 4);
    elems = p.out_offset + rows * KernelHeadDim(c.head_dim);
  } else {
    p.out_offset = p.state_offset;
  }
  p.short_tokens = 16 / heads;
  p.short_splits = 0;
  p.short_order_offset = p.short_state_offset = p.short_out_offset = elems;
  // A short region for the kernels that run one: the mma.sync prefill kernel, and the sm_90a
  // kernel, which an fp8 cache's 64-row plan (head_dim <= 128) may take on the device (below).
  const bool short_region_kernel =
      p.path == AttentionPath::kPrefillMma ||
      (p.path == AttentionPath::kRowsMma && p.fp8_kv && c.head_dim <= 128);
  if (short_region_kernel && p.num_splits == 1) {
    const int64_t short_blocks = c.max_num_seqs * p.num_head_blocks;
    int64_t short_splits = (kShortTargetBlocks + short_blocks - 1) / short_blocks;
    if (short_splits > by_length) short_splits = by_length;
    const int64_t by_short_keys = (capacity + kShortSplitKeys - 1) / kShortSplitKeys;
    if (short_splits > by_short_keys) short_splits = by_short_keys;
    if (short_splits > kMaxSplits) short_splits = kMaxSplits;
    if (short_splits < 1) short_splits = 1;
    p.short_splits = static_cast<int>(short_splits);
    p.short_order_offset = elems;
    elems += RoundUp(c.max_num_seqs, 4);
    if (short_splits > 1) {
      const int64_t rows = short_splits * c.max_num_seqs * p.short_tokens * c.num_q_heads;
      p.short_state_offset = RoundUp(elems, 4);
      p.short_out_offset = p.short_state_offset + RoundUp(rows * kPartStateFloats, 4);
      elems = p.short_out_offset + rows * KernelHeadDim(c.head_dim);
    }
  }
  p.workspace_elems = elems;
  return p;
}

// The shapes' plan placed on a device (PlanDevice): the sm_90a kernel where it runs the prefill
// tiles. The same workspace either way: the sm_90a kernel runs the splits and short region planned
// for the mma.sync kernels. The 64-row tiles run the short sequences as tiles of their own: an fp8
// plan that stays there keeps the short region's workspace, unused.
inline PagedAttentionPlan PlaceOnDevice(const PagedAttentionConfig& c, PagedAttentionPlan p,
                                        const PlanDevice& device) {
  if (UsesSm90Prefill(c, p, device)) {
    p.path = AttentionPath::kPrefillSm90;
  } else if (p.path == AttentionPath::kRowsMma) {
    p.short_splits = 0;
  }
  return p;
}

inline PagedAttentionPlan MakePagedAttentionPlan(const PagedAttentionConfig& c,
                                                 const PlanDevice& device = PlanDevice{}) {
  return PlaceOnDevice(c, PlanShapes(c), device);
}

// The device facts the plan takes, for the current device: whether it runs the sm_90a kernel
// (compute capability 9.x and sm_90a code in this library, queried once per device) and the
// prefill kernel xgo_debug_force_prefill_kernel forces, if any. Defined in plan.cc.
int32_t QueryPlanDevice(PlanDevice* device);
// Whether the current device runs this library's sm_90a prefill kernel (prefill_sm90.cu).
int32_t Sm90PrefillAvailable(bool* available);

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PLAN_H_
