// Writes of new tokens' K and V rows into a paged cache, shared by kv_cache_update (K and V
// interleaved in new_kv) and kv_cache_store (key and value apart): the static checks, the slot
// checks, the CUDA scatter and the host (XLA:CPU) scatter. Either op writes into any cache
// arrangement of core/kv_cache.h (interleaved, separate, paired; NHD or HND). Sources and caches
// are addressed through element strides, so each op only says where its rows are.
//
// Token n goes to page slot / page_size, row slot % page_size; a negative slot is padding. K is
// stored divided by its scale, V by its own (scales.h), rounded to the cache dtype (fp8 saturates
// at +-448). Slots at or past P * page_size: the GPU skips them, the host paths reject them
// naming the token.
#ifndef XLA_GPU_OPS_CORE_KV_WRITE_CUH_
#define XLA_GPU_OPS_CORE_KV_WRITE_CUH_

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/host_types.h"
#include "core/op.h"
#include "core/scales.h"
#include "core/status.h"

namespace xgo {
// Internal to each op's file that includes it (its kernels too): two ops, two copies.
namespace {

// Everything static about one write. Element offsets of KV head h of token n: in the sources
// n * src_token + h * src_head (V: + src_v, in value's buffer); in the caches, for slot s at page
// s / page_size, row s % page_size, the cache layout's strides (core/kv_cache.h).
struct KvWrite {
  const char* op;
  int32_t dtype;        // the new rows
  int32_t cache_dtype;  // the cache(s): the rows' dtype or float8_e4m3fn
  int32_t slot_dtype;   // int32 or int64
  int64_t num_tokens, num_kv_heads, head_dim, num_slots;
  int64_t src_token, src_head, src_v;
  KvCacheLayout cache;
  float k_scale, v_scale;
  int64_t k_scales_len, v_scales_len;  // entries of k_scales / v_scales: 0 (none), 1 or Hkv

