// paged_attention: the prefill kernel for Hopper (sm_90a; the plan's kPrefillSm90 path): warpgroup
// MMA (wgmma) with K/V pages staged in shared memory by a producer warpgroup, FlashAttention-3
// style. Same semantics, tiles, workspace, split protocol and short region as
// PagedAttentionPrefillKernel (prefill_mma.cuh); design, layouts and the barrier protocol:
// docs/prefill-sm90.md.
//
// One block = a producer and 2 consumer warpgroups (384 threads; 3 consumers, 512 threads, at
// D = 64) working through items of 64 query rows per consumer (tokens x the q heads of one kv
// head): one item per block, or, in a persistent launch (one block per SM), the block's first
// item and then whichever item is next (NextPrefillItem). The producer runs ahead into the next
// item (its lookup, Q into the other Q buffer, its first K/V tiles; with one Q buffer, at
// D = 256 and for an fp8 cache at D = 128, the lookup and first K tile) while the consumers
// finish the current one.
//   warpgroup 0, producer (56 registers after setmaxnreg, 40 at D = 256, 32 beside three
//     consumers): thread 0 looks the items up and publishes them in shared memory (Sm90Item);
//     Q by TMA from thread 0 (Sm90RowTensorMaps; by the warpgroup's cp.async where the launch
//     has no Q map); K and V tiles of kBlockN keys into shared memory with the 128-byte
//     swizzle wgmma descriptors read, signalled through mbarriers: whole pages by TMA (one box
//     per page and 64-column block, Sm90KvTensorMap) where the page size allows, otherwise, and
//     for the tiles that reach past the block's last key, gathered key by key through the page
//     table with 16-byte cp.async (cp.async.mbarrier.arrive.noinc); keys past the block's end
//     and pages outside [0, num_pages) are zero-filled, never read. An fp8 cache (KV =
//     __nv_fp8_e4m3) takes the same ways into a byte staging buffer per K and V (whole rows per
//     TMA box, unswizzled), and the warpgroup converts each tile into that 16-bit layout
//     (Sm90ProducerItemFp8); the consumers read 16-bit tiles either way, and k_scale / v_scale
//     stay outside the kernel as on every path.
//   warpgroups 1 and up, consumers (224 registers, 232 at D = 256, 160 for three at D = 64):
//     64 query rows each.
//     S = Q K^T by wgmma (both operands from shared memory, K-major), online softmax in the log2
//     domain in registers, P converted in registers to the A operand of O += P V (wgmma, V read
//     from shared memory MN-major through the transpose bit). Tile i's QK^T is issued together
//     with tile i-1's PV, so the softmax of tile i overlaps the PV of tile i-1 (intra-warpgroup
//     overlap); for D <= 128 the consumers also take turns issuing (named barriers), so one's
//     softmax overlaps the others' matrix work (ping-pong). Each warp stores its 16 output rows
//     through shared memory, by TMA where they are all real rows and the launch has an output map.
// Short-region blocks (the decodes of a mixed batch) run the decode kernel's body
// (MmaTileBlock, fp8 caches too) on warpgroup 0 alone; the other warpgroups exit.
//
// Device code exists only in the sm_90a pass (XGO_SM90A_DEVICE); every other pass of a multi-arch
// build compiles an empty kernel, and the plan never picks it there (QueryPlanDevice asks).
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_SM90_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_SM90_CUH_

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/device_utils.cuh"
#include "ops/paged_attention/decode.cuh"
#include "ops/paged_attention/online_softmax.cuh"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/prefill_grid.cuh"
#include "ops/paged_attention/sm90_ptx.cuh"
#include "ops/paged_attention/tiles.cuh"

namespace xgo {

// kFp8: a float8_e4m3fn cache. Each K or V tile then arrives as bytes in a staging buffer of its
// own (by TMA or cp.async), and the producer converts it into the 16-bit stage the consumers read.
template <int kD, bool kFp8 = false>
struct Sm90PrefillConfig {
  // Consumer warpgroups, 64 query rows each; D = 64 takes kSm90D64Consumers (192-row items).
  // The tuned values of this config (consumers, tile keys, stages): paged_attention/tuning.h.
  static constexpr int kConsumers = kD == 64 ? kSm90D64Consumers : 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kBlockRows = 64 * kConsumers;
  // D = 256: 64-key tiles (Q 64 KB + 2 x 2 stages of 32 KB fit; 128-key tiles would not).
  static constexpr int kBlockN = kD > 128 ? kSm90D256TileKeys : kSm90TileKeys;
  // D = 64: its tiles are half D = 128's, so four K and four V stages fit beside the 192-row Q
  // buffers.
  static constexpr int kKStages = kD == 64    ? kSm90D64Stages
                                  : kD <= 128 ? kSm90KStages
                                              : kSm90D256Stages;
  static constexpr int kVStages = kD == 64    ? kSm90D64Stages
                                  : kD <= 128 ? kSm90VStages
                                              : kSm90D256Stages;
  static constexpr int kChunksPerRow = kD / 8;              // 16-byte chunks of a 16-bit row
  static constexpr int kRowsPerPass = 128 / kChunksPerRow;  // rows the producer copies per pass
  static constexpr int kScoreRegs = kBlockN / 2;            // S accumulators per thread
  static constexpr int kOutRegs = kD / 2;                   // O accumulators per thread
  static constexpr int kQBytes = kBlockRows * kD * 2;
  static constexpr int kTileBytes = kBlockN * kD * 2;
  // Shared memory (bytes from a 1024-byte aligned base: the 128-byte swizzle repeats every 8 rows
  // of 128 bytes, and wgmma descriptors assume that phase; see SwizzledOffset).
  static constexpr int kSlotBuffers = 3;  // key -> cache offset tables (see Sm90ProducerItem)
  static constexpr int kStagingBuffers = kFp8 ? 2 : 0;  // fp8: one K and one V tile of bytes
  static constexpr int kStagingBytes = kBlockN * kD;
  static constexpr int kStagingChunksPerRow = kD / 16;  // 16-byte chunks of an fp8 row
  static constexpr int kStagingRowsPerPass = 128 / kStagingChunksPerRow;
  static constexpr int kKvBytes =
      (kKStages + kVStages) * kTileBytes + kStagingBuffers * kStagingBytes;
  // The tables, the barriers with two Q buffers, the alignment slack.
  static constexpr int kTableAndBarrierBytes =
      kSlotBuffers * kBlockN * 8 + (2 * (2 + kKStages + kVStages) + kStagingBuffers) * 8 + 1024;
  // Q buffers: two where they fit (D = 64, and D = 128 with a 16-bit cache), so a persistent
  // block's producer loads the next item's Q while the consumers still read the current one (or
  // stage their output in it).
  static constexpr int kQStages =
      2 * kQBytes + kKvBytes + kTableAndBarrierBytes <= 227 * 1024 ? 2 : 1;
  // One Q buffer (D = 256, fp8 at D = 128): the producer looks the next item up and issues its
  // first K tile while the consumers still work on the current one, and waits for the buffer
  // only to issue Q.
  static constexpr bool kQAfterFirstK = kQStages == 1;
  static constexpr int kQOffset = 0;  // buffer b at kQOffset + b * kQBytes
  static constexpr int kKOffset = kQOffset + kQStages * kQBytes;
  static constexpr int kVOffset = kKOffset + kKStages * kTileBytes;
  static constexpr int kStagingOffset = kVOffset + kVStages * kTileBytes;
  static constexpr int kSlotOffset = kStagingOffset + kStagingBuffers * kStagingBytes;
  static constexpr int kBarrierOffset = kSlotOffset + kSlotBuffers * kBlockN * 8;
  // Q full/empty per buffer; K, V full/empty per stage; staging full per staging buffer.
  static constexpr int kNumBarriers = 2 * (kQStages + kKStages + kVStages) + kStagingBuffers;
  static constexpr size_t kSmemBytes = kBarrierOffset + kNumBarriers * 8 + 1024;  // + alignment
  static constexpr bool kPingPong = kD <= 128;
  // With two consumers (D = 128) an item's first S and last P V go through the issue turns too,
  // so the consumers stay half a step apart across items: one's first softmax and epilogue
  // overlap the other's products. Three consumers (D = 64) measured slower with it.
  static constexpr bool kTurnEdges = kPingPong && kConsumers == 2;
  // setmaxnreg budgets: the block starts with 168 registers per thread (64512 for 384 threads,
  // __launch_bounds__(384, 1)), 128 with three consumers (512 threads); the producer gives back
  // what the consumers take, so producer + consumers x consumer <= warpgroups x entry. D = 256
  // needs 229 in the consumers (O is 128 of them); three D = 64 consumers hold S (64), P (32)
  // and O (32) in 160.
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : kD > 128 ? 40 : 56;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kD > 128 ? 232 : 224;
  // Short-region blocks: warpgroup 0 alone runs the decode body, the others give their
  // registers back and exit.
  static constexpr int kShortIdleRegs = 24;
  static constexpr int kShortRegs = 240;
  // Registers per thread the block must start with for both splits: the launcher checks the
  // compiled count (a smaller pool would leave setmaxnreg.inc waiting forever).
  static constexpr int kEntryRegs = kConsumers == 3 ? 128 : 168;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * kEntryRegs &&
                    kShortRegs + kConsumers * kShortIdleRegs <= (kConsumers + 1) * kEntryRegs,
                "register pool");
  // Short region (prefill-like batches with decodes, D <= 128): the decode body in its own stages.
  static constexpr bool kShortRegion = kD <= 128;
  // Short blocks own the SM's shared memory (kSm90ShortStages).
  static constexpr int kShortStages = kSm90ShortStages;
  static constexpr size_t kShortSmemBytes =
      kShortRegion ? MmaTileConfig<std::conditional_t<kFp8, __nv_fp8_e4m3, __half>, kD, 1,
                                   kShortStages>::kSmemBytes
                   : 0;
  static constexpr size_t kLaunchSmemBytes =
      kSmemBytes > kShortSmemBytes ? kSmemBytes : kShortSmemBytes;

