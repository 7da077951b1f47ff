// Writes of new tokens' K and V rows into a paged cache, shared by kv_cache_update (K and V
// interleaved in new_kv) and kv_cache_store (key and value apart): the static checks, the slot
// checks, the CUDA scatter and the host (XLA:CPU) scatter. Either op writes into one interleaved
// cache [P, page_size, 2*Hkv, D] (K even, V odd heads) or into caches of their own (kv_cache: K,
// value_cache: V, each [P, page_size, Hkv, D]). Sources and caches are addressed through element
// strides, so each op only says where its rows are.
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
// n * src_token + h * src_head (V: + src_v, in value's buffer); in a cache, for slot s at page
// s / page_size, row s % page_size: page * cache_page + row * cache_row + h * cache_head (V:
// + cache_v, in value_cache's buffer when separate). NHD or HND (kv_layout) is only strides.
struct KvWrite {
  const char* op;
  int32_t dtype;        // the new rows
  int32_t cache_dtype;  // the cache(s): the rows' dtype or float8_e4m3fn
  int32_t slot_dtype;   // int32 or int64
  int64_t num_tokens, num_kv_heads, head_dim, num_slots, page_size;
  int64_t src_token, src_head, src_v;
  int64_t cache_page, cache_row, cache_head, cache_v;
  bool separate;  // V in value_cache
  float k_scale, v_scale;
  int64_t k_scales_len, v_scales_len;  // entries of k_scales / v_scales: 0 (none), 1 or Hkv

