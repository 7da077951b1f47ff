// paged_attention kernels (semantics: docs/DESIGN.md; design notes: docs/KERNELS.md).
// One launch sequence per call, all on the caller's stream:
//   1. PagedAttentionPrepKernel checks the device-side metadata once (flags in the workspace),
//      zero-fills rows no sequence owns, or NaN-fills everything if num_seqs / query_start_loc
//      are inconsistent.
//   2. An attention kernel over grid (q tile, q-head block, KV split): the tensor-core kernel
//      (f16/bf16, mma.sync m16n8k16) or the FMA kernel (f32, exact f32 arithmetic). A q tile is
//      up to tokens_per_tile tokens of ONE sequence x heads_per_block q heads of ONE kv head, so
//      each block reads its K/V once for the whole GQA group; K/V stream through shared memory
//      in 16-byte cp.async copies (2 stages; 3 for decode tiles), with an online softmax.
//   3. PagedAttentionMergeKernel (only with KV splits): the split parts weighed by their states.
// No host sync and no allocation: all scratch space is the caller's workspace.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_KERNELS_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_KERNELS_CUH_

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "xla_gpu_ops/device_utils.cuh"
#include "xla_gpu_ops/dtypes.cuh"
#include "xla_gpu_ops/online_softmax.cuh"
#include "xla_gpu_ops/paged_attention_params.cuh"

namespace xgo {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float QuietNaN() { return __int_as_float(0x7fc00000); }

// n / divisor for 0 <= n < 2^31 (see FastDivisor).
__device__ __forceinline__ int FastDiv(const FastDivisor& f, int n) {
  return f.divisor == 1 ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), f.multiplier) >> f.shift);
}

// Programmatic dependent launch (sm_90+): a kernel launched with the programmatic-serialization
// attribute may start while the previous kernel on the stream drains; it must wait (full
// completion and memory flush of that kernel) before touching anything the previous kernel
// wrote. Both are no-ops when the kernel was launched normally, and compiled out below sm_90.
__device__ __forceinline__ void WaitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowNextKernelToLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// num_seqs in [0, max_num_seqs] and query_start_loc[0..num_seqs] in [0, T] and non-decreasing:
// the row partition every other check relies on. Block-uniform result (all threads call it).
__device__ __forceinline__ bool RowPartitionIsSound(const PagedAttentionParams& p) {
  const int n = *p.num_seqs;
  bool ok = n >= 0 && n <= p.max_num_seqs;
  int bad = 0;
  if (ok) {
    for (int i = threadIdx.x; i <= n; i += blockDim.x) {
      const int start = p.query_start_loc[i];
      bad |= start < 0 || start > p.num_tokens;
      if (i < n) bad |= p.query_start_loc[i + 1] < start;
    }
  }
  return !__syncthreads_or(bad || !ok);
}

// Output rows [0, first) and [last, T) (no sequence owns them) get zeros; with !ok (the row
// partition is broken) every row gets NaN. One block per token, grid-stride, 16-byte stores.
template <typename T>
__device__ __forceinline__ void FillUnownedRows(const PagedAttentionParams& p, bool ok, int first,
                                                int last) {
  constexpr int kPerVec = 16 / sizeof(T);
  T fill_elems[kPerVec];
#pragma unroll
  for (int j = 0; j < kPerVec; ++j) fill_elems[j] = FromFloat<T>(ok ? 0.0f : QuietNaN());
  const uint4 fill = *reinterpret_cast<const uint4*>(fill_elems);
  const int64_t vectors_per_row = static_cast<int64_t>(p.num_q_heads) * p.head_dim / kPerVec;
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    if (ok && t >= first && t < last) continue;
    uint4* row = reinterpret_cast<uint4*>(p.out) + static_cast<int64_t>(t) * vectors_per_row;
    for (int64_t i = threadIdx.x; i < vectors_per_row; i += blockDim.x) row[i] = fill;
  }
}

// Sort key of the short region's slot order: the context length of a sequence of
// 1..short_tokens query tokens, INT_MIN for every other sequence (they go last).
__device__ __forceinline__ int ShortSequenceKey(const PagedAttentionParams& p, int seq) {
  const int q_len = p.query_start_loc[seq + 1] - p.query_start_loc[seq];
  return q_len >= 1 && q_len <= p.short_tokens ? p.context_lens[seq] : INT_MIN;
}