  static_assert(kD % 64 == 0, "128-byte swizzle atoms: 64 elements of 16 bits");
  static_assert(kBlockN % kRowsPerPass == 0 && kBlockRows % kRowsPerPass == 0 &&
                    kBlockN % kStagingRowsPerPass == 0,
                "copy passes");
  static_assert(kBlockN <= 128, "one producer thread per key computes the key's cache offset");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
  static_assert(kConsumers == 2 || kConsumers == 3, "named barriers: one issue turn per consumer");
  static_assert(kThreads * kEntryRegs <= 65536, "one block per SM");
};

// Barrier addresses in the barrier array: Q full / empty per Q buffer, then K and V full / empty
// per stage, then (fp8) staging full per staging buffer (0: K, 1: V).
template <typename Cfg>
struct Sm90Barriers {
  static constexpr int kQ = Cfg::kQStages, kK = Cfg::kKStages, kV = Cfg::kVStages;
  uint32_t base;  // shared address of barrier 0
  __device__ __forceinline__ uint32_t QFull(int b) const { return base + 8 * b; }
  __device__ __forceinline__ uint32_t QEmpty(int b) const { return base + 8 * (kQ + b); }
  __device__ __forceinline__ uint32_t KFull(int s) const { return base + 8 * (2 * kQ + s); }
  __device__ __forceinline__ uint32_t KEmpty(int s) const { return base + 8 * (2 * kQ + kK + s); }
  __device__ __forceinline__ uint32_t VFull(int s) const {
    return base + 8 * (2 * kQ + 2 * kK + s);
  }
  __device__ __forceinline__ uint32_t VEmpty(int s) const {
    return base + 8 * (2 * kQ + 2 * kK + kV + s);
  }
  __device__ __forceinline__ uint32_t StagingFull(int b) const {
    return base + 8 * (2 * kQ + 2 * kK + 2 * kV + b);
  }
};

// One work item as the producer publishes it to the consumers (in shared memory, item n in slot
// n % 2, complete when its Q buffer's Q full barrier is): more == false ends the block.
struct Sm90Item {
  TileWork w;
  KeyRange range;  // empty for a poisoned sequence (its rows get NaN) and for an empty KV split
  bool more;
};

// K/V through the tensor memory accelerator (TMA), in boxes of 64 elements x box_rows keys with the
// 128-byte swizzle, i.e. one page (or one tile of a larger page) of one 64-column block per copy,
// landing as box_rows rows of 128 bytes in either layout:
// - NHD (a page's rows back to back): the cache as a 3-D tensor (d, head, slot = page * page_size
//   + row), a box 64 x 1 head x box_rows slots. A paired cache (K's rows of a page, then V's:
//   FlashInfer's [P, 2, page_size, Hkv, D]) has 2 * page_size slots per page, pair_rows apart;
// - HND (a head's rows of a page back to back): (d, row, page * heads + head), a box 64 x
//   box_rows rows x 1.
// K of KV head h is head head_step * h of `map`, V head head_step * h + v_head of `v_map`: an
// interleaved cache is both maps (2 h, 2 h + 1), a paired HND cache both (h, Hkv + h), K and V
// caches of their own one map each (h, h). box_rows == 0: no tensor map (page size not a multiple
// of 8 that divides or is divided by the tile, misaligned cache, no driver entry point), cp.async
// only.
struct Sm90KvTensorMap {
  CUtensorMap map;
  CUtensorMap v_map;
  int box_rows;
  int head_step;
  int v_head;
  bool head_major;  // HND
  int heads;        // heads per page of `map` (HND's third coordinate is page * heads + head)
  int pair_rows;    // NHD paired caches: page_size (V's slots follow K's), else 0

  __device__ __forceinline__ const CUtensorMap* Of(int which) const {
    return which == 0 ? &map : &v_map;
  }
  // The box coordinates after d of K (which = 0) or V (1) of `kv_head` at cache slot `slot`
  // (negative: a box outside the tensor, read as zeros).
  __device__ __forceinline__ int2 BoxAt(const PagedAttentionParams& p, int which, int kv_head,
                                        int slot) const {
    const int head = head_step * kv_head + (which == 0 ? 0 : v_head);
    if (slot < 0) return head_major ? make_int2(0, -1) : make_int2(head, slot);
    if (!head_major && pair_rows == 0) return make_int2(head, slot);
    const int page = FastDiv(p.page_size_div, slot);
    if (!head_major) return make_int2(head, slot + (page + which) * pair_rows);
    return make_int2(slot - page * p.page_size, page * heads + head);
  }
};

// Q and the output through TMA: [T, Hq, D] as a 3-D tensor (d, head, token) with the 128-byte
// swizzle. A Q box is 64 columns x heads_per_block heads x tokens_per_tile tokens: the block's
// rows r = token * heads_per_block + head in order, i.e. one 64-column block of Q in shared memory;
// an output box is one warp's 16 rows (16 / heads_per_block tokens). q_box_tokens /
// out_box_tokens == 0: no such map (layout or alignment TMA cannot take, no driver entry point);
// the threads copy instead.
struct Sm90RowTensorMaps {
  CUtensorMap q;
  CUtensorMap out;
  int q_box_tokens;
  int out_box_tokens;
};

// Named barrier ids (0 is __syncthreads): the consumers' issue turns, and the producer warpgroup.
constexpr int kSm90TurnBarrier = 1;  // + consumer index (up to 3 consumers)
constexpr int kSm90ProducerBarrier = 4;

// Byte offset of 16-byte chunk `chunk` of row `row` in a [kD / 64][kRows][64] tile of 16-bit
// elements with the 128-byte swizzle: each 64-element column block is rows of 128 bytes, and
// chunk c of row r sits at c ^ (r % 8) within its row (bits 4-6 of the offset XOR bits 7-9, the
// pattern wgmma's 128-byte swizzle mode reads from a 1024-byte aligned base).
template <int kRows>
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * (kRows * 128) + row * 128 +
                               (((chunk % 8) ^ (row % 8)) * 16));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (all >> 4), swizzle mode 1 in bits 62-63, base offset 0 (1024-byte aligned atoms).
__device__ __forceinline__ uint64_t Sm90Descriptor(uint32_t address, uint32_t leading_bytes,
                                                   uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t{1} << 62);
}

