// kv_cache_store: kv_cache_update for callers that hold K and V apart (vLLM's
// reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, ...)): key and value
// [N, Hkv, D] go to the interleaved cache [P, page_size, 2*Hkv, D], or to kv_cache (K) and
// value_cache (V) [P, page_size, Hkv, D], at vLLM's slots, in place, with no interleaved copy of
// the new rows. The write, its checks and both scatters are core/kv_write.cuh's (slot, scale and
// fp8 rules: kv_cache_update's, docs/DESIGN.md).
#include <array>

#include "core/kv_write.cuh"
#include "core/op_binding.h"

namespace xgo {

struct KvCacheStore {
  static constexpr const char* kName = "kv_cache_store";
  enum { kKey, kValue, kSlotMapping, kKvCache, kKScales, kVScales, kValueCache };
  static constexpr std::array<const char*, 7> kOperandNames = {
      "key", "value", "slot_mapping", "kv_cache", "k_scales", "v_scales", "value_cache"};
  enum { kResult = 7, kValueResult = 8 };  // the updated caches, aliased to their operands
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

  static int32_t Describe(const OpCall<KvCacheStore>& call, Config* config, XgoResults* results) {
    const Shape* o = call.operands;
    return DescribeKvWrite(kName, KvRows{"key", &o[kKey], &o[kValue]}, o[kSlotMapping], o[kKvCache],
                           o[kValueCache], o[kKScales], o[kVScales], call.attrs.k_scale,
                           call.attrs.v_scale, call.attrs.kv_layout, config, results);
  }
  static KvWriteBuffers Buffers(void* const* b) {
    return {b[kKey],     b[kValue],      b[kSlotMapping], b[kKScales],    b[kVScales],
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

using xgo::KvCacheStore;
XGO_DEFINE_OP(KvCacheStore);
