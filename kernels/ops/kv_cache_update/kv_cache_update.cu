// kv_cache_update: writes new K/V rows, interleaved per head in new_kv, into the paged cache in
// place (vLLM's reshape_and_cache_flash slots). The write itself, its checks, both scatters and
// the op struct's parts are core/kv_write.cuh's, shared with kv_cache_store; this file says where
// the rows are.
//
//   new_kv        [N, 2 * Hkv, D]   float32/float16/bfloat16 (K even, V odd heads)
//   slot_mapping  int32 or int64 [N]: page * page_size + row; negative: padding (skipped)
//   kv_cache      [P, page_size, 2 * Hkv, D] (K even, V odd heads), or with value_cache K alone,
//                 [P, page_size, Hkv, D] (kv_layout HND: heads before page_size); new_kv's dtype
//                 or float8_e4m3fn
//   k_scales      float32 [Hkv], [1] or [0] (none): key scales, times k_scale, read at run time
//   v_scales      float32, as k_scales, for V
//   value_cache   [P, page_size, Hkv, D], kv_cache's dtype: V apart; [0]: absent
// Results: kv_cache and value_cache updated, aliased to their operands where the runtime aliases
// them (JAX, eager torch), else copied from them first.
#include <array>

#include "core/kv_write.cuh"
#include "core/op_binding.h"

namespace xgo {

struct KvCacheUpdate : KvWriteOp<KvCacheUpdate> {
  static constexpr const char* kName = "kv_cache_update";
  enum { kNewKv, kSlotMapping, kKvCache, kKScales, kVScales, kValueCache };
  enum { kKey = kNewKv, kValue = kNewKv };  // K and V interleaved in one source
  static constexpr std::array<const char*, 6> kOperandNames = {
      "new_kv", "slot_mapping", "kv_cache", "k_scales", "v_scales", "value_cache"};
};

}  // namespace xgo

using xgo::KvCacheUpdate;
XGO_DEFINE_OP(KvCacheUpdate);