#if XGO_SM90A_DEVICE
// Warp-uniform values for the compiler. WarpUniform: lane 0's copy of a value every lane already
// agrees on (an item's fields, read from shared memory); UniformMod: x % kM rebuilt from warp
// votes. With the item's tile counts passed through the first and the stage bases through the
// second, the stage arithmetic and the wgmma descriptors stay in uniform registers, as in a block
// of one item; from plain shared-memory loads ptxas built every descriptor per thread before each
// wgmma (7 % slower per tile on an H100) and spilled at D = 256.
template <typename V>
__device__ __forceinline__ V WarpUniform(V value) {
  return __shfl_sync(0xffffffffu, value, 0);
}
template <int kM>
__device__ __forceinline__ int UniformMod(int x) {
  const int r = x % kM;
  int out = 0;
#pragma unroll
  for (int b = 0; (1 << b) < kM; ++b) out |= (__any_sync(0xffffffffu, (r >> b) & 1) ? 1 : 0) << b;
  return out;
}

// ---------------------------------------------------------------- producer warpgroup
// Copies rows [row0, row0 + kRowsPerPass, ...) of one K or V tile, 16-byte chunk `chunk` of each:
// the row's cache offset (elements, -1: zero-fill) comes from the key table the producer
// warpgroup built for this tile. Chunks past head_dim are zero-filled.
template <typename T, int kD>
__device__ __forceinline__ void Sm90IssueKvTile(const T* kv_head, const int64_t* slots,
                                                unsigned char* tile, int row0, int chunk,
                                                int head_dim) {
  using Cfg = Sm90PrefillConfig<kD>;
  const bool real_chunk = chunk * 8 < head_dim;
#pragma unroll
  for (int i = 0; i < Cfg::kBlockN / Cfg::kRowsPerPass; ++i) {
    const int r = row0 + i * Cfg::kRowsPerPass;
    const int64_t offset = slots[r];
    const bool valid = offset >= 0 && real_chunk;
    const T* src = valid ? kv_head + offset + chunk * 8 : kv_head;
    CpAsync16(tile + SwizzledOffset<Cfg::kBlockN>(r, chunk), src, valid ? 16 : 0);
  }
}

// Rows [t, t + box_rows) of one K or V tile (thread t, t % box_rows == 0) by TMA: one box per
// 64-column block, from cache slot `slot` of combined head `head`.
template <int kD>
__device__ __forceinline__ void Sm90IssueKvBoxes(const PagedAttentionParams& p,
                                                 const Sm90KvTensorMap& kv_map, int which,
                                                 int kv_head, int slot, uint32_t tile, int t,
                                                 uint32_t bar) {
  using Cfg = Sm90PrefillConfig<kD>;
  MbarExpectTx(bar, static_cast<uint32_t>(kv_map.box_rows * kD * 2));
  const CUtensorMap* map = kv_map.Of(which);
  const int2 at = kv_map.BoxAt(p, which, kv_head, slot);
#pragma unroll
  for (int cb = 0; cb < kD / 64; ++cb) {
    TmaLoad3d(tile + cb * (Cfg::kBlockN * 128) + t * 128, map, cb * 64, at.x, at.y, bar);
  }
}

// fp8 caches: rows [t / kStagingChunksPerRow + k kStagingRowsPerPass] of one K or V tile, 16-byte
// chunk t % kStagingChunksPerRow of each, into a staging buffer of [kBlockN][kD] bytes (row r at
// r kD) by cp.async, from the key table's cache offsets (-1: zero-fill).
template <int kD>
__device__ __forceinline__ void Sm90IssueStagingTile(const uint8_t* kv_head, const int64_t* slots,
                                                     unsigned char* staging, int t, int head_dim) {
  using Cfg = Sm90PrefillConfig<kD, true>;
  const int chunk = t % Cfg::kStagingChunksPerRow;
  const bool real_chunk = chunk * 16 < head_dim;  // zeros past head_dim
#pragma unroll
  for (int i = 0; i < Cfg::kBlockN / Cfg::kStagingRowsPerPass; ++i) {
    const int r = t / Cfg::kStagingChunksPerRow + i * Cfg::kStagingRowsPerPass;
    const int64_t offset = slots[r];
    const bool valid = offset >= 0 && real_chunk;
    const uint8_t* src = valid ? kv_head + offset + chunk * 16 : kv_head;
    CpAsync16(staging + r * kD + chunk * 16, src, valid ? 16 : 0);
  }
}

// fp8 caches: rows [t, t + box_rows) of one K (which = 0) or V (1) tile by TMA into the staging
// buffer (one box of kD bytes x 1 head x box_rows slots, no swizzle), from cache slot `slot`.
template <int kD>
__device__ __forceinline__ void Sm90IssueStagingBoxes(const PagedAttentionParams& p,
                                                      const Sm90KvTensorMap& kv_map, int which,
                                                      int kv_head, int slot, uint32_t staging,
                                                      int t, uint32_t bar) {
  MbarExpectTx(bar, static_cast<uint32_t>(kv_map.box_rows * kD));
  const int2 at = kv_map.BoxAt(p, which, kv_head, slot);
  TmaLoad3d(staging + t * kD, kv_map.Of(which), 0, at.x, at.y, bar);
}

// fp8 caches: this thread's chunks of a staging buffer -> the 16-bit tile (SwizzledOffset layout)
// the consumers read: 16 bytes in, two 16-byte chunks of T out. The 8 threads of a store phase
// cover one 128-byte row of staging (or two 64-byte ones), conflict-free to read; threads whose
// chunk lies in an odd 64-column block store their upper half first, so each store instruction
// puts the phase's 8 chunks in 8 different bank groups.
template <typename T, int kD>
__device__ __forceinline__ void Sm90ConvertStaging(const unsigned char* staging,
                                                   unsigned char* tile, int t) {
  using Cfg = Sm90PrefillConfig<kD, true>;
  const int chunk = t % Cfg::kStagingChunksPerRow;
  const int upper_first = (chunk / 4) & 1;
  // Rows one pass apart share their swizzle phase (a pass is a multiple of 8 rows): each row's
  // addresses are the first row's plus a stride.
  static_assert(Cfg::kStagingRowsPerPass % 8 == 0, "swizzle phase per pass");
  const int row0 = t / Cfg::kStagingChunksPerRow;
  const unsigned char* src = staging + row0 * kD + chunk * 16;
  unsigned char* first = tile + SwizzledOffset<Cfg::kBlockN>(row0, 2 * chunk + upper_first);
  unsigned char* second = tile + SwizzledOffset<Cfg::kBlockN>(row0, 2 * chunk + 1 - upper_first);
#pragma unroll
  for (int i = 0; i < Cfg::kBlockN / Cfg::kStagingRowsPerPass; ++i) {
    uint4 lo, hi;
    Fp8x16To<T>(*reinterpret_cast<const uint4*>(src + i * Cfg::kStagingRowsPerPass * kD), lo, hi);
    *reinterpret_cast<uint4*>(first + i * Cfg::kStagingRowsPerPass * 128) = upper_first ? hi : lo;
    *reinterpret_cast<uint4*>(second + i * Cfg::kStagingRowsPerPass * 128) = upper_first ? lo : hi;
  }
}

// Producer warpgroup, per item, first: Q into the item's buffer, by TMA from thread 0 where the
// launch has a Q map, otherwise by every thread's cp.async (the 16-byte chunks of a
// Sm90PrefillConfig row pass). An item without tiles (an empty KV split, a poisoned sequence) loads
// none: its consumers only store.
template <typename T, int kD>
__device__ __forceinline__ void Sm90ProducerQ(const PagedAttentionParams& p,
                                              const Sm90RowTensorMaps& row_maps, const TileWork& w,
                                              bool has_tiles, unsigned char* q_buffer,
                                              uint32_t full) {
  using Cfg = Sm90PrefillConfig<kD>;
  const int t = static_cast<int>(threadIdx.x);  // 0..127
  if (!has_tiles) {
    MbarArrive(full);
  } else if (row_maps.q_box_tokens > 0) {
    if (t == 0) {
      MbarExpectTx(full, static_cast<uint32_t>(row_maps.q_box_tokens) * p.heads_per_block * kD * 2);
#pragma unroll
      for (int cb = 0; cb < kD / 64; ++cb) {
        TmaLoad3d(SharedAddress(q_buffer) + cb * (Cfg::kBlockRows * 128), &row_maps.q, cb * 64,
                  w.head0, w.tok0, full);
      }
    }
    MbarArrive(full);
  } else {
    // The item thread 0 wrote is published by these arrivals, which PTX does not call releases
    // (the other paths' mbarrier.arrive are): a fence first.
    if (t == 0) __threadfence_block();
    const int chunk = t % Cfg::kChunksPerRow;
    const T* q = static_cast<const T*>(p.query);
#pragma unroll 4
    for (int r = t / Cfg::kChunksPerRow; r < Cfg::kBlockRows; r += Cfg::kRowsPerPass) {
      const bool valid = r < w.rows && chunk * 8 < p.head_dim;  // zeros past head_dim
      const T* src = q;
      if (valid) {
        const int token = w.tok0 + r / p.heads_per_block;
        const int head = w.head0 + r % p.heads_per_block;
        src = q + (static_cast<int64_t>(token) * p.num_q_heads + head) * p.head_dim + chunk * 8;
      }
      CpAsync16(q_buffer + SwizzledOffset<Cfg::kBlockRows>(r, chunk), src, valid ? 16 : 0);
    }
    CpAsyncArriveNoInc(full);
  }
}

