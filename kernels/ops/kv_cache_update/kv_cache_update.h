// kv_cache_update: writes new K/V rows into the paged cache, in place (vLLM's
// reshape_and_cache_flash semantics for the combined layout). The op struct of op.h; Describe,
// RunHost and CheckHostValues in src/kv_cache_update/op.cc, Launch (and its scatter kernel) in
// src/kv_cache_update/launch.cu.
//
//   new_kv        [N, 2 * num_kv_heads, head_dim]   float32/float16/bfloat16 (K even, V odd heads)
//   slot_mapping  int32 or int64 [N]: token n goes to page slot / page_size, row slot % page_size;
//                 a negative slot is padding (skipped)
//   kv_cache      [num_pages, page_size, 2 * num_kv_heads, head_dim]   new_kv's dtype or
//                 float8_e4m3fn (stores round to nearest even, saturating to +-448)
//   k_scales      float32 [num_kv_heads] or [1], or [0]: key scales (times k_scale), read at run
//   time v_scales      float32, as k_scales: value scales (times v_scale) result        kv_cache,
//   updated: the same buffer as the operand where the runtime aliases
//                 them (JAX, eager torch); otherwise the operand is copied first
// Attributes: k_scale, v_scale (f32, > 0): stored K is new K / k_scale, V is new V / v_scale (the
// dequantisation scales paged_attention applies), each times its tensor's entry for the KV head.
// Slots at or past num_pages * page_size: the GPU skips them (never an out-of-bounds write);
// CheckHostValues and the host handler reject them, naming the token.
#ifndef XLA_GPU_OPS_KV_CACHE_UPDATE_H_
#define XLA_GPU_OPS_KV_CACHE_UPDATE_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <array>

#include "core/op.h"

namespace xgo {

struct KvCacheUpdateConfig {
  int32_t dtype;        // new_kv
  int32_t cache_dtype;  // kv_cache and the result
  int32_t slot_dtype;   // slot_mapping: int32 or int64
  int64_t num_tokens;
  int64_t combined_heads;  // 2 * num_kv_heads
  int64_t head_dim;
  int64_t num_pages;
  int64_t page_size;
  float k_scale;
  float v_scale;
  int64_t k_scales_len, v_scales_len;  // entries of k_scales / v_scales: 0 (none), 1 or Hkv

  int64_t row_elems() const { return combined_heads * head_dim; }
  int64_t num_slots() const { return num_pages * page_size; }
};

struct KvCacheUpdate {
  static constexpr const char* kName = "kv_cache_update";
  enum { kNewKv, kSlotMapping, kKvCache, kKScales, kVScales };
  static constexpr std::array<const char*, 5> kOperandNames = {"new_kv", "slot_mapping", "kv_cache",
                                                               "k_scales", "v_scales"};
  enum { kResult = 5 };  // buffer index: the updated cache follows the operands
  static constexpr std::array<const char*, 1> kResultNames = {"kv_cache"};
  struct Attrs {
    float k_scale;
    float v_scale;
  };
  static constexpr std::array<AttrSpec, 2> kAttrs = {{
      {"k_scale", XGO_ATTR_F32, offsetof(Attrs, k_scale)},
      {"v_scale", XGO_ATTR_F32, offsetof(Attrs, v_scale)},
  }};
  using Config = KvCacheUpdateConfig;

  static int32_t Describe(const OpCall<KvCacheUpdate>& call, Config* config, XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config& config, const void* const* operands);
};

}  // namespace xgo

#endif  // XLA_GPU_OPS_KV_CACHE_UPDATE_H_