// ---------------------------------------------------------------- 1. metadata check and fill
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

  // Block (x, y) checks entries [y * kPrepPages, ...) of the used pages of sequences x, x + gridDim.x..
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

// ---------------------------------------------------------------- shared tile bookkeeping
// The prep kernel's verdict on sequence seq: lengths sound and every used page in range.
__device__ __forceinline__ bool SequenceChecked(const PagedAttentionParams& p, int seq) {
  bool ok = true;
  for (int c = 0; c < p.page_check_chunks; ++c) {
    ok = ok && p.flags[kFlagsHeader + static_cast<int64_t>(seq) * p.page_check_chunks + c];
  }
  return ok;
}

struct TileWork {
  int seq, q_start, q_len, kv_len;
  int tok0, tok_end;  // this block's tokens [tok0, tok_end) of the sequence, absolute rows
  int head0, kv_head;
  int rows;           // real rows: (tok_end - tok0) * heads_per_block
  bool seq_ok;
  int split, num_splits;  // this block's KV split
  bool by_sequence;       // split parts indexed by sequence (short region), not by token
};

// What every tile lookup fills alike: sequence seq with query rows [start, end), this block's
// tokens [tok0, tok_end) and heads from head0. The caller sets the split fields and seq_ok.
__device__ __forceinline__ void SetSequenceTile(const PagedAttentionParams& p, int seq, int start,
                                                int end, int tok0, int tok_end, int head0,
                                                TileWork& w) {
  w.seq = seq;
  w.q_start = start;
  w.q_len = end - start;
  w.kv_len = p.context_lens[seq];
  w.tok0 = tok0;
  w.tok_end = tok_end;
  w.head0 = head0;
  w.kv_head = head0 / p.group_size;
  w.rows = (tok_end - tok0) * p.heads_per_block;
}

