// kv_cache_update: static checks, the host (XLA:CPU) implementation, the slot checks, and the op's
// entry in the op table.
#include <cmath>
#include <cstring>

#include "core/host_types.h"
#include "core/op_binding.h"
#include "core/scales.h"
#include "ops/kv_cache_update/kv_cache_update.h"

namespace xgo {
namespace {

constexpr const char* kOp = "kv_cache_update";

int64_t SlotAt(const KvCacheUpdateConfig& c, const void* slots, int64_t n) {
  return c.slot_dtype == XGO_S64 ? static_cast<const int64_t*>(slots)[n]
                                 : static_cast<const int32_t*>(slots)[n];
}

}  // namespace

int32_t KvCacheUpdate::Describe(const OpCall<KvCacheUpdate>& call, Config* config,
                                XgoResults* results) {
  const Shape& new_kv = call.operands[kNewKv];
  const Shape& slots = call.operands[kSlotMapping];
  const Shape& cache = call.operands[kKvCache];
  XGO_RETURN_IF_FAILED(CheckRank(kOp, "new_kv", new_kv, 3));
  XGO_RETURN_IF_FAILED(CheckRank(kOp, "slot_mapping", slots, 1));
  XGO_RETURN_IF_FAILED(CheckRank(kOp, "kv_cache", cache, 4));
  XGO_RETURN_IF_FAILED(CheckRank(kOp, "k_scales", call.operands[kKScales], 1));
  XGO_RETURN_IF_FAILED(CheckRank(kOp, "v_scales", call.operands[kVScales], 1));
  XGO_RETURN_IF_FAILED(CheckDtype(kOp, "new_kv", new_kv, ComputeDtypes{}));
  XGO_RETURN_IF_FAILED(CheckDtype(kOp, "slot_mapping", slots, DtypeSet<XGO_S32, XGO_S64>{}));
  if (cache.dtype != new_kv.dtype && cache.dtype != XGO_F8E4M3FN) {
    return Fail(XGO_INVALID_DTYPE,
                "kv_cache_update: kv_cache: dtype %s is neither new_kv's %s nor float8_e4m3fn",
                DtypeText(cache.dtype).c_str(), DtypeText(new_kv.dtype).c_str());
  }
  if (slots.dims[0] != new_kv.dims[0]) {
    return Fail(XGO_INVALID_ARGUMENT,
                "kv_cache_update: slot_mapping: %lld entries, new_kv has %lld tokens",
                static_cast<long long>(slots.dims[0]), static_cast<long long>(new_kv.dims[0]));
  }
  if (cache.dims[2] != new_kv.dims[1] || cache.dims[3] != new_kv.dims[2]) {
    return Fail(
        XGO_INVALID_ARGUMENT,
        "kv_cache_update: new_kv: rows of shape (%lld, %lld) do not match kv_cache's (%lld, %lld)",
        static_cast<long long>(new_kv.dims[1]), static_cast<long long>(new_kv.dims[2]),
        static_cast<long long>(cache.dims[2]), static_cast<long long>(cache.dims[3]));
  }
  if (cache.dims[2] <= 0 || cache.dims[2] % 2 != 0) {
    return Fail(
        XGO_INVALID_ARGUMENT,
        "kv_cache_update: kv_cache: dim 2 must be 2 * num_kv_heads (K and V interleaved), got %lld",
        static_cast<long long>(cache.dims[2]));
  }
  for (int d = 0; d < 4; ++d) {
    if (cache.dims[d] <= 0) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "kv_cache_update: kv_cache: shape %s has an empty dimension",
                  cache.Text().c_str());
    }
  }
  for (const auto& [name, value] :
       {std::pair{"k_scale", call.attrs.k_scale}, std::pair{"v_scale", call.attrs.v_scale}}) {
    if (!std::isfinite(value) || value <= 0.0f) {
      return Fail(XGO_INVALID_ARGUMENT, "kv_cache_update: %s: must be finite and > 0, got %g", name,
                  static_cast<double>(value));
    }
  }
  if (new_kv.dims[0] < 0) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_update: new_kv: shape %s has a negative dimension",
                new_kv.Text().c_str());
  }
  // The kernel indexes a row with int and the whole cache with int64: both must fit.
  int64_t row_elems = 0, num_slots = 0, cache_elems = 0;
  if (__builtin_mul_overflow(cache.dims[2], cache.dims[3], &row_elems) || row_elems > INT32_MAX ||
      __builtin_mul_overflow(cache.dims[0], cache.dims[1], &num_slots) ||
      __builtin_mul_overflow(num_slots, row_elems, &cache_elems)) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_update: kv_cache: shape %s is too large",
                cache.Text().c_str());
  }
  const int64_t num_kv_heads = cache.dims[2] / 2;
  XGO_RETURN_IF_FAILED(CheckScales(kOp, "k_scale", call.operands[kKScales], num_kv_heads));
  XGO_RETURN_IF_FAILED(CheckScales(kOp, "v_scale", call.operands[kVScales], num_kv_heads));
  Config& c = *config;
  c = Config{new_kv.dtype,
             cache.dtype,
             slots.dtype,
             new_kv.dims[0],
             cache.dims[2],
             cache.dims[3],
             cache.dims[0],
             cache.dims[1],
             call.attrs.k_scale,
             call.attrs.v_scale,
             call.operands[kKScales].dims[0],
             call.operands[kVScales].dims[0]};
  results->results[0] = ToXgoShape(cache);
  return XGO_OK;
}

