// kv_cache_store: kv_cache_update for callers that hold K and V apart (vLLM's
// reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, ...)): key and value
// [N, Hkv, D] go to the interleaved cache [P, page_size, 2*Hkv, D], or to kv_cache (K) and
// value_cache (V) [P, page_size, Hkv, D], at vLLM's slots, in place, with no interleaved copy of
// the new rows. The write, its checks, both scatters and the op struct's parts are
// core/kv_write.cuh's (slot, scale and fp8 rules: kv_cache_update's, docs/DESIGN.md).
#include <array>

#include "core/kv_write.cuh"
#include "core/op_binding.h"

namespace xgo {

struct KvCacheStore : KvWriteOp<KvCacheStore> {
  static constexpr const char* kName = "kv_cache_store";
  enum { kKey, kValue, kSlotMapping, kKvCache, kKScales, kVScales, kValueCache };
  static constexpr std::array<const char*, 7> kOperandNames = {
      "key", "value", "slot_mapping", "kv_cache", "k_scales", "v_scales", "value_cache"};
};

}  // namespace xgo

using xgo::KvCacheStore;
XGO_DEFINE_OP(KvCacheStore);