// The producer's walk over an item's tiles through the page table: thread t < kBlockN owns key t of
// each tile, its page entry loaded a tile ahead. Keys at or past key_end (the block's causal end)
// and pages outside [0, num_pages) are zero-filled, never read (the prep kernel poisons sequences
// with such pages anyway); for TMA such a page's box starts at a negative slot, outside the
// tensor: zeros.
template <int kN>
struct Sm90KeyWalk {
  int key;
  int page;

  __device__ __forceinline__ Sm90KeyWalk(const PagedAttentionParams& p, const KeyRange& range,
                                         const int32_t* table, int t)
      : key(range.key_base + range.tile_begin * kN + t),
        page(t < kN && key < range.key_end ? table[FastDiv(p.page_size_div, key)] : -1) {}

  // This thread's key of the current tile: its cache offset (page and row strides; -1:
  // zero-fill) into `table_now`, and its slot returned (TMA's coordinate, 32-bit
  // only where the launcher made a tensor map, i.e. the cache has at most INT32_MAX slots). Then
  // on to the next tile.
  __device__ __forceinline__ int Next(const PagedAttentionParams& p, const KeyRange& range,
                                      const int32_t* table, int64_t* table_now, int t) {
    if (t >= kN) return 0;
    int64_t offset = -1;
    int slot = -kN;
    if (key < range.key_end && page >= 0 && page < p.num_pages) {
      const int in_page = key - FastDiv(p.page_size_div, key) * p.page_size;
      const int64_t slot64 = static_cast<int64_t>(page) * p.page_size + in_page;
      slot = static_cast<int>(slot64);
      offset = static_cast<int64_t>(page) * p.kv_page_stride +
               static_cast<int64_t>(in_page) * p.kv_row_stride;
    }
    table_now[t] = offset;
    key += kN;
    page = key < range.key_end ? table[FastDiv(p.page_size_div, key)] : -1;
    return slot;
  }
};

// Warpgroup 0, per item after Sm90ProducerQ (16-bit caches): per tile step: K of this step and V of
// the previous one (the consumers need K_i before V_{i-1}: they issue S_i = Q K_i^T together with
// O += P_{i-1} V_{i-1}). Stages, phases and tables follow the block's tile count over its items
// (tiles_done before this one), so the pipeline runs on from one item into the next. A tile whose
// keys all lie before the block's end goes by TMA when the launch has a tensor map: the threads
// that own a box's first key issue it (no per-row work); the others only arrive. Any other tile
// (the last one or two of a block, or every tile without a tensor map) is gathered by cp.async:
// every thread writes its key's cache offset into a table in shared memory (Sm90KeyWalk) and,
// after a warpgroup barrier, copies chunk t % kChunksPerRow of rows t / kChunksPerRow + k
// kRowsPerPass, zero-filling keys past the end. (Measured on an H100, B1 x 8k, D 128: with
// cp.async alone the producer's per-row instructions bounded the kernel, 1445 us, against 989 us
// with the loads removed.) The tables rotate through 3 buffers: V of step i - 1 still reads table
// i - 1 while table i + 1 is written, and a thread writing table i + 2 has passed the barrier of
// step i + 1, which every thread reaches only after its copies of step i (K_i, V_{i-1}); the
// barriers between items (Sm90ProducerBlock) keep that order across them.
template <typename T, int kD, typename IssueQ>
__device__ __forceinline__ void Sm90ProducerItem(const PagedAttentionParams& p,
                                                 const Sm90KvTensorMap& kv_map, const TileWork& w,
                                                 const KeyRange& range, unsigned char* smem,
                                                 const Sm90Barriers<Sm90PrefillConfig<kD>>& bars,
                                                 int tiles_done, int num_tiles, IssueQ&& issue_q) {
  using Cfg = Sm90PrefillConfig<kD>;
  constexpr int kN = Cfg::kBlockN;
  const int t = static_cast<int>(threadIdx.x);  // 0..127
  const int chunk = t % Cfg::kChunksPerRow;
  const int row0 = t / Cfg::kChunksPerRow;
  if (num_tiles <= 0) return;  // an empty split: the consumers skip every barrier too

  // K and V of this kv head at page 0, row 0; the key table holds each key's offset from it.
  const int64_t head_offset = static_cast<int64_t>(w.kv_head) * p.kv_head_stride;
  const T* k_head = static_cast<const T*>(p.kv_cache) + head_offset;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.seq) * p.pages_per_seq;
  int64_t* slots = reinterpret_cast<int64_t*>(smem + Cfg::kSlotOffset);
  const uint32_t k_tiles = SharedAddress(smem + Cfg::kKOffset);
  const uint32_t v_tiles = SharedAddress(smem + Cfg::kVOffset);
  const bool tma = kv_map.box_rows > 0;
  const bool box_owner = tma && t < kN && t % kv_map.box_rows == 0;
  Sm90KeyWalk<kN> walk(p, range, table, t);
  int prev_slot = 0;      // the box's cache slot in the previous tile (its V goes now)
  bool prev_tma = false;  // whether the previous tile went by TMA
  // V of the block's tile `prev` (the previous step's: its slot and way of loading) into its stage.
  auto issue_v = [&](int prev) {
    const int stage = prev % Cfg::kVStages;
    MbarWait(bars.VEmpty(stage), ((prev / Cfg::kVStages) & 1) ^ 1);
    if (prev_tma) {
      if (box_owner) {
        Sm90IssueKvBoxes<kD>(p, kv_map, 1, w.kv_head, prev_slot, v_tiles + stage * Cfg::kTileBytes,
                             t, bars.VFull(stage));
      }
    } else {
      Sm90IssueKvTile<T, kD>(k_head + p.v_offset, slots + (prev % Cfg::kSlotBuffers) * kN,
                             smem + Cfg::kVOffset + stage * Cfg::kTileBytes, row0, chunk,
                             p.head_dim);
    }
    CpAsyncArriveNoInc(bars.VFull(stage));
  };
#pragma unroll 1
  for (int step = 0; step < num_tiles; ++step) {
    const int tile = tiles_done + step;  // the block's tile count
    int64_t* table_now = slots + (tile % Cfg::kSlotBuffers) * kN;
    const int key0 = range.key_base + (range.tile_begin + step) * kN;
    const bool tile_tma = tma && key0 + kN <= range.key_end;  // every key before the end
    const int slot = walk.Next(p, range, table, table_now, t);
    NamedBarrierSync(kSm90ProducerBarrier, 128);
    const int stage = tile % Cfg::kKStages;
    const uint32_t phase = (tile / Cfg::kKStages) & 1;
    MbarWait(bars.KEmpty(stage), phase ^ 1);  // the first pass over the stages does not wait
    if (tile_tma) {
      if (box_owner) {
        Sm90IssueKvBoxes<kD>(p, kv_map, 0, w.kv_head, slot, k_tiles + stage * Cfg::kTileBytes, t,
                             bars.KFull(stage));
      }
    } else {
      Sm90IssueKvTile<T, kD>(k_head, table_now, smem + Cfg::kKOffset + stage * Cfg::kTileBytes,
                             row0, chunk, p.head_dim);
    }
    CpAsyncArriveNoInc(bars.KFull(stage));
    if (Cfg::kQAfterFirstK && step == 0) issue_q();
    if (step > 0) issue_v(tile - 1);
    prev_slot = slot;
    prev_tma = tile_tma;
  }
  issue_v(tiles_done + num_tiles - 1);
}

