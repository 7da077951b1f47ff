// paged_attention: what every attention kernel shares (decode and 64-row tiles, the mma.sync and
// sm_90a prefill kernels, the f32 kernel, and the prep / fill / merge kernels around them): the
// device-side metadata checks, the tile lookup (a block's sequence, tokens, heads and KV split:
// TileWork, FindTile, SplitKeyRange), masking and logits in the log2 domain, the shared-memory
// tile layouts, the cp.async K/V pipeline through the page table (KvTileLoader, KvTilePipeline),
// and the stores of output rows and split parts.
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_TILES_CUH_
#define XLA_GPU_OPS_PAGED_ATTENTION_TILES_CUH_

#include <math.h>
#include <stdint.h>

#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "ops/paged_attention/online_softmax.cuh"
#include "ops/paged_attention/params.cuh"

namespace xgo {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float QuietNaN() { return __int_as_float(0x7fc00000); }

// n / divisor for 0 <= n < 2^31 (see FastDivisor).
__device__ __forceinline__ int FastDiv(const FastDivisor& f, int n) {
  return f.divisor == 1
             ? n
             : static_cast<int>(__umulhi(static_cast<uint32_t>(n), f.multiplier) >> f.shift);
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
  const float lse_fill = ok ? -INFINITY : QuietNaN();
  for (int t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {
    if (ok && t >= first && t < last) continue;
    uint4* row = reinterpret_cast<uint4*>(p.out) + static_cast<int64_t>(t) * vectors_per_row;
    for (int64_t i = threadIdx.x; i < vectors_per_row; i += blockDim.x) row[i] = fill;
    float* lse = p.lse + static_cast<int64_t>(t) * p.num_q_heads;
    for (int h = threadIdx.x; h < p.num_q_heads; h += blockDim.x) lse[h] = lse_fill;
  }
}

// ---------------------------------------------------------------- tile bookkeeping
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
  float scale;  // logits multiplier of this KV head: scale * k_scale (* its k_scales entry)
  int rows;     // real rows: (tok_end - tok0) * heads_per_block
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
  w.scale = p.k_scales == nullptr ? p.scale : p.scale * p.k_scales[w.kv_head * p.k_scale_stride];
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
  if (d >= p.head_dim) return;  // a padded column (head_dim below the kernel's)
  if (w.num_splits == 1) {
    const int64_t row = static_cast<int64_t>(token) * p.num_q_heads + head;
    T* dst = static_cast<T*>(p.out) + row * p.head_dim + d;
    dst[0] = FromFloat<T>(v.x);
    dst[1] = FromFloat<T>(v.y);
    dst[2] = FromFloat<T>(v.z);
    dst[3] = FromFloat<T>(v.w);
  } else {
    float* parts = w.by_sequence ? p.short_out : p.partial_out;
    *reinterpret_cast<float4*>(parts + PartRow(p, w, token, head) * p.part_dim + d) = v;
  }
}

// The row's softmax state where there are splits (PartState).
__device__ __forceinline__ void StorePartState(const PagedAttentionParams& p, const TileWork& w,
                                               int token, int head, float max, float sum) {
  if (w.num_splits == 1) return;
  (w.by_sequence ? p.short_state : p.partial_state)[PartRow(p, w, token, head)] = {max, sum};
}

// A finished row's log-sum-exp in natural units, ln(2^max * sum + e^sink): `max` its log2-domain
// maximum (0 or -inf where it saw no key), `sum` its keys' exp2 sum relative to that maximum. The
// sink joins as one more logit; -inf for a row with neither keys nor sink.
__device__ __forceinline__ float RowLse(const PagedAttentionParams& p, int head, float max,
                                        float sum) {
  const float keys = sum > 0.0f ? max + log2f(sum) : -INFINITY;
  const float sink = p.sinks == nullptr ? -INFINITY : p.sinks[head] * kLog2e;
  const float hi = fmaxf(keys, sink);
  if (hi == -INFINITY) return -INFINITY;
  return (hi + log2f(1.0f + exp2f(fminf(keys, sink) - hi))) * kLn2;
}

// Row (token, head)'s LSE (RowLse of its max and sum; NaN for a poisoned row) where the row is
// finished here (one split); a split part's state goes into its PartState instead, for the merge.
__device__ __forceinline__ void StoreRowLse(const PagedAttentionParams& p, const TileWork& w,
                                            int token, int head, float max, float sum) {
  if (w.num_splits != 1) return;
  const float lse = isnan(max) ? max : RowLse(p, head, max, sum);
  p.lse[static_cast<int64_t>(token) * p.num_q_heads + head] = lse;
}

// A sink's share of the softmax denominator of a row of query head `head` whose maximum logit is
// `max` (log2 domain), 0 without sinks: exp(sink - max) in natural units, the sink taken as a
// logit after scale and soft cap. Added where a row is finished (one split, or the merge), never
// to a split's part. A row that saw no key (max -inf) gets +inf, so its output stays 0.
__device__ __forceinline__ float SinkTerm(const PagedAttentionParams& p, int head, float max) {
  return p.sinks == nullptr ? 0.0f : exp2f(fmaf(p.sinks[head], kLog2e, -max));
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
    if (i % vecs == 0) {
      StorePartState(p, w, token, head, nan, nan);
      StoreRowLse(p, w, token, head, nan, nan);
    }
  }
}