  // Elements of each cache buffer (kv_cache; value_cache too when separate).
  int64_t cache_elems() const { return cache.num_pages * cache.page_stride; }
  XGO_HOST_DEVICE int64_t CacheOffset(int64_t slot, int64_t kv_head) const {
    return slot / cache.page_size * cache.page_stride + slot % cache.page_size * cache.row_stride +
           kv_head * cache.head_stride;
  }
};

// The buffers of one write. Interleaved sources: value == key; one cache: value_cache and
// value_out are unused.
struct KvWriteBuffers {
  const void* key;
  const void* value;
  const void* slots;
  const void* k_scales;
  const void* v_scales;
  const void* cache;
  const void* value_cache;
  void* out;
  void* value_out;
};

// The sources of a write, for the checks: new_kv's interleaved rows [N, 2*Hkv, D] (value null),
// or key and value [N, Hkv, D] apart.
struct KvRows {
  const char* key_name;
  const Shape* key;
  const Shape* value;
};

// ------------------------------------------------------------------ static checks
// The checks of either op, naming its arguments; fills *w and the results (the cache, then
// value_cache or its absent [0] stand-in).
int32_t DescribeKvWrite(const char* op, KvRows rows, const Shape& slots, const Shape& cache,
                        const Shape& value_cache, const Shape& k_scales, const Shape& v_scales,
                        float k_scale, float v_scale, int64_t kv_layout, KvWrite* w,
                        XgoResults* results) {
  const Shape& key = *rows.key;
  const bool apart = rows.value != nullptr;
  XGO_RETURN_IF_FAILED(CheckRank(op, rows.key_name, key, 3));
  if (apart) XGO_RETURN_IF_FAILED(CheckRank(op, "value", *rows.value, 3));
  XGO_RETURN_IF_FAILED(CheckRank(op, "slot_mapping", slots, 1));
  KvCacheLayout layout{};
  XGO_RETURN_IF_FAILED(DescribeKvCaches(op, cache, value_cache, kv_layout, &layout));
  XGO_RETURN_IF_FAILED(CheckRank(op, "k_scales", k_scales, 1));
  XGO_RETURN_IF_FAILED(CheckRank(op, "v_scales", v_scales, 1));
  XGO_RETURN_IF_FAILED(CheckDtype(op, rows.key_name, key, ComputeDtypes{}));
  if (apart) XGO_RETURN_IF_FAILED(CheckSameDtype(op, "value", *rows.value, "key", key));
  XGO_RETURN_IF_FAILED(CheckDtype(op, "slot_mapping", slots, DtypeSet<XGO_S32, XGO_S64>{}));
  if (cache.dtype != key.dtype && cache.dtype != XGO_F8E4M3FN) {
    return Fail(XGO_INVALID_DTYPE, "%s: kv_cache: dtype %s is neither %s's %s nor float8_e4m3fn",
                op, DtypeText(cache.dtype).c_str(), rows.key_name, DtypeText(key.dtype).c_str());
  }
  if (apart) XGO_RETURN_IF_FAILED(CheckSameDims(op, "value", *rows.value, "key", key));
  if (slots.dims[0] != key.dims[0]) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: slot_mapping: %lld entries, %s has %lld tokens", op,
                static_cast<long long>(slots.dims[0]), rows.key_name,
                static_cast<long long>(key.dims[0]));
  }
  // Per source row and per cache page row, heads as the interleaved layout counts them (K and V).
  const bool interleaved = layout.caches == KvCaches::kInterleaved;
  const int64_t source_heads = apart ? 2 * key.dims[1] : key.dims[1];
  if (source_heads != 2 * layout.num_kv_heads || key.dims[2] != layout.head_dim) {
    const char* rows_of = apart ? "[Hkv, D]" : "[2 * Hkv, D]";
    const char* cache_of = interleaved ? "[2 * Hkv, D]" : "[Hkv, D]";
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: %s: rows of shape (%lld, %lld) do not match kv_cache %s (%s rows, %s "
                "cache rows)",
                op, rows.key_name, static_cast<long long>(key.dims[1]),
                static_cast<long long>(key.dims[2]), cache.Text().c_str(), rows_of, cache_of);
  }
  if (key.dims[1] <= 0 || key.dims[2] <= 0) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: %s: shape %s has an empty dimension", op, rows.key_name,
                key.Text().c_str());
  }
  for (const auto& [name, value] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    if (!std::isfinite(value) || value <= 0.0f) {
      return Fail(XGO_INVALID_ARGUMENT, "%s: %s: must be finite and > 0, got %g", op, name,
                  static_cast<double>(value));
    }
  }
  // The kernel indexes a token's K and V elements (2 * Hkv * D) with int: they must fit.
  const int64_t num_kv_heads = layout.num_kv_heads, head_dim = layout.head_dim;
  int64_t row = 0;
  if (__builtin_mul_overflow(2 * num_kv_heads, head_dim, &row) || row > INT32_MAX) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: kv_cache: shape %s is too large", op,
                cache.Text().c_str());
  }
  XGO_RETURN_IF_FAILED(CheckScales(op, "k_scale", k_scales, num_kv_heads));
  XGO_RETURN_IF_FAILED(CheckScales(op, "v_scale", v_scales, num_kv_heads));
  const int64_t apart_row = num_kv_heads * head_dim;
  *w = KvWrite{op,
               key.dtype,
               cache.dtype,
               slots.dtype,
               key.dims[0],
               num_kv_heads,
               head_dim,
               layout.num_pages * layout.page_size,
               apart ? apart_row : 2 * apart_row,
               apart ? head_dim : 2 * head_dim,
               apart ? 0 : head_dim,
               layout,
               k_scale,
               v_scale,
               k_scales.dims[0],
               v_scales.dims[0]};
  results->results[0] = ToXgoShape(cache);
  results->results[1] = ToXgoShape(value_cache);
  return XGO_OK;
}

// ------------------------------------------------------------------ slot checks (host copies)
int64_t KvSlotAt(const KvWrite& w, const void* slots, int64_t n) {
  return w.slot_dtype == XGO_S64 ? static_cast<const int64_t*>(slots)[n]
                                 : static_cast<const int32_t*>(slots)[n];
}

int32_t CheckKvSlots(const KvWrite& w, const void* slots) {
  if (slots == nullptr && w.num_tokens > 0) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: slot_mapping: pointer is NULL", w.op);
  }
  for (int64_t n = 0; n < w.num_tokens; ++n) {
    const int64_t slot = KvSlotAt(w, slots, n);
    if (slot >= w.num_slots) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "%s: slot_mapping: token %lld goes to slot %lld, outside [0, %lld) "
                  "(num_pages * page_size; negative slots are padding)",
                  w.op, static_cast<long long>(n), static_cast<long long>(slot),
                  static_cast<long long>(w.num_slots));
    }
  }
  return XGO_OK;
}

// ------------------------------------------------------------------ CUDA
constexpr int kKvWriteThreads = 256;

