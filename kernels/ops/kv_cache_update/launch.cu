// kv_cache_update: KvCacheUpdate::Launch (kv_cache_update.h): one scatter kernel on the caller's
// stream (after a device copy of the cache when the runtime gave the result its own buffer).
// Slots outside [0, num_pages * page_size) are skipped: padding when negative, guarded otherwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "core/cuda_check.cuh"
#include "core/device_utils.cuh"
#include "core/dtypes.cuh"
#include "core/scales.h"
#include "core/status.h"
#include "ops/kv_cache_update/kv_cache_update.h"

namespace xgo {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// One block per token (grid-stride), threads over the row's elements.
template <typename In, typename Out, typename Slot>
__global__ void __launch_bounds__(kThreads)
    KvCacheUpdateKernel(const In* __restrict__ rows, const Slot* __restrict__ slots,
                        Out* __restrict__ cache, int64_t num_tokens, int64_t num_slots,
                        int row_elems, int head_dim, KvScales scales) {
  for (int64_t n = blockIdx.x; n < num_tokens; n += gridDim.x) {
    const int64_t slot = static_cast<int64_t>(slots[n]);
    if (slot < 0 || slot >= num_slots) continue;
    const In* source = rows + n * row_elems;
    Out* target = cache + slot * row_elems;
    for (int e = threadIdx.x; e < row_elems; e += blockDim.x) {
      const float scale = scales.OfCombinedHead(e / head_dim);
      target[e] = FromFloat<Out>(ToFloat(source[e]) / scale);
    }
  }
}

template <typename In, typename Out, typename Slot>
int32_t LaunchScatter(const KvCacheUpdateConfig& c, void* const* buffers, cudaStream_t stream) {
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, c.num_tokens));
  KvCacheUpdateKernel<In, Out, Slot><<<blocks, kThreads, 0, stream>>>(
      static_cast<const In*>(buffers[KvCacheUpdate::kNewKv]),
      static_cast<const Slot*>(buffers[KvCacheUpdate::kSlotMapping]),
      static_cast<Out*>(buffers[KvCacheUpdate::kResult]), c.num_tokens, c.num_slots(),
      static_cast<int>(c.row_elems()), static_cast<int>(c.head_dim),
      MakeKvScales(c.k_scale, c.v_scale, c.k_scales_len, c.v_scales_len,
                   buffers[KvCacheUpdate::kKScales], buffers[KvCacheUpdate::kVScales]));
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace

int32_t KvCacheUpdate::Launch(const Config& c, void* const* buffers, cudaStream_t stream) {
  for (int i = 0; i <= kResult; ++i) {
    const bool absent = (i == kKScales && c.k_scales_len == 0) ||
                        (i == kVScales && c.v_scales_len == 0);  // [0]: any pointer
    if (buffers[i] == nullptr && !absent && (i == kKvCache || i == kResult || c.num_tokens > 0)) {
      return Fail(XGO_INVALID_ARGUMENT, "kv_cache_update: %s: pointer is NULL",
                  i < kResult ? kOperandNames[i] : kResultNames[0]);
    }
  }
  if (buffers[kResult] != buffers[kKvCache]) {  // not aliased: the result starts as the cache
    const size_t bytes =
        static_cast<size_t>(c.num_slots() * c.row_elems()) * DtypeSize(c.cache_dtype);
    XGO_CUDA_CHECK(cudaMemcpyAsync(buffers[kResult], buffers[kKvCache], bytes,
                                   cudaMemcpyDeviceToDevice, stream));
  }
  if (c.num_tokens == 0) return XGO_OK;
  return DispatchCuda(ComputeDtypes{}, c.dtype, "kv_cache_update: new_kv", [&](auto in_type) {
    using In = typename decltype(in_type)::Type;
    auto with_slots = [&](auto out_type) {
      using Out = typename decltype(out_type)::Type;
      return c.slot_dtype == XGO_S64 ? LaunchScatter<In, Out, int64_t>(c, buffers, stream)
                                     : LaunchScatter<In, Out, int32_t>(c, buffers, stream);
    };
    if (c.cache_dtype == XGO_F8E4M3FN) return with_slots(TypeTag<__nv_fp8_e4m3>{});
    return with_slots(TypeTag<In>{});
  });
}

}  // namespace xgo
