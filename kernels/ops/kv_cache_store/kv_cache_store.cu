// kv_cache_store: kv_cache_update for callers that hold K and V apart (vLLM's
// reshape_and_cache_flash(key, value, ...)): key and value [N, Hkv, D] go to the combined cache
// [P, page_size, 2*Hkv, D] (K at even, V at odd heads) at vLLM's slots, in place, with no
// interleaved copy of the new rows. Slot, scale and fp8 rules are kv_cache_update's
// (docs/DESIGN.md). Top to bottom: description and static checks, the host value checks, the CUDA
// kernel and launch, the host (XLA:CPU) implementation, XGO_DEFINE_OP.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/host_types.h"
#include "core/op.h"
#include "core/op_binding.h"
#include "core/scales.h"
#include "core/status.h"

namespace xgo {

struct KvCacheStore {
  static constexpr const char* kName = "kv_cache_store";
  enum { kKey, kValue, kSlotMapping, kKvCache, kKScales, kVScales };
  static constexpr std::array<const char*, 6> kOperandNames = {
      "key", "value", "slot_mapping", "kv_cache", "k_scales", "v_scales"};
  enum { kResult = 6 };  // the updated cache, aliased to kv_cache
  static constexpr std::array<const char*, 1> kResultNames = {"kv_cache"};
  struct Attrs {
    float k_scale;
    float v_scale;
  };
  static constexpr std::array<AttrSpec, 2> kAttrs = {{
      {"k_scale", XGO_ATTR_F32, offsetof(Attrs, k_scale)},
      {"v_scale", XGO_ATTR_F32, offsetof(Attrs, v_scale)},
  }};

  struct Config {
    int32_t dtype;        // key, value
    int32_t cache_dtype;  // kv_cache: key's dtype or float8_e4m3fn
    int32_t slot_dtype;   // int32 or int64
    int64_t num_tokens;
    int64_t num_kv_heads;
    int64_t head_dim;
    int64_t num_slots;  // num_pages * page_size
    float k_scale;
    float v_scale;
    int64_t k_scales_len, v_scales_len;  // k_scales / v_scales entries: 0 (none), 1 or Hkv

    KvScales Scales(void* const* buffers) const {
      return MakeKvScales(k_scale, v_scale, k_scales_len, v_scales_len, buffers[kKScales],
                          buffers[kVScales]);
    }
  };

  static int32_t Describe(const OpCall<KvCacheStore>& call, Config* config, XgoResults* results);
  static int32_t Launch(const Config& config, void* const* buffers, cudaStream_t stream);
  static int32_t RunHost(const Config& config, void* const* buffers);
  static int32_t CheckHostValues(const Config& config, const void* const* operands);
};

// ------------------------------------------------------------------ static checks
int32_t KvCacheStore::Describe(const OpCall<KvCacheStore>& call, Config* config,
                               XgoResults* results) {
  const Shape& key = call.operands[kKey];
  const Shape& value = call.operands[kValue];
  const Shape& slots = call.operands[kSlotMapping];
  const Shape& cache = call.operands[kKvCache];
  XGO_RETURN_IF_FAILED(CheckRank(kName, "key", key, 3));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "value", value, 3));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "slot_mapping", slots, 1));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "kv_cache", cache, 4));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "k_scales", call.operands[kKScales], 1));
  XGO_RETURN_IF_FAILED(CheckRank(kName, "v_scales", call.operands[kVScales], 1));
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "key", key, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckSameDtype(kName, "value", value, "key", key));
  XGO_RETURN_IF_FAILED(CheckDtype(kName, "slot_mapping", slots, DtypeSet<XGO_S32, XGO_S64>{}));
  if (cache.dtype != key.dtype && cache.dtype != XGO_F8E4M3FN) {
    return Fail(XGO_INVALID_DTYPE,
                "kv_cache_store: kv_cache: dtype %s is neither key's %s nor float8_e4m3fn",
                DtypeText(cache.dtype).c_str(), DtypeText(key.dtype).c_str());
  }
  if (!value.SameDims(key)) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: value: shape %s differs from key's %s",
                value.Text().c_str(), key.Text().c_str());
  }
  if (slots.dims[0] != key.dims[0]) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: slot_mapping: %lld entries, key has %lld",
                static_cast<long long>(slots.dims[0]), static_cast<long long>(key.dims[0]));
  }
  if (cache.dims[2] != 2 * key.dims[1] || cache.dims[3] != key.dims[2]) {
    return Fail(XGO_INVALID_ARGUMENT,
                "kv_cache_store: kv_cache: shape %s is not [P, page_size, 2 * Hkv, D] for key's "
                "[N, Hkv, D] = %s",
                cache.Text().c_str(), key.Text().c_str());
  }
  for (int d = 0; d < 4; ++d) {
    if (cache.dims[d] <= 0) {
      return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: kv_cache: shape %s has an empty dimension",
                  cache.Text().c_str());
    }
  }
  for (const auto& [name, scale] :
       {std::pair{"k_scale", call.attrs.k_scale}, std::pair{"v_scale", call.attrs.v_scale}}) {
    if (!std::isfinite(scale) || scale <= 0.0f) {
      return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: %s: must be finite and > 0, got %g", name,
                  static_cast<double>(scale));
    }
  }
  // The kernel indexes a token's K or V row with int and the cache with int64: both must fit.
  int64_t row = 0, num_slots = 0, cache_elems = 0;
  if (__builtin_mul_overflow(cache.dims[2], cache.dims[3], &row) || row > INT32_MAX ||
      __builtin_mul_overflow(cache.dims[0], cache.dims[1], &num_slots) ||
      __builtin_mul_overflow(num_slots, row, &cache_elems)) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: kv_cache: shape %s is too large",
                cache.Text().c_str());
  }
  XGO_RETURN_IF_FAILED(CheckScales(kName, "k_scale", call.operands[kKScales], key.dims[1]));
  XGO_RETURN_IF_FAILED(CheckScales(kName, "v_scale", call.operands[kVScales], key.dims[1]));
  *config = Config{key.dtype,
                   cache.dtype,
                   slots.dtype,
                   key.dims[0],
                   key.dims[1],
                   key.dims[2],
                   num_slots,
                   call.attrs.k_scale,
                   call.attrs.v_scale,
                   call.operands[kKScales].dims[0],
                   call.operands[kVScales].dims[0]};
  results->results[0] = ToXgoShape(cache);
  return XGO_OK;
}