// Warpgroup 0, per item after Sm90ProducerQ (fp8 caches): each tile's K and V bytes go into the
// two staging buffers (by TMA where the tile is whole and the launch has a byte tensor map,
// otherwise by cp.async from the key table, zero-filling as Sm90KeyWalk says), and every thread
// converts its chunks of them into the 16-bit stages (Sm90ConvertStaging). The loads of tile
// i + 1 are issued as soon as tile i's bytes of the same buffer are converted, so each load flies
// while the other buffer converts. Staging barriers complete once per tile of the block (parity:
// the tile count); a warpgroup barrier after each conversion frees the buffer for the next load
// and publishes the next tile's key table. Stages fill in the order K_i, V_i (the consumers take
// K_{i+1} before V_i, which only comes earlier).
template <typename T, int kD, typename IssueQ>
__device__ __forceinline__ void Sm90ProducerItemFp8(
    const PagedAttentionParams& p, const Sm90KvTensorMap& kv_map, const TileWork& w,
    const KeyRange& range, unsigned char* smem,
    const Sm90Barriers<Sm90PrefillConfig<kD, true>>& bars, int tiles_done, int num_tiles,
    IssueQ&& issue_q) {
  using Cfg = Sm90PrefillConfig<kD, true>;
  constexpr int kN = Cfg::kBlockN;
  const int t = static_cast<int>(threadIdx.x);  // 0..127
  if (num_tiles <= 0) return;  // an empty split: the consumers skip every barrier too

  const int64_t head_offset = static_cast<int64_t>(w.kv_head) * p.kv_head_stride;
  const uint8_t* k_head = static_cast<const uint8_t*>(p.kv_cache) + head_offset;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.seq) * p.pages_per_seq;
  int64_t* slots = reinterpret_cast<int64_t*>(smem + Cfg::kSlotOffset);
  unsigned char* staging = smem + Cfg::kStagingOffset;  // K bytes, then V bytes
  const bool tma = kv_map.box_rows > 0;
  const bool box_owner = tma && t < kN && t % kv_map.box_rows == 0;
  Sm90KeyWalk<kN> walk(p, range, table, t);
  // Looks the keys of the item's tile `step` up (into the table of block tile `tile`): this
  // thread's slot, and whether the tile goes by TMA. The caller's warpgroup barrier publishes the
  // table.
  struct Load {
    int slot;
    bool tma;
  };
  auto look_up = [&](int step, int tile) {
    const int key0 = range.key_base + (range.tile_begin + step) * kN;
    const int slot = walk.Next(p, range, table, slots + (tile % Cfg::kSlotBuffers) * kN, t);
    return Load{slot, tma && key0 + kN <= range.key_end};  // TMA: every key before the end
  };
  // K (which = 0) or V (1) bytes of block tile `tile` into staging buffer `which`.
  auto issue = [&](int which, int tile, const Load& load) {
    unsigned char* buffer = staging + which * Cfg::kStagingBytes;
    const uint32_t full = bars.StagingFull(which);
    if (load.tma) {
      if (box_owner) {
        Sm90IssueStagingBoxes<kD>(p, kv_map, which, w.kv_head, load.slot, SharedAddress(buffer), t,
                                  full);
      }
    } else {
      Sm90IssueStagingTile<kD>(k_head + which * p.v_offset, slots + (tile % Cfg::kSlotBuffers) * kN,
                               buffer, t, p.head_dim);
    }
    CpAsyncArriveNoInc(full);
  };
  // Staging buffer `which` of block tile `tile` -> its 16-bit K or V stage, once the consumers have
  // released that stage.
  auto convert = [&](int which, int tile) {
    const int num_stages = which == 0 ? Cfg::kKStages : Cfg::kVStages;
    const int stage = tile % num_stages;
    MbarWait(bars.StagingFull(which), tile & 1);
    MbarWait(which == 0 ? bars.KEmpty(stage) : bars.VEmpty(stage),
             ((tile / num_stages) & 1) ^ 1);  // the first pass over the stages does not wait
    Sm90ConvertStaging<T, kD>(
        staging + which * Cfg::kStagingBytes,
        smem + (which == 0 ? Cfg::kKOffset : Cfg::kVOffset) + stage * Cfg::kTileBytes, t);
    // The 16-bit tile is read by wgmma (the async proxy); the staging buffer is written next by
    // TMA (the async proxy too).
    FenceProxyAsync();
    MbarArrive(which == 0 ? bars.KFull(stage) : bars.VFull(stage));
  };

  Load next = look_up(0, tiles_done);
  NamedBarrierSync(kSm90ProducerBarrier, 128);
  issue(0, tiles_done, next);
  issue(1, tiles_done, next);
  if (Cfg::kQAfterFirstK) issue_q();
#pragma unroll 1
  for (int step = 0; step < num_tiles; ++step) {
    const int tile = tiles_done + step;  // the block's tile count
    const bool has_next = step + 1 < num_tiles;
    if (has_next) next = look_up(step + 1, tile + 1);
    convert(0, tile);
    NamedBarrierSync(kSm90ProducerBarrier, 128);  // K's buffer read; the next table written
    if (has_next) issue(0, tile + 1, next);
    convert(1, tile);
    NamedBarrierSync(kSm90ProducerBarrier, 128);  // V's buffer read
    if (has_next) issue(1, tile + 1, next);
  }
}

// Warpgroup 0: the block's items, one after another. Thread 0 looks each one up (in a persistent
// launch every item comes from NextPrefillItem, claimed only when it is looked up, so no block
// holds an item it has not started while another has none; otherwise the block's own index)
// and publishes it in `items` (slot n % 2): with two Q buffers once the consumers have released
// the item's buffer, with one (kQAfterFirstK) at once, Q then following the item's first K tile
// and the buffer's release. The warpgroup loads its Q, K and V while the consumers still work on
// the one before, ahead by up to kQStages items and by the stages. An item without a tile (the
// lookup's end) is published with more == false.
template <typename T, typename KV, int kD>
__device__ __forceinline__ void Sm90ProducerBlock(
    const PagedAttentionParams& p, const PrefillGrid& g, int index, const Sm90KvTensorMap& kv_map,
    const Sm90RowTensorMaps& row_maps, unsigned char* smem,
    const Sm90Barriers<Sm90PrefillConfig<kD, IsFp8<KV>>>& bars, Sm90Item* items) {
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  const int t = static_cast<int>(threadIdx.x);  // 0..127
  if (t == 0) {
    if (kv_map.box_rows > 0) {
      TmaPrefetchDescriptor(&kv_map.map);
      TmaPrefetchDescriptor(&kv_map.v_map);
    }
    if (row_maps.q_box_tokens > 0) TmaPrefetchDescriptor(&row_maps.q);
  }
  int tiles_done = 0;
#pragma unroll 1
  for (int n = 0;; ++n) {
    const int qb = n % Cfg::kQStages;
    // The Q buffer's release by the consumers (of item n - kQStages); the first use does not
    // wait. Every item waits for it once, in order, so no wait runs a phase ahead.
    const uint32_t q_empty_parity = ((n / Cfg::kQStages) & 1) ^ 1;
    Sm90Item& item = items[n % 2];
    // Every thread is done with the item this slot held (item n - 2) before thread 0 writes it
    // again; the consumers are too: they released item n - 2's Q buffer, which thread 0 waits
    // for below (two buffers) or Q of item n - 1 waited for (one).
    NamedBarrierSync(kSm90ProducerBarrier, 128);
    if (t == 0) {
      if (!Cfg::kQAfterFirstK) MbarWait(bars.QEmpty(qb), q_empty_parity);
      bool found = false;
      for (;;) {
        if (g.persistent) index = NextPrefillItem(p, g);
        if (index >= g.prefill_items) break;
        found = FindPrefillTile(p, g.num_q_tiles, index, item.w);
        index = g.prefill_items;  // one item per block unless persistent
        if (found) break;
      }
      item.more = found;
      if (found) {
        item.range = item.w.seq_ok ? SplitKeyRange<Cfg::kBlockN>(p, item.w) : KeyRange{0, 0, 0, 0};
      }
    }
    NamedBarrierSync(kSm90ProducerBarrier, 128);
    const bool more = WarpUniform(item.more);
    const int num_tiles = more ? WarpUniform(item.range.tile_end - item.range.tile_begin) : 0;
    // Q, or the end: after the buffer's release where the lookup did not wait for it (every
    // thread waits: every thread may copy into it).
    auto issue_q = [&]() {
      if (Cfg::kQAfterFirstK) MbarWait(bars.QEmpty(qb), q_empty_parity);
      if (!more) {
        MbarArrive(bars.QFull(qb));  // the consumers read more == false and leave
      } else {
        Sm90ProducerQ<T, kD>(p, row_maps, item.w, num_tiles > 0,
                             smem + Cfg::kQOffset + qb * Cfg::kQBytes, bars.QFull(qb));
      }
    };
    if (!Cfg::kQAfterFirstK || num_tiles <= 0) issue_q();
    if (!more) break;
    if constexpr (IsFp8<KV>) {
      Sm90ProducerItemFp8<T, kD>(p, kv_map, item.w, item.range, smem, bars, tiles_done, num_tiles,
                                 issue_q);
    } else {
      Sm90ProducerItem<T, kD>(p, kv_map, item.w, item.range, smem, bars, tiles_done, num_tiles,
                              issue_q);
    }
    tiles_done += num_tiles;
  }
  CpAsyncWaitAll();  // no copy outlives its thread
}