// Unmasked logit in the log2 domain: the block's scale (TileWork::scale), optional soft cap.
__device__ __forceinline__ float Scaled2(const PagedAttentionParams& p, float scale, float qk) {
  if (p.soft_cap > 0.0f) return p.soft_cap * tanhf(qk * scale / p.soft_cap) * kLog2e;
  return qk * (scale * kLog2e);
}

// Whether a query at key position `pos` sees key `key`: causal, and inside the sliding window.
__device__ __forceinline__ bool SeesKey(const PagedAttentionParams& p, int key, int pos) {
  return key <= pos && (p.sliding_window == 0 || key > pos - p.sliding_window);
}

// Masked logit in the log2 domain (-inf when masked): causal + sliding window.
__device__ __forceinline__ float Logit2(const PagedAttentionParams& p, float scale, float qk,
                                        int key, int pos, bool row_ok) {
  return row_ok && SeesKey(p, key, pos) ? Scaled2(p, scale, qk) : -INFINITY;
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

  __device__ __forceinline__ void Issue(const PagedAttentionParams& p, const TileWork& w, int key0,
                                        int key_end, T* s_k, T* s_v) {
    const T* kv = static_cast<const T*>(p.kv_cache);
    const int64_t page_stride = p.kv_page_stride;
    const int row_stride = p.kv_row_stride;
    const int key_local0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
    const int col = (static_cast<int>(threadIdx.x) % kChunksPerRow) * kChunk;
    const bool real_col = col < p.head_dim;  // zeros past head_dim
    const int64_t head_offset = static_cast<int64_t>(w.kv_head) * p.kv_head_stride + col;
    const T* k_head = kv + head_offset;
#pragma unroll
    for (int i = 0; i < kKeys; ++i) {
      const int key_local = key_local0 + i * kKeyStride;
      const int key = key0 + key_local;
      const bool in_range = pages[i] >= 0 && pages[i] < p.num_pages;
      bad_page |= key < key_end && !in_range;
      const bool valid = key < key_end && in_range && real_col;  // never read outside the cache
      const int in_page = key - FastDiv(p.page_size_div, key) * p.page_size;
      const int64_t at =
          static_cast<int64_t>(pages[i]) * page_stride + static_cast<int64_t>(in_page) * row_stride;
      const T* src_k = valid ? k_head + at : kv;
      const T* src_v = valid ? src_k + p.v_offset : kv;
      const int dst = Dst(key_local, col);
      if constexpr (kEvictFirst) {
        CpAsync16(s_k + dst, src_k, valid ? 16 : 0, policy);
        CpAsync16(s_v + dst, src_v, valid ? 16 : 0, policy);
      } else {
        CpAsync16(s_k + dst, src_k, valid ? 16 : 0);
        CpAsync16(s_v + dst, src_v, valid ? 16 : 0);
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
    const int token = w.tok0 + r / p.heads_per_block;
    const int head = w.head0 + r % p.heads_per_block;
    const float total = w.num_splits == 1 ? sum + SinkTerm(p, head, base) : sum;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
    StoreRow4<T>(p, w, token, head, d, o);
    if (d == 0) {
      StorePartState(p, w, token, head, m, sum);
      StoreRowLse(p, w, token, head, base, sum);
    }
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
    const bool valid = r < w.rows && col < p.head_dim;  // zeros past head_dim
    const T* src = q;
    if (valid) {
      const int token = w.tok0 + r / p.heads_per_block;
      const int head = w.head0 + r % p.heads_per_block;
      src = q + (static_cast<int64_t>(token) * p.num_q_heads + head) * p.head_dim + col;
    }
    CpAsync16(s_q + TileOffset<T, kD, kLds>(r, col), src, valid ? 16 : 0);
  }
}

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_TILES_CUH_