// The largest i in [0, n) with query_start_loc[i] / bq + i <= x (-1 if none), by binary search:
// log2(S) dependent loads.
__device__ __forceinline__ int BisectSequenceOfTile(const PagedAttentionParams& p, int x, int n,
                                                    int bq) {
  int lo = 0, hi = n - 1, found = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (p.query_start_loc[mid] / bq + mid <= x) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

// The same answer by a 32-way search:
// each lane tests one candidate per round, so S <= 32 costs one round of loads and S <= 1024
// two, instead of log2(S) dependent loads (a block's start-up latency in decode). Every warp
// computes the same answer; with a broken (non-monotone) partition the answer is still in range.
__device__ __forceinline__ int FindSequenceOfTile(const PagedAttentionParams& p, int x, int n,
                                                  int bq) {
  const int lane = threadIdx.x % 32;
  int lo = 0, count = n, found = -1;  // candidates [lo, lo + count)
  while (count > 0) {
    const int step = (count + 31) / 32;
    const int i = lo + lane * step;
    const bool below = lane * step < count && p.query_start_loc[i] / bq + i <= x;
    const unsigned ballot = __ballot_sync(0xffffffffu, below);
    if (ballot == 0) break;
    const int k = 31 - __clz(ballot);
    found = lo + k * step;
    count = min(step - 1, lo + count - 1 - found);  // (found, found + step) still unknown
    lo = found + 1;
  }
  return found;
}

// Finds this block's sequence and tokens: q tiles of sequence i start at
// query_start_loc[i] / tokens_per_tile + i (an upper bound of the tiles before it, so grid.x =
// T / tokens_per_tile + S covers every token without host knowledge of the lengths).
// Returns false when the block has nothing to do.
// kSelfCheck (no prep kernel ran): the block checks its own sequence's lengths and the bounds of
// its query_start_loc pair (so it never writes outside [0, T)); block (0, 0, 0) also checks the
// whole row partition into flags[0], which the fill/merge kernel after this one acts on (NaN
// everywhere when it is broken). Without kSelfCheck the prep kernel's flags are read.
template <bool kSelfCheck = false>
__device__ __forceinline__ bool FindTile(const PagedAttentionParams& p, TileWork& w) {
  if constexpr (kSelfCheck) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
      const bool ok = RowPartitionIsSound(p);
      if (threadIdx.x == 0) p.flags[0] = ok ? 1 : 0;
    }
  } else {
    if (p.flags[0] == 0) return false;  // prep NaN-filled everything
  }
  const int n = *p.num_seqs;
  if (kSelfCheck && (n < 0 || n > p.max_num_seqs)) return false;
  // Decode launches number head blocks fastest where grid.y holds the q tiles (params), so the
  // blocks resident at once read all kv heads of fewer sequences.
  const bool heads_fastest = kSelfCheck && p.head_blocks_fastest != 0;
  const int q_tile = heads_fastest ? blockIdx.y : blockIdx.x;
  const int q_tiles = heads_fastest ? gridDim.y : gridDim.x;
  const int head_block = heads_fastest ? blockIdx.x : blockIdx.y;
  // Last q tiles first: in a causal prefill they see the most keys, so the long blocks start early.
  const int x = q_tiles - 1 - q_tile;
  const int bq = p.tokens_per_tile;
  const int found =
      kSelfCheck ? FindSequenceOfTile(p, x, n, bq) : BisectSequenceOfTile(p, x, n, bq);
  if (found < 0) return false;
  const int start = p.query_start_loc[found];
  const int end = p.query_start_loc[found + 1];
  if (kSelfCheck && !(start >= 0 && start <= end && end <= p.num_tokens)) return false;
  const int tok0 = start + (x - (start / bq + found)) * bq;
  if (tok0 >= end) return false;
  SetSequenceTile(p, found, start, end, tok0, min(tok0 + bq, end), head_block * p.heads_per_block,
                  w);
  w.split = blockIdx.z;
  w.num_splits = p.num_splits;
  w.by_sequence = false;
  if constexpr (kSelfCheck) {
    // Pages are checked as they are fetched (KvTileLoader) and outside the read range by
    // PagesOutsideRangeBad.
    const int64_t capacity = static_cast<int64_t>(p.pages_per_seq) * p.page_size;
    w.seq_ok = w.kv_len >= 0 && w.kv_len <= capacity && w.q_len <= w.kv_len;
  } else {
    w.seq_ok = SequenceChecked(p, found);
  }
  return true;
}

// The KV tiles of this block's split: keys [key_base + tile_begin * kBlockN, ...), covering the
// union of the causal (and sliding-window) ranges of the block's rows.
struct KeyRange {
  int key_base, key_end, tile_begin, tile_end;
};

template <int kBlockN>
__device__ __forceinline__ KeyRange SplitKeyRange(const PagedAttentionParams& p,
                                                  const TileWork& w) {
  const int offset = w.kv_len - w.q_len - w.q_start;  // absolute key position of a row = offset + t
  const int first_pos = offset + w.tok0;
  const int last_pos = offset + w.tok_end - 1;
  int lo = 0;
  if (p.sliding_window > 0) lo = max(0, first_pos - p.sliding_window + 1);
  KeyRange r;
  r.key_base = lo / kBlockN * kBlockN;
  r.key_end = last_pos + 1;
  const int num_tiles = (r.key_end - r.key_base + kBlockN - 1) / kBlockN;
  const int per_split = (num_tiles + w.num_splits - 1) / w.num_splits;
  r.tile_begin = min(num_tiles, w.split * per_split);
  r.tile_end = min(num_tiles, r.tile_begin + per_split);
  return r;
}

// Row of (token, head) in the block's split part: [split, T, Hq] by token, or for the short
// sequences of a prefill-like batch [split, S, short_tokens, Hq] by sequence (its parts then need
// workspace for S x short_tokens rows per split instead of T).
__device__ __forceinline__ int64_t PartRow(const PagedAttentionParams& p, const TileWork& w,
                                           int token, int head) {
  if (w.by_sequence) {
    const int64_t slot = (static_cast<int64_t>(w.split) * p.max_num_seqs + w.seq) * p.short_tokens +
                         (token - w.q_start);
    return slot * p.num_q_heads + head;
  }
  return (static_cast<int64_t>(w.split) * p.num_tokens + token) * p.num_q_heads + head;
}

