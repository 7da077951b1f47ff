// kv_cache_update: writes new K/V rows, interleaved per head in new_kv, into the paged cache in
// place (vLLM's reshape_and_cache_flash slots). The write itself, its checks and both scatters
// are core/kv_write.cuh's, shared with kv_cache_store; this file says where the rows are.
//
//   new_kv        [N, 2 * Hkv, D]   float32/float16/bfloat16 (K even, V odd heads)
//   slot_mapping  int32 or int64 [N]: page * page_size + row; negative: padding (skipped)
//   kv_cache      [P, page_size, 2 * Hkv, D] (K even, V odd heads), or with value_cache K alone,
//                 [P, page_size, Hkv, D]; new_kv's dtype or float8_e4m3fn
//   k_scales      float32 [Hkv], [1] or [0] (none): key scales, times k_scale, read at run time
//   v_scales      float32, as k_scales, for V
//   value_cache   [P, page_size, Hkv, D], kv_cache's dtype: V apart; [0]: absent
// Results: kv_cache and value_cache updated, aliased to their operands where the runtime aliases
// them (JAX, eager torch), else copied from them first.
#include <array>

#include "core/kv_write.cuh"
#include "core/op_binding.h"

namespace xgo {

struct KvCacheUpdate {
  static constexpr const char* kName = "kv_cache_update";
  enum { kNewKv, kSlotMapping, kKvCache, kKScales, kVScales, kValueCache };
  static constexpr std::array<const char*, 6> kOperandNames = {
      "new_kv", "slot_mapping", "kv_cache", "k_scales", "v_scales", "value_cache"};
  enum { kResult = 6, kValueResult = 7 };  // buffer indices: the results follow the operands
  static constexpr std::array<const char*, 2> kResultNames = {"kv_cache", "value_cache"};
  struct Attrs {
    float k_scale;
    float v_scale;
    int64_t kv_layout;  // KvLayout (core/op.h)
  };
  static constexpr std::array<AttrSpec, 3> kAttrs = {{
      {"k_scale", XGO_ATTR_F32, offsetof(Attrs, k_scale)},
      {"v_scale", XGO_ATTR_F32, offsetof(Attrs, v_scale)},
      {"kv_layout", XGO_ATTR_I64, offsetof(Attrs, kv_layout)},
  }};
  using Config = KvWrite;

  static int32_t Describe(const OpCall<KvCacheUpdate>& call, Config* config, XgoResults* results) {
    const Shape* o = call.operands;
    return DescribeKvWrite(kName, KvRows{"new_kv", &o[kNewKv], nullptr}, o[kSlotMapping],
                           o[kKvCache], o[kValueCache], o[kKScales], o[kVScales],
                           call.attrs.k_scale, call.attrs.v_scale, call.attrs.kv_layout, config,
                           results);
  }
  static KvWriteBuffers Buffers(void* const* b) {
    return {b[kNewKv],   b[kNewKv],      b[kSlotMapping], b[kKScales],    b[kVScales],
            b[kKvCache], b[kValueCache], b[kResult],      b[kValueResult]};
  }
  static int32_t Launch(const Config& c, void* const* buffers, cudaStream_t stream) {
    return LaunchKvWrite(c, Buffers(buffers), stream);
  }
  static int32_t RunHost(const Config& c, void* const* buffers) {
    return RunKvWriteHost(c, Buffers(buffers));
  }
  static int32_t CheckHostValues(const Config& c, const void* const* operands) {
    return CheckKvSlots(c, operands[kSlotMapping]);
  }
};

}  // namespace xgo

using xgo::KvCacheUpdate;
XGO_DEFINE_OP(KvCacheUpdate);