// ---------------------------------------------------------------- consumer warpgroups
// Consumer `cw` (0 .. kConsumers - 1) owns block rows [64 cw, 64 cw + 64). Thread (warp, lane)
// holds rows 64 cw + 16 warp + lane / 4 + 8 h (h = 0, 1) of S and O (see Wgmma). Only what the
// loop needs stays in registers beside S, O and P (160 of the 224 at D = 128): the tile's
// metadata lives in shared memory (Sm90PrefillBlock) and is read again in the epilogue.
template <typename T, int kD>
struct Sm90Consumer {
  using Cfg = Sm90PrefillConfig<kD>;
  static constexpr int kN = Cfg::kBlockN;
  static constexpr int kS = Cfg::kScoreRegs;
  static constexpr int kO = Cfg::kOutRegs;
  static constexpr int kKeySteps = kN / 16;  // k16 steps of P V
  static constexpr int kDSteps = kD / 16;    // k16 steps of Q K^T

  int row_pos[2];            // key position row h ends at (causal), -1 for padding rows
  int wg_lo_pos, wg_hi_pos;  // the same for this consumer's first and last real row (-1: none)
  OnlineSoftmax<2, 4, Exp2Mode::kApprox> softmax;  // rows h = 0, 1
  float scale2;  // the item's logits multiplier in the log2 domain (TileWork::scale * log2 e)