// Four consecutive output values of one row: the output itself (one split) or this split's part.
template <typename T>
__device__ __forceinline__ void StoreRow4(const PagedAttentionParams& p, const TileWork& w,
                                          int token, int head, int d, float4 v) {
  if (w.num_splits == 1) {
    const int64_t row = static_cast<int64_t>(token) * p.num_q_heads + head;
    T* dst = static_cast<T*>(p.out) + row * p.head_dim + d;
    dst[0] = FromFloat<T>(v.x);
    dst[1] = FromFloat<T>(v.y);
    dst[2] = FromFloat<T>(v.z);
    dst[3] = FromFloat<T>(v.w);
  } else {
    float* parts = w.by_sequence ? p.short_out : p.partial_out;
    *reinterpret_cast<float4*>(parts + PartRow(p, w, token, head) * p.head_dim + d) = v;
  }
}

// The row's softmax state where there are splits (PartState).
__device__ __forceinline__ void StorePartState(const PagedAttentionParams& p, const TileWork& w,
                                               int token, int head, float max, float sum) {
  if (w.num_splits == 1) return;
  (w.by_sequence ? p.short_state : p.partial_state)[PartRow(p, w, token, head)] = {max, sum};
}

// A sequence with inconsistent metadata: NaN in all of its rows (every split writes NaN parts),
// shared by `threads` threads of which this is `thread` (by default the whole block).
template <typename T>
__device__ void PoisonRows(const PagedAttentionParams& p, const TileWork& w,
                           int thread = static_cast<int>(threadIdx.x),
                           int threads = static_cast<int>(blockDim.x)) {
  const int vecs = p.head_dim / 4;
  const float nan = QuietNaN();
  for (int i = thread; i < w.rows * vecs; i += threads) {
    const int r = i / vecs;
    const int token = w.tok0 + r / p.heads_per_block;
    const int head = w.head0 + r % p.heads_per_block;
    StoreRow4<T>(p, w, token, head, (i % vecs) * 4, make_float4(nan, nan, nan, nan));
    if (i % vecs == 0) StorePartState(p, w, token, head, nan, nan);
  }
}

// Unmasked logit in the log2 domain: scale, optional soft cap.
__device__ __forceinline__ float Scaled2(const PagedAttentionParams& p, float qk) {
  if (p.soft_cap > 0.0f) return p.soft_cap * tanhf(qk * p.scale / p.soft_cap) * kLog2e;
  return qk * (p.scale * kLog2e);
}

// Whether a query at key position `pos` sees key `key`: causal, and inside the sliding window.
__device__ __forceinline__ bool SeesKey(const PagedAttentionParams& p, int key, int pos) {
  return key <= pos && (p.sliding_window == 0 || key > pos - p.sliding_window);
}

// Masked logit in the log2 domain (-inf when masked): causal + sliding window.
__device__ __forceinline__ float Logit2(const PagedAttentionParams& p, float qk, int key, int pos,
                                        bool row_ok) {
  return row_ok && SeesKey(p, key, pos) ? Scaled2(p, qk) : -INFINITY;
}

// True when every key of the tile is visible to every row of the block (no masking needed;
// padding rows then get finite logits, which are never stored).
__device__ __forceinline__ bool TileFullyVisible(const PagedAttentionParams& p, const TileWork& w,
                                                 int key0, int block_n) {
  const int offset = w.kv_len - w.q_len - w.q_start;
  return key0 + block_n - 1 <= offset + w.tok0 &&
         (p.sliding_window == 0 || key0 > offset + w.tok_end - 1 - p.sliding_window);
}

// Element (row, col) of a shared-memory tile with row stride kLds. kLds == kD: unpadded rows whose
// 16-byte chunks are XOR-swizzled (chunk c of row r is stored at c ^ (r % 8)), so the 8 rows one
// ldmatrix reads hit 8 different bank groups and every row stays 32-byte aligned. kLds > kD:
// padded rows, plain layout. (A 16-byte pad left every other row straddling shared-memory
// sectors; cp.async then asked L2 for those sectors twice: 1.5x the L2 reads of the bytes copied,
// L2 88 % busy at 79 % DRAM throughput on the decode anchor, ncu, H200.)
template <typename T, int kD, int kLds>
__device__ __forceinline__ int TileOffset(int row, int col) {
  if constexpr (kLds == kD) {
    constexpr int kChunk = 16 / sizeof(T);
    static_assert(kD / kChunk >= 8, "swizzle needs 8 chunks per row");
    return row * kLds + (((col / kChunk) ^ (row & 7)) * kChunk) + col % kChunk;
  } else {
    return row * kLds + col;
  }
}