  // Elements of each cache buffer (one interleaved cache, or each of K and V).
  int64_t cache_elems() const { return num_slots / page_size * cache_page; }
  XGO_HOST_DEVICE int64_t CacheOffset(int64_t slot, int64_t kv_head) const {
    return slot / page_size * cache_page + slot % page_size * cache_row + kv_head * cache_head;
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
  // value_cache absent: the [0] array every front end passes for a left-out optional operand
  const bool separate = !(value_cache.rank == 1 && value_cache.dims[0] == 0);
  XGO_RETURN_IF_FAILED(CheckRank(op, rows.key_name, key, 3));
  if (apart) XGO_RETURN_IF_FAILED(CheckRank(op, "value", *rows.value, 3));
  XGO_RETURN_IF_FAILED(CheckRank(op, "slot_mapping", slots, 1));
  XGO_RETURN_IF_FAILED(CheckRank(op, "kv_cache", cache, 4));
  if (separate) XGO_RETURN_IF_FAILED(CheckRank(op, "value_cache", value_cache, 4));
  XGO_RETURN_IF_FAILED(CheckRank(op, "k_scales", k_scales, 1));
  XGO_RETURN_IF_FAILED(CheckRank(op, "v_scales", v_scales, 1));
  XGO_RETURN_IF_FAILED(CheckDtype(op, rows.key_name, key, ComputeDtypes{}));
  if (apart) XGO_RETURN_IF_FAILED(CheckSameDtype(op, "value", *rows.value, "key", key));
  XGO_RETURN_IF_FAILED(CheckDtype(op, "slot_mapping", slots, DtypeSet<XGO_S32, XGO_S64>{}));
  if (cache.dtype != key.dtype && cache.dtype != XGO_F8E4M3FN) {
    return Fail(XGO_INVALID_DTYPE, "%s: kv_cache: dtype %s is neither %s's %s nor float8_e4m3fn",
                op, DtypeText(cache.dtype).c_str(), rows.key_name, DtypeText(key.dtype).c_str());
  }
  if (separate) {
    XGO_RETURN_IF_FAILED(CheckSameDtype(op, "value_cache", value_cache, "kv_cache", cache));
    if (!value_cache.SameDims(cache)) {
      return Fail(XGO_INVALID_ARGUMENT,
                  "%s: value_cache: shape %s differs from the K cache's (kv_cache) %s", op,
                  value_cache.Text().c_str(), cache.Text().c_str());
    }
  }
  if (apart && !rows.value->SameDims(key)) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: value: shape %s differs from key's %s", op,
                rows.value->Text().c_str(), key.Text().c_str());
  }
  if (slots.dims[0] != key.dims[0]) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: slot_mapping: %lld entries, %s has %lld tokens", op,
                static_cast<long long>(slots.dims[0]), rows.key_name,
                static_cast<long long>(key.dims[0]));
  }
  for (int d = 0; d < 4; ++d) {
    if (cache.dims[d] <= 0) {
      return Fail(XGO_INVALID_ARGUMENT, "%s: kv_cache: shape %s has an empty dimension", op,
                  cache.Text().c_str());
    }
  }
  XGO_RETURN_IF_FAILED(CheckKvLayout(op, kv_layout));
  const bool head_major = kv_layout == kKvLayoutHnd;
  // The cache's dims of heads and of a page's rows: [P, page_size, heads, D] or (HND) swapped.
  const int heads_dim = head_major ? 1 : 2;
  const int64_t heads = cache.dims[heads_dim], page_size = cache.dims[3 - heads_dim];
  if (!separate && heads % 2 != 0) {
    return Fail(XGO_INVALID_ARGUMENT,
                "%s: kv_cache: dim %d must be 2 * num_kv_heads (K and V interleaved), got %lld; "
                "give value_cache for K and V in caches of their own",
                op, heads_dim, static_cast<long long>(heads));
  }
  // Per source row and per cache row, heads as the interleaved layout counts them (K and V).
  const int64_t source_heads = apart ? 2 * key.dims[1] : key.dims[1];
  const int64_t cache_heads = separate ? 2 * heads : heads;
  if (source_heads != cache_heads || key.dims[2] != cache.dims[3]) {
    const char* rows_of = apart ? "[Hkv, D]" : "[2 * Hkv, D]";
    const char* cache_of = separate ? "[Hkv, D]" : "[2 * Hkv, D]";
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
  // The kernel indexes a token's K and V elements with int and a cache with int64: both must fit.
  int64_t row = 0, num_slots = 0, cache_elems = 0;
  // row: a token's K and V elements (2 * Hkv * D), the write kernel's int loop bound
  if (__builtin_mul_overflow(cache_heads, cache.dims[3], &row) || row > INT32_MAX ||
      __builtin_mul_overflow(cache.dims[0], page_size, &num_slots) ||
      __builtin_mul_overflow(num_slots, row, &cache_elems)) {
    return Fail(XGO_INVALID_ARGUMENT, "%s: kv_cache: shape %s is too large", op,
                cache.Text().c_str());
  }
  const int64_t num_kv_heads = source_heads / 2, head_dim = key.dims[2];
  XGO_RETURN_IF_FAILED(CheckScales(op, "k_scale", k_scales, num_kv_heads));
  XGO_RETURN_IF_FAILED(CheckScales(op, "v_scale", v_scales, num_kv_heads));
  const int64_t apart_row = num_kv_heads * head_dim;
  // A cache's next combined head: + D (NHD) or + page_size * D (HND); interleaved V is the next.
  const int64_t next_head = head_major ? page_size * head_dim : head_dim;
  *w = KvWrite{op,
               key.dtype,
               cache.dtype,
               slots.dtype,
               key.dims[0],
               num_kv_heads,
               head_dim,
               num_slots,
               page_size,
               apart ? apart_row : 2 * apart_row,
               apart ? head_dim : 2 * head_dim,
               apart ? 0 : head_dim,
               page_size * heads * head_dim,
               head_major ? head_dim : heads * head_dim,
               separate ? next_head : 2 * next_head,
               separate ? 0 : next_head,
               separate,
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
      Out* target = is_v ? v_cache + w.cache_v : k_cache;
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
      {"value_cache", b.value_cache, w.separate},
      {"the result kv_cache", b.out, true},
      {"the result value_cache", b.value_out, w.separate},
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
  if (w.separate && b.value_out != b.value_cache) {
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
          w.separate ? static_cast<Out*>(b.value_out) : k_cache, w, scales);
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
  if (w.separate && b.value_out != b.value_cache) std::memcpy(b.value_out, b.value_cache, bytes);
  return host::DispatchHost(ComputeDtypes{}, w.dtype, w.op, [&](auto type) {
    using In = typename decltype(type)::Type;
    auto scatter = [&](auto cache_type) -> int32_t {
      using Out = decltype(cache_type);
      using Source = typename In::Storage;
      using Target = typename Out::Storage;
      const auto* key = static_cast<const Source*>(b.key);
      const auto* value = static_cast<const Source*>(b.value) + w.src_v;
      auto* k_cache = static_cast<Target*>(b.out);
      auto* v_cache = w.separate ? static_cast<Target*>(b.value_out) : k_cache + w.cache_v;
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