  __device__ __forceinline__ Sm90Consumer(const PagedAttentionParams& p, const TileWork& w, int cw,
                                          int warp, int lane)
      : scale2(w.scale * kLog2e) {
    const int offset = w.kv_len - w.q_len - w.q_start;  // absolute key position = offset + token
    const int first = 64 * cw;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = first + 16 * warp + lane / 4 + 8 * h;
      row_pos[h] = r < w.rows ? offset + w.tok0 + r / p.heads_per_block : -1;
    }
    const bool has_rows = first < w.rows;
    wg_lo_pos = has_rows ? offset + w.tok0 + first / p.heads_per_block : -1;
    wg_hi_pos = has_rows ? offset + w.tok0 + (min(first + 63, w.rows - 1)) / p.heads_per_block : -1;
  }

  // Scores of the tile at key0 -> probabilities (in place, log2 domain), running max and sum
  // updated; returns whether some row's maximum moved (softmax.Rescale then scales O).
  __device__ __forceinline__ bool Softmax(const PagedAttentionParams& p, float (&s)[kS], int key0,
                                          int lane) {
    // Every real row of this consumer sees every key of the tile: no mask. (Padding rows hold
    // other tokens' Q, or stale shared memory where 128 rows are not whole tokens: values of any
    // kind, rows of their own through both products and the softmax, never stored.)
    const bool visible = key0 + kN - 1 <= wg_lo_pos &&
                         (p.sliding_window == 0 || key0 > wg_hi_pos - p.sliding_window);
    // D 256 always scales: its one-FFMA form measured ~1 % slower there (with the check below).
    const bool fold_scale = kD <= 128 && visible && p.soft_cap == 0.0f && scale2 > 0.0f;
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (fold_scale) {  // max of raw q.k; exp2(s * scale2 - max) below (one FFMA per score)
#pragma unroll
      for (int i = 0; i < kS; ++i) tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    } else {
      // Log2-domain logits (scale, soft cap), then the causal / window mask.
      if (p.soft_cap > 0.0f) {
        // soft_cap * tanh(x) with tanh(x) = 1 - 2 / (e^2x + 1): branch-free (tanhf branches on
        // |x| per element), absolute error ~1e-6, the size that matters before the exp.
        const float in_scale = 2.0f * scale2 / p.soft_cap;
        const float out_scale = p.soft_cap * kLog2e;
#pragma unroll
        for (int i = 0; i < kS; ++i) {
          s[i] = out_scale * (1.0f - 2.0f * FastReciprocal(FastExp2(s[i] * in_scale) + 1.0f));
        }
      } else {
#pragma unroll
        for (int i = 0; i < kS; ++i) s[i] = __fmul_rn(s[i], scale2);  // never fused: see below
      }
      if (!visible) {
        const int key_lane = key0 + 2 * (lane % 4);
#pragma unroll
        for (int i = 0; i < kS; ++i) {
          const int key = key_lane + 8 * (i / 4) + (i & 1);
          // SeesKey's test written out: through the function ptxas spilled 16 bytes here.
          const int pos = row_pos[(i >> 1) & 1];
          const bool keep = key <= pos && (p.sliding_window == 0 || key > pos - p.sliding_window);
          s[i] = keep ? s[i] : -INFINITY;
        }
      }
#pragma unroll
      for (int i = 0; i < kS; ++i) tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    }
    float mult = fold_scale ? scale2 : 1.0f;
    const bool moved = softmax.Fold(tile_max, mult);
    // The FFMA exp2(s * scale2 - max) gives the largest score exp2 of its product's rounding
    // error, not exp2(0): under 2^-9 while |max| < 2^15, up to half an ulp past it (0 or inf at
    // logits ~1e11). There the scores are scaled first, as on masked tiles: the maximum (the
    // rounded product; rounding keeps the order) is then one of them exactly (mul.rn: a multiply
    // fused into the FFMA below would be the one-FFMA form again).
    if (fold_scale && fmaxf(fabsf(softmax.base[0]), fabsf(softmax.base[1])) >= 32768.0f) {
#pragma unroll
      for (int i = 0; i < kS; ++i) s[i] = __fmul_rn(s[i], scale2);
      mult = 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kS; ++i) s[i] = softmax.Prob(s[i], (i >> 1) & 1, mult);
    return moved;
  }

  // Probabilities (S accumulator layout) -> A fragments of P V, one per 16 keys: the accumulator
  // columns 16 kk .. 16 kk + 15 of a thread's two rows are the m64k16 A fragment.
  static __device__ __forceinline__ void ToOperand(const float (&s)[kS],
                                                   uint32_t (&a)[kKeySteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      a[kk][0] = PackPair<T>(s[8 * kk + 0], s[8 * kk + 1]);
      a[kk][1] = PackPair<T>(s[8 * kk + 2], s[8 * kk + 3]);
      a[kk][2] = PackPair<T>(s[8 * kk + 4], s[8 * kk + 5]);
      a[kk][3] = PackPair<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
};

// Consumer `cw` on one item whose Q has landed in `q_buffer` (Sm90ConsumerBlock waited); stages and
// phases follow the block's tile count (tiles_done before this item), as the producer's. Ends when
// the rows are stored (the output staged in this warp's rows of q_buffer has been read).
template <typename T, typename KV, int kD>
__device__ __forceinline__ void Sm90ConsumerItem(
    const PagedAttentionParams& p, const Sm90RowTensorMaps& row_maps, const TileWork& w,
    const KeyRange& range, unsigned char* smem, unsigned char* q_buffer,
    const Sm90Barriers<Sm90PrefillConfig<kD, IsFp8<KV>>>& bars, int cw, int tiles_done,
    int num_tiles) {
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  using C = Sm90Consumer<T, kD>;
  constexpr int kN = Cfg::kBlockN;
  const int tw = static_cast<int>(threadIdx.x) % 128;
  const int warp = tw / 32;
  const int lane = tw % 32;
  C c(p, w, cw, warp, lane);

  float o[C::kO];
#pragma unroll
  for (int i = 0; i < C::kO; ++i) o[i] = 0.0f;

  if (num_tiles > 0) {
    // Descriptors: Q and K K-major (leading offset unused; 8-row groups 1024 bytes apart), k16
    // step ks at +32 bytes inside a 128-byte row, every 4 steps the next 64-column block. V
    // MN-major: 64-column blocks kN x 128 bytes apart (leading), 8-key groups 1024 apart (stride),
    // k16 step kk (16 keys) at + 2048 bytes.
    const uint32_t smem_base = SharedAddress(smem);
    const uint64_t q_desc = Sm90Descriptor(smem_base + static_cast<uint32_t>(q_buffer - smem) +
                                               UniformMod<Cfg::kConsumers>(cw) * 64 * 128,
                                           16, 1024);
    const uint64_t k_desc = Sm90Descriptor(smem_base + Cfg::kKOffset, 16, 1024);
    const uint64_t v_desc = Sm90Descriptor(smem_base + Cfg::kVOffset, kN * 128, 1024);
    auto qk_offset = [](int ks, int rows) -> uint64_t {
      return static_cast<uint64_t>(((ks / 4) * rows * 128 + (ks % 4) * 32) >> 4);
    };
    constexpr uint64_t kTileStep = Cfg::kTileBytes >> 4;

    float s[C::kS];
    uint32_t pa[C::kKeySteps][4];
    // Issue turns go round the consumers: each waits for its own, issues, then passes the next
    // consumer its turn (each named barrier: the 128 threads passing it and the 128 waiting).
    const int my_turn = kSm90TurnBarrier + cw;
    const int next_turn = kSm90TurnBarrier + (cw + 1 == Cfg::kConsumers ? 0 : cw + 1);
    if (Cfg::kPingPong && cw == 0) NamedBarrierArrive(my_turn, 256);  // consumer 0 issues first

    // Step 0: S_0 alone (inside the issue turns with kTurnEdges).
    const int k_base = UniformMod<Cfg::kKStages>(tiles_done);
    const int v_base = UniformMod<Cfg::kVStages>(tiles_done);
    const int stage0 = k_base;
    MbarWait(bars.KFull(stage0), (tiles_done / Cfg::kKStages) & 1);
    FenceProxyAsync();
    if (Cfg::kTurnEdges) NamedBarrierSync(my_turn, 256);
    FenceRegisters(s);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < C::kDSteps; ++ks) {
      Wgmma<T, kN>::SS(s, q_desc + qk_offset(ks, Cfg::kBlockRows),
                       k_desc + stage0 * kTileStep + qk_offset(ks, kN), ks > 0);
    }
    WgmmaCommit();
    if (Cfg::kTurnEdges) NamedBarrierArrive(next_turn, 256);
    WgmmaWait<0>();
    FenceRegisters(s);
    MbarArrive(bars.KEmpty(stage0));
    const int key_first = range.key_base + range.tile_begin * kN;
    c.Softmax(p, s, key_first, lane);  // O is zero: nothing to rescale
    C::ToOperand(s, pa);

    // Step i: S_i = Q K_i^T and O += P_{i-1} V_{i-1} in flight together; softmax of S_i while
    // the PV runs; then rescale O and convert P_i.
#pragma unroll 1
    for (int step = 1; step < num_tiles; ++step) {
      const int tile = tiles_done + step;  // the block's tile count
      const int stage = (k_base + step) % Cfg::kKStages;
      const uint32_t phase = (tile / Cfg::kKStages) & 1;
      const int prev_stage = (v_base + step - 1) % Cfg::kVStages;
      const uint32_t prev_phase = ((tile - 1) / Cfg::kVStages) & 1;
      MbarWait(bars.KFull(stage), phase);
      FenceProxyAsync();
      if (Cfg::kPingPong) NamedBarrierSync(my_turn, 256);
      FenceRegisters(s);
      FenceRegisters(o);
      FenceRegisters(pa);
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < C::kDSteps; ++ks) {
        Wgmma<T, kN>::SS(s, q_desc + qk_offset(ks, Cfg::kBlockRows),
                         k_desc + stage * kTileStep + qk_offset(ks, kN), ks > 0);
      }
      WgmmaCommit();
      MbarWait(bars.VFull(prev_stage), prev_phase);
      FenceProxyAsync();
      WgmmaFence();  // the PV group reads P from registers
#pragma unroll
      for (int kk = 0; kk < C::kKeySteps; ++kk) {
        Wgmma<T, kD>::RS(o, pa[kk], v_desc + prev_stage * kTileStep + kk * (2048 >> 4), 1);
      }
      WgmmaCommit();
      if (Cfg::kPingPong) NamedBarrierArrive(next_turn, 256);
      WgmmaWait<1>();  // S_i is done (groups complete in order); P V may still run
      FenceRegisters(s);
      MbarArrive(bars.KEmpty(stage));
      const bool moved = c.Softmax(p, s, key_first + step * kN, lane);
      WgmmaWait<0>();
      FenceRegisters(o);
      FenceRegisters(pa);
      MbarArrive(bars.VEmpty(prev_stage));
      if (__any_sync(0xffffffffu, moved)) c.softmax.Rescale(o);
      C::ToOperand(s, pa);
    }

    // The last tile's P V (inside the issue turns with kTurnEdges).
    const int last = tiles_done + num_tiles - 1;
    const int last_stage = (v_base + num_tiles - 1) % Cfg::kVStages;
    MbarWait(bars.VFull(last_stage), (last / Cfg::kVStages) & 1);
    FenceProxyAsync();
    if (Cfg::kTurnEdges) NamedBarrierSync(my_turn, 256);
    FenceRegisters(o);
    FenceRegisters(pa);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < C::kKeySteps; ++kk) {
      Wgmma<T, kD>::RS(o, pa[kk], v_desc + last_stage * kTileStep + kk * (2048 >> 4), 1);
    }
    WgmmaCommit();
    if (Cfg::kTurnEdges) NamedBarrierArrive(next_turn, 256);
    WgmmaWait<0>();
    FenceRegisters(o);
    MbarArrive(bars.VEmpty(last_stage));
    // Consumer 0 received one turn more than it took (its own first one, passed round by the
    // last consumer): take it, so every named-barrier arrival is matched before the block exits.
    if (Cfg::kPingPong && cw == 0) NamedBarrierSync(my_turn, 256);
  }

  // Epilogue. Row sums over the 4 threads of a row; empty splits write zero parts and
  // the state {-inf, 0}.
  c.softmax.SumRows();
  const int row_base = 64 * cw + 16 * warp;  // this warp's 16 rows
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + lane / 4 + 8 * h;
    const float sink = w.num_splits == 1 && r < w.rows
                           ? SinkTerm(p, w.head0 + r % p.heads_per_block, c.softmax.max[h])
                           : 0.0f;
    inv[h] = c.softmax.Inverse(h, sink);
  }
  if (w.num_splits == 1) {
    // Normalised rows go through this warp's own Q rows in shared memory (no wgmma reads them
    // any more: this consumer's last one has completed, the other consumer reads only its own)
    // and out in 16-byte stores.
#pragma unroll
    for (int j = 0; j < C::kO / 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_base + lane / 4 + 8 * h;
        *reinterpret_cast<uint32_t*>(q_buffer + SwizzledOffset<Cfg::kBlockRows>(r, j) +
                                     4 * (lane % 4)) =
            PackPair<T>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
      }
    }
    // A warp whose 16 rows are all real stores them by TMA (one box per 64 columns, issued by
    // lane 0, no index arithmetic per row); otherwise row by row.
    if (row_maps.out_box_tokens > 0 && row_base + 16 <= w.rows) {
      FenceSharedForBulkCopy();
      __syncwarp();
      if (lane == 0) {
        const uint32_t staged = SharedAddress(q_buffer) + row_base * 128;
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          if (cb * 64 >= p.head_dim) break;  // padded columns (a box past them would be clipped)
          TmaStore3d(&row_maps.out, cb * 64, w.head0, w.tok0 + row_base / p.heads_per_block,
                     staged + cb * (Cfg::kBlockRows * 128));
        }
        TmaStoreCommitAndWaitRead();  // shared memory stays the block's until then
      }
    } else {
      __syncwarp();
      T* out = static_cast<T*>(p.out);
      for (int i = lane; i < 16 * Cfg::kChunksPerRow; i += 32) {
        const int r = row_base + i / Cfg::kChunksPerRow;
        if (r >= w.rows) break;  // rows ascend with i
        const int chunk = i % Cfg::kChunksPerRow;
        if (chunk * 8 >= p.head_dim) continue;  // a padded column
        const int token = w.tok0 + r / p.heads_per_block;
        const int head = w.head0 + r % p.heads_per_block;
        const uint4 staged =
            *reinterpret_cast<const uint4*>(q_buffer + SwizzledOffset<Cfg::kBlockRows>(r, chunk));
        *reinterpret_cast<uint4*>(
            out + (static_cast<int64_t>(token) * p.num_q_heads + head) * p.head_dim + chunk * 8) =
            staged;
      }
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_base + lane / 4 + 8 * h;
      if (r >= w.rows) continue;
      const int token = w.tok0 + r / p.heads_per_block;
      const int head = w.head0 + r % p.heads_per_block;
      const int64_t split_row = PartRow(p, w, token, head);
      float* dst = p.partial_out + split_row * kD + 2 * (lane % 4);  // part_dim == kD
#pragma unroll
      for (int j = 0; j < C::kO / 4; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
      }
      if (lane % 4 == 0) {
        p.partial_state[split_row] = {c.softmax.max[h], c.softmax.sum[h]};
      }
    }
    return;
  }
  // The rows' LSE, after the output (its registers are free by now: computed earlier, these
  // few values made the kernel spill).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + lane / 4 + 8 * h;
    if (r < w.rows && lane % 4 == 0) {  // a row's 4 lanes hold its sum
      const int head = w.head0 + r % p.heads_per_block;
      const int64_t row = static_cast<int64_t>(w.tok0 + r / p.heads_per_block) * p.num_q_heads;
      p.lse[row + head] = RowLse(p, head, c.softmax.max[h], c.softmax.sum[h]);
    }
  }
}