// Byte (row, col) of an fp8 [rows][kD] tile: 16-byte chunks XOR-swizzled so that the 8 rows one
// ldmatrix reads (the same chunk of each) fall in 8 different bank groups. Rows shorter than a
// 128-byte line share one (D = 64: two rows), so the swizzle then follows the line.
template <int kD>
__device__ __forceinline__ int Fp8TileOffset(int row, int col) {
  constexpr int kChunks = kD / 16;
  constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  const int swizzle = (row / kRowsPerLine) % (kChunks >= 8 ? 8 : kChunks);
  return row * kD + (((col / 16) ^ swizzle) * 16) + col % 16;
}

// Copies tiles of kBlockN keys (K and V of one kv head) into shared memory. Each thread always
// copies the same kKeys key rows of a tile (16-byte chunks); their page numbers are fetched one
// tile ahead into registers (FetchPages) so the dependent block_tables load never stalls the
// copy issue (Issue). Keys at or past key_end are zero-filled without reading global memory
// (their block_tables entries may be unused), so masked V rows are finite.
// kEvictFirst: K/V read once (decode), copied with the evict-first L2 policy.
// An fp8 cache (IsFp8<T>) lands in [kBlockN][kD] byte tiles (Fp8TileOffset). Decode tiles convert
// in registers after ldmatrix; 64-row tiles first Dequantize this thread's own chunks into the
// 16-bit tiles the mma.sync loop reads (no barrier between its cp.async wait and the conversion).
template <typename T, int kD, int kBlockN, int kLds, bool kEvictFirst = false>
struct KvTileLoader {
  static constexpr int kChunk = 16 / sizeof(T);
  static constexpr int kChunksPerRow = kD / kChunk;
  static constexpr int kKeyStride = kThreads / kChunksPerRow;
  static constexpr int kKeys = kBlockN / kKeyStride;
  static_assert(kThreads % kChunksPerRow == 0 && kBlockN % kKeyStride == 0, "tile shape");

  __device__ static __forceinline__ int Dst(int key_local, int col) {
    if constexpr (IsFp8<T>) {
      return Fp8TileOffset<kD>(key_local, col);
    } else {
      return TileOffset<T, kD, kLds>(key_local, col);
    }
  }

