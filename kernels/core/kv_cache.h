// The paged K/V caches of the ops that read or write them (paged_attention, kv_cache_update,
// kv_cache_store): how they are arranged and their element strides. DescribeKvCaches (core/op.h)
// makes a KvCacheLayout from the caches' shapes and kv_layout. Plain C++: also read by the
// launch plan and the kernels' parameters.
#ifndef XLA_GPU_OPS_CORE_KV_CACHE_H_
#define XLA_GPU_OPS_CORE_KV_CACHE_H_

#include <stdint.h>

namespace xgo {

// The paged K/V caches of an op that reads or writes them, from their shapes and kv_layout:
// - interleaved: kv_cache [P, a, b, D] of 2 * Hkv heads, K of KV head h at head 2h, V at 2h + 1
//   (torch_xla's and JAX's layout);
// - separate: kv_cache holding K and value_cache holding V, each [P, a, b, D] of Hkv heads
//   (vLLM's cache.unbind(0) halves, transformers' paged cache, FlashInfer's (k, v) pair);
// - paired: kv_cache [P, 2, a, b, D] of Hkv heads, K at [:, 0] and V at [:, 1] (FlashInfer's one
//   tensor, vLLM's FlashInfer backend);
// where a, b = page_size, heads (NHD) or heads, page_size (HND).
enum class KvCaches { kInterleaved, kSeparate, kPaired };
struct KvCacheLayout {
  KvCaches caches;
  bool head_major;  // HND
  int64_t num_pages, page_size, num_kv_heads, head_dim;
  // Strides in elements, the same for K and V: K of KV head h at page p, row r lies at
  // p * page_stride + r * row_stride + h * head_stride from kv_cache's start; V at v_offset from
  // it (interleaved, paired), or at the same offset in value_cache (separate; v_offset 0).
  int64_t page_stride, row_stride, head_stride, v_offset;

  // V in a buffer of its own (value_cache), not at v_offset in kv_cache.
  bool separate() const { return caches == KvCaches::kSeparate; }
};

}  // namespace xgo

#endif  // XLA_GPU_OPS_CORE_KV_CACHE_H_