// Consumer `cw`: the items the producer publishes, in order, until one says there are no more.
// After each, every thread releases the item's Q buffer (and so, in order, its slot in `items`)
// to the producer; its output staging there (generic writes, or reads of the thread copy) is
// ordered before the next TMA load into the buffer by the proxy fence.
template <typename T, typename KV, int kD>
__device__ __forceinline__ void Sm90ConsumerBlock(
    const PagedAttentionParams& p, const Sm90RowTensorMaps& row_maps, unsigned char* smem,
    const Sm90Barriers<Sm90PrefillConfig<kD, IsFp8<KV>>>& bars, const Sm90Item* items, int cw) {
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  int tiles_done = 0;
#pragma unroll 1
  for (int n = 0;; ++n) {
    const int qb = n % Cfg::kQStages;
    MbarWait(bars.QFull(qb), (n / Cfg::kQStages) & 1);
    const Sm90Item& item = items[n % 2];
    if (!WarpUniform(item.more)) break;
    if (WarpUniform(item.w.seq_ok)) {
      const int num_tiles = WarpUniform(item.range.tile_end - item.range.tile_begin);
      Sm90ConsumerItem<T, KV, kD>(p, row_maps, item.w, item.range, smem,
                                  smem + Cfg::kQOffset + qb * Cfg::kQBytes, bars, cw, tiles_done,
                                  num_tiles);
      tiles_done += num_tiles;
    } else {
      PoisonRows<T>(p, item.w, static_cast<int>(threadIdx.x) - 128, 128 * Cfg::kConsumers);
    }
    FenceSharedForBulkCopy();
    MbarArrive(bars.QEmpty(qb));
  }
}

// One prefill block: barriers, then the producer / consumer split with register reallocation.
// `index`: the block's item (a persistent launch's blocks take theirs from NextPrefillItem).
template <typename T, typename KV, int kD>
__device__ __forceinline__ void Sm90PrefillBlock(const PagedAttentionParams& p,
                                                 const PrefillGrid& g, int index,
                                                 const Sm90KvTensorMap& kv_map,
                                                 const Sm90RowTensorMaps& row_maps,
                                                 unsigned char* smem_raw) {
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  const uint32_t raw = SharedAddress(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const Sm90Barriers<Cfg> bars{SharedAddress(smem) + Cfg::kBarrierOffset};
  // The items' metadata lives in shared memory: both roles read it from there, so it holds no
  // registers through the main loops (the consumers' epilogue reads it again).
  __shared__ Sm90Item s_items[2];
  if (threadIdx.x == 0) {
    for (int b = 0; b < Cfg::kQStages; ++b) {
      MbarInit(bars.QFull(b), 128);                     // every producer thread arrives
      MbarInit(bars.QEmpty(b), 128 * Cfg::kConsumers);  // every consumer thread releases
    }
    for (int s = 0; s < Cfg::kKStages; ++s) {
      MbarInit(bars.KFull(s), 128);  // one cp.async arrival per producer thread
      MbarInit(bars.KEmpty(s), 128 * Cfg::kConsumers);
    }
    for (int s = 0; s < Cfg::kVStages; ++s) {
      MbarInit(bars.VFull(s), 128);
      MbarInit(bars.VEmpty(s), 128 * Cfg::kConsumers);
    }
    for (int b = 0; b < Cfg::kStagingBuffers; ++b) MbarInit(bars.StagingFull(b), 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    SetMaxRegistersDecrease<Cfg::kProducerRegs>();
    Sm90ProducerBlock<T, KV, kD>(p, g, index, kv_map, row_maps, smem, bars, s_items);
  } else {
    SetMaxRegistersIncrease<Cfg::kConsumerRegs>();
    Sm90ConsumerBlock<T, KV, kD>(p, row_maps, smem, bars, s_items,
                                 static_cast<int>(threadIdx.x) / 128 - 1);
  }
}
#endif  // XGO_SM90A_DEVICE

// Prefill tiles (and, for D <= 128 with a short region, the short sequences as 16-row decode
// blocks). Grid and block order as PagedAttentionPrefillKernel; Cfg::kThreads threads, one block
// per SM.
// KV: the cache's element type (T, or __nv_fp8_e4m3 converted in the producer).
template <typename T, typename KV, int kD>
__global__ void __launch_bounds__(Sm90PrefillConfig<kD, IsFp8<KV>>::kThreads, 1)
    PagedAttentionSm90PrefillKernel(const __grid_constant__ PagedAttentionParams p, PrefillGrid g,
                                    const __grid_constant__ Sm90KvTensorMap kv_map,
                                    const __grid_constant__ Sm90RowTensorMaps row_maps) {
#if XGO_SM90A_DEVICE
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int index = 0;
  if (IsShortBlock(g, index)) {
    if constexpr (Cfg::kShortRegion) {
      TileWork w;
      if (!FindShortTile(p, index, w)) return;
      if (!w.seq_ok) {
        PoisonRows<T>(p, w);
        return;
      }
      // The decode body is written for 128 threads; the other warpgroups give their registers
      // to it and leave (exited threads do not hold up its __syncthreads).
      if (threadIdx.x >= kThreads) {
        SetMaxRegistersDecrease<Cfg::kShortIdleRegs>();
        return;
      }
      SetMaxRegistersIncrease<Cfg::kShortRegs>();
      // fp8 tiles without the evict-first hint: see PagedAttentionMmaKernel.
      MmaTileBlock<T, kD, 1, Cfg::kShortStages, /*kSelfCheck=*/false,
                   /*kEvictFirst=*/!IsFp8<KV>, KV>(p, w, smem_raw);
    }
    return;
  }
  Sm90PrefillBlock<T, KV, kD>(p, g, index, kv_map, row_maps, smem_raw);
#endif
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_PREFILL_SM90_CUH_