  // fp8 tiles s_k8 / s_v8 -> 16-bit tiles s_k / s_v (row stride kOutLds, TileOffset layout):
  // exactly the chunks this thread issued.
  template <typename Out, int kOutLds>
  __device__ __forceinline__ void Dequantize(const T* s_k8, const T* s_v8, Out* s_k,
                                             Out* s_v) const {
    static_assert(IsFp8<T>, "only fp8 tiles are dequantised");
    const int key_local0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
    const int col = (static_cast<int>(threadIdx.x) % kChunksPerRow) * kChunk;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const int key_local = key_local0 + i * kKeyStride;
      const int src = Dst(key_local, col);
      const int lo = TileOffset<Out, kD, kOutLds>(key_local, col);
      const int hi = TileOffset<Out, kD, kOutLds>(key_local, col + 8);
      uint4 k_lo, k_hi, v_lo, v_hi;
      Fp8x16To<Out>(*reinterpret_cast<const uint4*>(s_k8 + src), k_lo, k_hi);
      Fp8x16To<Out>(*reinterpret_cast<const uint4*>(s_v8 + src), v_lo, v_hi);
      *reinterpret_cast<uint4*>(s_k + lo) = k_lo;
      *reinterpret_cast<uint4*>(s_k + hi) = k_hi;
      *reinterpret_cast<uint4*>(s_v + lo) = v_lo;
      *reinterpret_cast<uint4*>(s_v + hi) = v_hi;
    }
  }

  int pages[kKeys];       // raw block_tables entries (-1 past key_end); checked in Issue
  bool bad_page = false;  // this thread issued a key whose page is outside [0, num_pages)
  uint64_t policy = kEvictFirst ? EvictFirstPolicy() : 0;

  __device__ __forceinline__ void FetchPages(const PagedAttentionParams& p, const TileWork& w,
                                             int key0, int key_end) {
    const int32_t* table = p.block_tables + static_cast<int64_t>(w.seq) * p.pages_per_seq;
    const int first = key0 + static_cast<int>(threadIdx.x) / kChunksPerRow;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const int key = first + i * kKeyStride;
      // Not inspected here: a compare right after the load makes the warp wait for it before
      // this tile's math instead of at the next Issue (with few warps per SM nothing hides it).
      pages[i] = key < key_end ? table[FastDiv(p.page_size_div, key)] : -1;
    }
  }

  __device__ __forceinline__ void Issue(const PagedAttentionParams& p, const TileWork& w,
                                        int key0, int key_end, T* s_k, T* s_v) {
    const T* kv = static_cast<const T*>(p.kv_cache);
    const int64_t slot_stride = static_cast<int64_t>(2 * p.num_kv_heads) * kD;
    const int key_local0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
    const int col = (static_cast<int>(threadIdx.x) % kChunksPerRow) * kChunk;
    const T* head_base = kv + static_cast<int64_t>(2 * w.kv_head) * kD + col;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const int key_local = key_local0 + i * kKeyStride;
      const int key = key0 + key_local;
      const bool in_range = pages[i] >= 0 && pages[i] < p.num_pages;
      bad_page |= key < key_end && !in_range;
      const bool valid = key < key_end && in_range;  // never read outside the cache
      const int in_page = key - FastDiv(p.page_size_div, key) * p.page_size;
      const int64_t slot = static_cast<int64_t>(pages[i]) * p.page_size + in_page;
      const T* src_k = valid ? head_base + slot * slot_stride : kv;
      const int dst = Dst(key_local, col);
      if constexpr (kEvictFirst) {
        CpAsync16(s_k + dst, src_k, valid ? 16 : 0, policy);
        CpAsync16(s_v + dst, valid ? src_k + kD : kv, valid ? 16 : 0, policy);
      } else {
        CpAsync16(s_k + dst, src_k, valid ? 16 : 0);
        CpAsync16(s_v + dst, valid ? src_k + kD : kv, valid ? 16 : 0);
      }
    }
  }
};

// The K/V pipeline of the cp.async kernels (decode and 64-row tiles, the mma.sync prefill kernel,
// the f32 kernel): kStages stages of one K and one V tile in shared memory (stage s at
// k + s * kStageElems, v + s * kStageElems), filled kStages - 1 tiles ahead, one commit group per
// tile. Loop iteration `tile` computes on the stage Next returns, between a __syncthreads after
// Next (every thread's copies visible) and one at its end (the stage free for the next Issue).
// (The sm_90a kernel's warp-specialised TMA / mbarrier pipeline is its own: Sm90Producer.)
template <typename KV, int kD, int kBlockN, int kLds, int kStages, int kStageElems,
          bool kEvictFirst = false>
struct KvTilePipeline {
  KvTileLoader<KV, kD, kBlockN, kLds, kEvictFirst> loader;
  KV* k;
  KV* v;

  __device__ __forceinline__ KvTilePipeline(KV* k_stages, KV* v_stages)
      : k(k_stages), v(v_stages) {}