int32_t KvCacheUpdate::CheckHostValues(const Config& c, const void* const* operands) {
  const void* slots = operands[kSlotMapping];
  if (slots == nullptr && c.num_tokens > 0) {
    return Fail(XGO_INVALID_ARGUMENT, "kv_cache_update: slot_mapping: pointer is NULL");
  }
  for (int64_t n = 0; n < c.num_tokens; ++n) {
    const int64_t slot = SlotAt(c, slots, n);
    if (slot >= c.num_slots()) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "kv_cache_update: slot_mapping: token %lld goes to slot %lld, outside [0, %lld) "
                  "(num_pages * page_size; negative slots are padding)",
                  static_cast<long long>(n), static_cast<long long>(slot),
                  static_cast<long long>(c.num_slots()));
    }
  }
  return XGO_OK;
}

int32_t KvCacheUpdate::RunHost(const Config& c, void* const* buffers) {
  XGO_RETURN_IF_FAILED(CheckHostValues(c, buffers));
  const size_t cache_bytes =
      static_cast<size_t>(c.num_slots() * c.row_elems()) * DtypeSize(c.cache_dtype);
  if (buffers[kResult] != buffers[kKvCache]) {
    std::memcpy(buffers[kResult], buffers[kKvCache], cache_bytes);
  }
  return host::DispatchHost(ComputeDtypes{}, c.dtype, "kv_cache_update: new_kv", [&](auto type) {
    using In = typename decltype(type)::Type;
    auto scatter = [&](auto cache_type) -> int32_t {
      using Out = decltype(cache_type);
      const auto* rows = static_cast<const typename In::Storage*>(buffers[kNewKv]);
      auto* cache = static_cast<typename Out::Storage*>(buffers[kResult]);
      const KvScales scales = MakeKvScales(c.k_scale, c.v_scale, c.k_scales_len, c.v_scales_len,
                                           buffers[kKScales], buffers[kVScales]);
      for (int64_t n = 0; n < c.num_tokens; ++n) {
        const int64_t slot = SlotAt(c, buffers[kSlotMapping], n);
        if (slot < 0) continue;  // padding
        for (int64_t h = 0; h < c.combined_heads; ++h) {
          const float scale = scales.OfCombinedHead(h);
          for (int64_t d = 0; d < c.head_dim; ++d) {
            const int64_t at = h * c.head_dim + d;
            cache[slot * c.row_elems() + at] =
                Out::Store(In::Load(rows[n * c.row_elems() + at]) / scale);
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

using xgo::KvCacheUpdate;
XGO_DEFINE_OP(KvCacheUpdate);