// ------------------------------------------------------------------ host value checks
namespace {

int64_t SlotOf(const KvCacheStore::Config& c, const void* slots, int64_t n) {
  return c.slot_dtype == XGO_S64 ? static_cast<const int64_t*>(slots)[n]
                                 : static_cast<const int32_t*>(slots)[n];
}

}  // namespace

int32_t KvCacheStore::CheckHostValues(const Config& c, const void* const* operands) {
  const void* slots = operands[kSlotMapping];
  if (slots == nullptr && c.num_tokens > 0) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: slot_mapping: pointer is NULL");
  }
  for (int64_t n = 0; n < c.num_tokens; ++n) {
    const int64_t slot = SlotOf(c, slots, n);
    if (slot >= c.num_slots) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "kv_cache_store: slot_mapping: token %lld goes to slot %lld, outside [0, %lld) "
                  "(num_pages * page_size; negative slots are padding)",
                  static_cast<long long>(n), static_cast<long long>(slot),
                  static_cast<long long>(c.num_slots));
    }
  }
  return XGO_OK;
}

// ------------------------------------------------------------------ CUDA
// One block per token (grid-stride); its threads over the cache row's 2 * Hkv * D elements, each
// read from key or value by its combined head (even: K, odd: V).
constexpr int kStoreThreads = 256;

template <typename In, typename Out, typename Slot>
__global__ void __launch_bounds__(kStoreThreads)
    KvCacheStoreKernel(const In* __restrict__ key, const In* __restrict__ value,
                       const Slot* __restrict__ slots, Out* __restrict__ cache, int64_t num_tokens,
                       int64_t num_slots, int kv_row, int head_dim, KvScales scales) {
  for (int64_t n = blockIdx.x; n < num_tokens; n += gridDim.x) {
    const int64_t slot = static_cast<int64_t>(slots[n]);
    if (slot < 0 || slot >= num_slots) continue;  // padding; past the cache: guarded, not written
    Out* target = cache + slot * 2 * kv_row;
    for (int e = threadIdx.x; e < 2 * kv_row; e += blockDim.x) {
      const int head = e / head_dim, d = e % head_dim;
      const int64_t at = n * kv_row + (head / 2) * head_dim + d;
      const float scale = scales.OfCombinedHead(head);
      target[e] = FromFloat<Out>(ToFloat(head % 2 == 0 ? key[at] : value[at]) / scale);
    }
  }
}