  // The prologue: tiles tile_begin .. tile_begin + kStages - 2, one commit group each (empty
  // groups past the range, so the waits count the same).
  __device__ __forceinline__ void Start(const PagedAttentionParams& p, const TileWork& w,
                                        const KeyRange& range) {
    loader.FetchPages(p, w, range.key_base + range.tile_begin * kBlockN, range.key_end);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      const int tile = range.tile_begin + i;
      if (tile < range.tile_end) {
        const int key0 = range.key_base + tile * kBlockN;
        loader.Issue(p, w, key0, range.key_end, k + i * kStageElems, v + i * kStageElems);
        loader.FetchPages(p, w, key0 + kBlockN, range.key_end);
      }
      CpAsyncCommit();
    }
  }

  // Issues tile + kStages - 1 into the stage the previous iteration computed on, then waits for
  // this thread's copies of `tile`. Returns `tile`'s stage.
  __device__ __forceinline__ int Next(const PagedAttentionParams& p, const TileWork& w,
                                      const KeyRange& range, int tile) {
    const int step = tile - range.tile_begin;
    const int ahead = tile + kStages - 1;
    if (ahead < range.tile_end) {
      const int ahead_stage = (step + kStages - 1) % kStages;
      const int key0 = range.key_base + ahead * kBlockN;
      loader.Issue(p, w, key0, range.key_end, k + ahead_stage * kStageElems,
                   v + ahead_stage * kStageElems);
      loader.FetchPages(p, w, key0 + kBlockN, range.key_end);
    }
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    return step % kStages;
  }
};

// Used pages of the sequence that no split of this q tile reads: [0, key_base) (before a sliding
// window) and past key_end (keys of the sequence's later tokens). Split 0 checks them, so every
// used page is checked by some split of every row (the merge turns one NaN part into a NaN row).
__device__ __forceinline__ bool PagesOutsideRangeBad(const PagedAttentionParams& p,
                                                     const TileWork& w, const KeyRange& range) {
  if (w.split != 0 || w.kv_len == 0) return false;
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.seq) * p.pages_per_seq;
  const int used = FastDiv(p.page_size_div, w.kv_len - 1) + 1;
  const int first_read = FastDiv(p.page_size_div, range.key_base);
  const int last_read = FastDiv(p.page_size_div, max(range.key_end - 1, range.key_base));
  bool bad = false;
  for (int e = threadIdx.x; e < first_read; e += blockDim.x) {
    bad |= table[e] < 0 || table[e] >= p.num_pages;
  }
  for (int e = last_read + 1 + threadIdx.x; e < used; e += blockDim.x) {
    bad |= table[e] < 0 || table[e] >= p.num_pages;
  }
  return bad;
}

// The end of a block whose warps split each tile's keys: every warp has parked its rows' softmax
// state in shared memory (maximum s_m[warp][row], sum s_l[warp][row], unnormalised O rows at
// s_out + (warp * 16 + row) * kOutLds); the block's threads merge the kKeyWarps warps of each row
// (the online-softmax merge of states) and store 4 consecutive values at a time, with the row's
// softmax state where there are splits. Warps come in row groups of kKeyWarps (group r / 16), or in
// one group (kOneRowGroup: the block has at most 16 rows).
template <typename T, int kD, int kKeyWarps, int kOutLds, Exp2Mode kMode, bool kOneRowGroup>
__device__ __forceinline__ void MergeKeyWarpsAndStore(const PagedAttentionParams& p,
                                                      const TileWork& w, const float (*s_m)[16],
                                                      const float (*s_l)[16], const float* s_out) {
  constexpr int kVecs = kD / 4;
  for (int i = threadIdx.x; i < w.rows * kVecs; i += kThreads) {
    const int r = i / kVecs;
    const int d = (i % kVecs) * 4;
    const int row_group = kOneRowGroup ? 0 : r / 16;
    const int rr = kOneRowGroup ? r : r % 16;
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kKeyWarps; ++k) m = fmaxf(m, s_m[row_group * kKeyWarps + k][rr]);
    const float base = m == -INFINITY ? 0.0f : m;
    float sum = 0.0f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kKeyWarps; ++k) {
      const int src_warp = row_group * kKeyWarps + k;
      const float weight = Exp2<kMode>(s_m[src_warp][rr] - base);
      sum += weight * s_l[src_warp][rr];
      const float4 part =
          *reinterpret_cast<const float4*>(s_out + (src_warp * 16 + rr) * kOutLds + d);
      o.x += weight * part.x, o.y += weight * part.y;
      o.z += weight * part.z, o.w += weight * part.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
    const int token = w.tok0 + r / p.heads_per_block;
    const int head = w.head0 + r % p.heads_per_block;
    StoreRow4<T>(p, w, token, head, d, o);
    if (d == 0) StorePartState(p, w, token, head, m, sum);
  }
}