// One block per token (grid-stride); its threads over the token's K elements, then its V ones.
template <typename In, typename Out, typename Slot>
__global__ void __launch_bounds__(kKvWriteThreads)
    KvWriteKernel(const In* __restrict__ key, const In* __restrict__ value,
                  const Slot* __restrict__ slots, Out* k_cache, Out* v_cache, KvWrite w,
                  KvScales scales) {
  const int head_dim = static_cast<int>(w.head_dim);
  const int row = static_cast<int>(w.num_kv_heads * w.head_dim);
  for (int64_t n = blockIdx.x; n < w.num_tokens; n += gridDim.x) {
    const int64_t slot = static_cast<int64_t>(slots[n]);
    if (slot < 0 || slot >= w.num_slots) continue;  // padding; past the cache: guarded
    for (int e = threadIdx.x; e < 2 * row; e += blockDim.x) {
      const bool is_v = e >= row;
      const int at = is_v ? e - row : e, h = at / head_dim, d = at % head_dim;
      const In* source = is_v ? value + w.src_v : key;
      Out* target = is_v ? v_cache + w.cache.v_offset : k_cache;
      const float scale = is_v ? scales.V(h) : scales.K(h);
      target[w.CacheOffset(slot, h) + d] =
          FromFloat<Out>(ToFloat(source[n * w.src_token + h * w.src_head + d]) / scale);
    }
  }
}