int32_t KvCacheStore::Launch(const Config& c, void* const* buffers, cudaStream_t stream) {
  for (int i = 0; i <= kResult; ++i) {
    const bool absent = (i == kKScales && c.k_scales_len == 0) ||
                        (i == kVScales && c.v_scales_len == 0);  // [0]: any pointer
    if (buffers[i] == nullptr && !absent && (i >= kKvCache || c.num_tokens > 0)) {
      return Fail(XGO_INVALID_ARGUMENT, "kv_cache_store: %s: pointer is NULL",
                  i < kResult ? kOperandNames[i] : kResultNames[0]);
    }
  }
  const int64_t kv_row = c.num_kv_heads * c.head_dim;
  if (buffers[kResult] != buffers[kKvCache]) {  // not aliased: the result starts as the cache
    const size_t bytes = static_cast<size_t>(c.num_slots * 2 * kv_row) * DtypeSize(c.cache_dtype);
    XGO_CUDA_CHECK(cudaMemcpyAsync(buffers[kResult], buffers[kKvCache], bytes,
                                   cudaMemcpyDeviceToDevice, stream));
  }
  if (c.num_tokens == 0) return XGO_OK;
  const int blocks = static_cast<int>(std::min<int64_t>(8192, c.num_tokens));
  return DispatchCuda(ComputeDtypes{}, c.dtype, "kv_cache_store: key", [&](auto in_type) {
    using In = typename decltype(in_type)::Type;
    auto launch = [&](auto out_type, auto slot_type) {
      using Out = typename decltype(out_type)::Type;
      using Slot = typename decltype(slot_type)::Type;
      KvCacheStoreKernel<In, Out, Slot><<<blocks, kStoreThreads, 0, stream>>>(
          static_cast<const In*>(buffers[kKey]), static_cast<const In*>(buffers[kValue]),
          static_cast<const Slot*>(buffers[kSlotMapping]), static_cast<Out*>(buffers[kResult]),
          c.num_tokens, c.num_slots, static_cast<int>(kv_row), static_cast<int>(c.head_dim),
          c.Scales(buffers));
      XGO_CUDA_CHECK(cudaGetLastError());
      return int32_t{XGO_OK};
    };
    auto with_slots = [&](auto out_type) {
      return c.slot_dtype == XGO_S64 ? launch(out_type, TypeTag<int64_t>{})
                                     : launch(out_type, TypeTag<int32_t>{});
    };
    if (c.cache_dtype == XGO_F8E4M3FN) return with_slots(TypeTag<__nv_fp8_e4m3>{});
    return with_slots(TypeTag<In>{});
  });
}

// ------------------------------------------------------------------ host (XLA:CPU)
int32_t KvCacheStore::RunHost(const Config& c, void* const* buffers) {
  XGO_RETURN_IF_FAILED(CheckHostValues(c, buffers));
  const int64_t kv_row = c.num_kv_heads * c.head_dim;
  if (buffers[kResult] != buffers[kKvCache]) {
    const size_t bytes = static_cast<size_t>(c.num_slots * 2 * kv_row) * DtypeSize(c.cache_dtype);
    std::memcpy(buffers[kResult], buffers[kKvCache], bytes);
  }
  return host::DispatchHost(ComputeDtypes{}, c.dtype, "kv_cache_store: key", [&](auto type) {
    using In = typename decltype(type)::Type;
    auto scatter = [&](auto cache_type) -> int32_t {
      using Out = decltype(cache_type);
      const auto* key = static_cast<const typename In::Storage*>(buffers[kKey]);
      const auto* value = static_cast<const typename In::Storage*>(buffers[kValue]);
      auto* cache = static_cast<typename Out::Storage*>(buffers[kResult]);
      const KvScales scales = c.Scales(buffers);
      for (int64_t n = 0; n < c.num_tokens; ++n) {
        const int64_t slot = SlotOf(c, buffers[kSlotMapping], n);
        if (slot < 0) continue;  // padding
        for (int64_t h = 0; h < c.num_kv_heads; ++h) {
          const float k_scale = scales.K(h), v_scale = scales.V(h);
          for (int64_t d = 0; d < c.head_dim; ++d) {
            const int64_t at = n * kv_row + h * c.head_dim + d;
            const int64_t row = slot * 2 * kv_row + 2 * h * c.head_dim + d;
            cache[row] = Out::Store(In::Load(key[at]) / k_scale);
            cache[row + c.head_dim] = Out::Store(In::Load(value[at]) / v_scale);
          }
        }
      }
      return XGO_OK;
    };
    if (c.cache_dtype == XGO_F8E4M3FN) return scatter(host::F8E4M3FN{});
    return scatter(In{});
  });
}

}  // namespace xgo

using xgo::KvCacheStore;
XGO_DEFINE_OP(KvCacheStore);