template <typename T, int kD, int kBlockRows, int kLds>
__device__ __forceinline__ void LoadQTile(const PagedAttentionParams& p, const TileWork& w,
                                          T* s_q) {
  constexpr int kChunk = 16 / sizeof(T);
  constexpr int kChunksPerRow = kD / kChunk;
  const T* q = static_cast<const T*>(p.query);
  for (int c = threadIdx.x; c < kBlockRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kChunk;
    const bool valid = r < w.rows;
    const T* src = q;
    if (valid) {
      const int token = w.tok0 + r / p.heads_per_block;
      const int head = w.head0 + r % p.heads_per_block;
      src = q + (static_cast<int64_t>(token) * p.num_q_heads + head) * kD + col;
    }
    CpAsync16(s_q + TileOffset<T, kD, kLds>(r, col), src, valid ? 16 : 0);
  }
}

// ---------------------------------------------------------------- 2a. tensor-core kernel
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
  static constexpr int kMinBlocks =
      kD > 128 ? (kTileKeys < kMmaTileKeys ? kD256DecodeMinBlocks : 1)
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
  KV* s_k_copy = kDequantize ? reinterpret_cast<KV*>(s_v + kStageElems) : reinterpret_cast<KV*>(s_k);
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
      LdMatrixX4(q_frag[ks], s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16,
                                                              ks * 16 + (lane / 16) * 8));
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
        QkFp8<TC, kD, kLds, kQInRegisters>(s_k_copy + stage * kCopyElems, wn * kKeysPerWarp,
                                           q_frag, s_q_compute, lane, s);
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
          LdMatrixX4(a0, s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16,
                                                       ks * 16 + (lane / 16) * 8));
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
            LdMatrixX4(a, s_q + TileOffset<T, kD, kLds>(wm * 16 + lane % 16,
                                                        ks * 16 + (lane / 16) * 8));
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
            s[nt][e] = Scaled2(p, s[nt][e]);
            tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            s[nt][e] = Logit2(p, s[nt][e], key0 + nt * 8 + (e & 1), row_pos[h], row_ok[h]);
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
          *reinterpret_cast<float4*>(dst) = make_float4(acc[2 * j][2 * h], acc[2 * j + 1][2 * h],
                                                        acc[2 * j][2 * h + 1],
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

// ---------------------------------------------------------------- 2b. f32 FMA kernel
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
      s[i] = Logit2(p, s[i], key0 + 8 * i, row_pos, row_ok);
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
  const float inv = softmax.Inverse(0);
  const int64_t out_row = static_cast<int64_t>(token) * p.num_q_heads + head;
  if (w.num_splits == 1) {
    float* dst = static_cast<float*>(p.out) + out_row * kD;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) dst[j + 8 * c] = acc[c] * inv;
  } else {
    const int64_t split_row = PartRow(p, w, token, head);
    float* dst = p.partial_out + split_row * kD;
#pragma unroll
    for (int c = 0; c < kColsPerThread; ++c) dst[j + 8 * c] = acc[c] * inv;
    if (j == 0) p.partial_state[split_row] = {softmax.max[0], softmax.sum[0]};
  }
}

// ---------------------------------------------------------------- 3. fill and split merge
// After the decode kernel (no prep kernel ran): rows no sequence owns get zeros, every row gets
// NaN when flags[0] (written by the decode kernel's block 0) says the row partition is broken.
// One block per token (grid-stride); used when there are no splits to merge.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionFillKernel(const __grid_constant__ PagedAttentionParams p) {
  WaitForPreviousKernel();
  AllowNextKernelToLaunch();
  const bool ok = p.flags[0] != 0;
  FillUnownedRows<T>(p, ok, ok ? p.query_start_loc[0] : 0,
                     ok ? p.query_start_loc[*p.num_seqs] : 0);
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
  const int seq = kShort ? static_cast<int>(row / (static_cast<int64_t>(p.short_tokens) * p.num_q_heads)) : 0;
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
          partial_out + (static_cast<int64_t>(z) * num_rows + row) * p.head_dim);
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

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_KERNELS_CUH_