int32_t LaunchKvWrite(const KvWrite& w, const KvWriteBuffers& b, cudaStream_t stream) {
  const bool scales_absent[2] = {w.k_scales_len == 0, w.v_scales_len == 0};
  const struct {
    const char* name;
    const void* pointer;
    bool needed;
  } pointers[] = {
      {"key", b.key, w.num_tokens > 0},
      {"value", b.value, w.num_tokens > 0},
      {"slot_mapping", b.slots, w.num_tokens > 0},
      {"k_scales", b.k_scales, !scales_absent[0] && w.num_tokens > 0},
      {"v_scales", b.v_scales, !scales_absent[1] && w.num_tokens > 0},
      {"kv_cache", b.cache, true},
      {"value_cache", b.value_cache, w.cache.separate()},
      {"the result kv_cache", b.out, true},
      {"the result value_cache", b.value_out, w.cache.separate()},
  };
  for (const auto& p : pointers) {
    if (p.needed && p.pointer == nullptr) {
      return Fail(XGO_INVALID_ARGUMENT, "%s: %s: pointer is NULL", w.op, p.name);
    }
  }
  // Not aliased: a result starts as its cache.
  const size_t bytes = static_cast<size_t>(w.cache_elems()) * DtypeSize(w.cache_dtype);
  if (b.out != b.cache) {
    XGO_CUDA_CHECK(cudaMemcpyAsync(b.out, b.cache, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (w.cache.separate() && b.value_out != b.value_cache) {
    XGO_CUDA_CHECK(
        cudaMemcpyAsync(b.value_out, b.value_cache, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  if (w.num_tokens == 0) return XGO_OK;
  const int blocks = static_cast<int>(std::min<int64_t>(8192, w.num_tokens));
  const KvScales scales =
      MakeKvScales(w.k_scale, w.v_scale, w.k_scales_len, w.v_scales_len, b.k_scales, b.v_scales);
  return DispatchCuda(ComputeDtypes{}, w.dtype, w.op, [&](auto in_type) {
    using In = typename decltype(in_type)::Type;
    auto launch = [&](auto out_type, auto slot_type) {
      using Out = typename decltype(out_type)::Type;
      using Slot = typename decltype(slot_type)::Type;
      Out* k_cache = static_cast<Out*>(b.out);
      KvWriteKernel<In, Out, Slot><<<blocks, kKvWriteThreads, 0, stream>>>(
          static_cast<const In*>(b.key), static_cast<const In*>(b.value),
          static_cast<const Slot*>(b.slots), k_cache,
          w.cache.separate() ? static_cast<Out*>(b.value_out) : k_cache, w, scales);
      XGO_CUDA_CHECK(cudaGetLastError());
      return int32_t{XGO_OK};
    };
    auto with_slots = [&](auto out_type) {
      return w.slot_dtype == XGO_S64 ? launch(out_type, TypeTag<int64_t>{})
                                     : launch(out_type, TypeTag<int32_t>{});
    };
    if (w.cache_dtype == XGO_F8E4M3FN) return with_slots(TypeTag<__nv_fp8_e4m3>{});
    return with_slots(TypeTag<In>{});
  });
}

// ------------------------------------------------------------------ host (XLA:CPU)
int32_t RunKvWriteHost(const KvWrite& w, const KvWriteBuffers& b) {
  XGO_RETURN_IF_FAILED(CheckKvSlots(w, b.slots));
  const size_t bytes = static_cast<size_t>(w.cache_elems()) * DtypeSize(w.cache_dtype);
  if (b.out != b.cache) std::memcpy(b.out, b.cache, bytes);
  if (w.cache.separate() && b.value_out != b.value_cache)
    std::memcpy(b.value_out, b.value_cache, bytes);
  return host::DispatchHost(ComputeDtypes{}, w.dtype, w.op, [&](auto type) {
    using In = typename decltype(type)::Type;
    auto scatter = [&](auto cache_type) -> int32_t {
      using Out = decltype(cache_type);
      using Source = typename In::Storage;
      using Target = typename Out::Storage;
      const auto* key = static_cast<const Source*>(b.key);
      const auto* value = static_cast<const Source*>(b.value) + w.src_v;
      auto* k_cache = static_cast<Target*>(b.out);
      auto* v_cache =
          w.cache.separate() ? static_cast<Target*>(b.value_out) : k_cache + w.cache.v_offset;
      const KvScales scales = MakeKvScales(w.k_scale, w.v_scale, w.k_scales_len, w.v_scales_len,
                                           b.k_scales, b.v_scales);
      for (int64_t n = 0; n < w.num_tokens; ++n) {
        const int64_t slot = KvSlotAt(w, b.slots, n);
        if (slot < 0) continue;  // padding
        for (int64_t h = 0; h < w.num_kv_heads; ++h) {
          const float k_scale = scales.K(h), v_scale = scales.V(h);
          const int64_t from = n * w.src_token + h * w.src_head;
          const int64_t to = w.CacheOffset(slot, h);
          for (int64_t d = 0; d < w.head_dim; ++d) {
            k_cache[to + d] = Out::Store(In::Load(key[from + d]) / k_scale);
            v_cache[to + d] = Out::Store(In::Load(value[from + d]) / v_scale);
          }
        }
      }
      return XGO_OK;
    };
    if (w.cache_dtype == XGO_F8E4M3FN) return scatter(host::F8E4M3FN{});
    return scatter(In{});
  });
}

// ------------------------------------------------------------------ the op structs' shared part
// An op struct (core/op.h) of a cache write, from the op's names and operand indices: Op names
// kKey and kValue (one index, new_kv, for K and V interleaved in one source), kSlotMapping,
// kKvCache, kKScales, kVScales and kValueCache; its results are the two caches, after the
// operands.
template <typename Op>
struct KvWriteOp {
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
  static constexpr std::array<const char*, 2> kResultNames = {"kv_cache", "value_cache"};
  using Config = KvWrite;

  static int32_t Describe(const OpCall<Op>& call, Config* config, XgoResults* results) {
    const Shape* o = call.operands;
    const KvRows rows{Op::kOperandNames[Op::kKey], &o[Op::kKey],
                      Op::kKey == Op::kValue ? nullptr : &o[Op::kValue]};
    return DescribeKvWrite(Op::kName, rows, o[Op::kSlotMapping], o[Op::kKvCache],
                           o[Op::kValueCache], o[Op::kKScales], o[Op::kVScales], call.attrs.k_scale,
                           call.attrs.v_scale, call.attrs.kv_layout, config, results);
  }
  static KvWriteBuffers Buffers(void* const* b) {
    constexpr int kResult = static_cast<int>(Op::kOperandNames.size());  // results follow
    return {b[Op::kKey],        b[Op::kValue],   b[Op::kSlotMapping],
            b[Op::kKScales],    b[Op::kVScales], b[Op::kKvCache],
            b[Op::kValueCache], b[kResult],      b[kResult + 1]};
  }
  static int32_t Launch(const Config& c, void* const* buffers, cudaStream_t stream) {
    return LaunchKvWrite(c, Buffers(buffers), stream);
  }
  static int32_t RunHost(const Config& c, void* const* buffers) {
    return RunKvWriteHost(c, Buffers(buffers));
  }
  static int32_t CheckHostValues(const Config& c, const void* const* operands) {
    return CheckKvSlots(c, operands[Op::kSlotMapping]);
  }
};

}  // namespace
}  // namespace xgo

#endif  // XLA_GPU_OPS_CORE_KV_WRITE_CUH_
