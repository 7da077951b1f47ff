// paged_attention: launch of the prefill tiles of a kPrefillSm90 plan on the wgmma kernel
// (paged_attention/prefill_sm90.cuh): its launch facts per device, the TMA tensor maps of K/V, Q
// and the output, and whether the current device runs it at all (Sm90PrefillAvailable, which the
// plan's device facts ask). Internal (hidden visibility, the library default) apart from the
// xgo_debug_sm90_prefill_available test hook.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.cuh"
#include "core/status.h"
#include "ops/paged_attention/launch.h"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/plan.h"
#include "ops/paged_attention/prefill_sm90.cuh"
#include "xla_gpu_ops/c_api.h"

namespace xgo {
namespace {

// Launch facts of one sm_90a kernel instance on one device, queried once: resident slots (SMs x
// blocks of 384 threads per SM; GetKernelLaunchInfo assumes 128-thread blocks) and whether the
// instance runs there: sm_90a code (PTX >= 9.0: otherwise the runtime would run an older pass's
// empty kernel, JIT-compiled) compiled with the register count its setmaxnreg budgets assume.
struct Sm90LaunchInfo {
  int64_t slots;
  bool has_code;
};

int32_t GetSm90LaunchInfo(const void* kernel, int threads, size_t smem_bytes, int entry_registers,
                          Sm90LaunchInfo* info) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, Sm90LaunchInfo> cache;
  int device = 0;
  XGO_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  if (const auto it = cache.find(key); it != cache.end()) {
    *info = it->second;
    return XGO_OK;
  }
  int major = 0, num_sms = 0;
  XGO_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  XGO_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  cudaFuncAttributes attributes{};
  XGO_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  Sm90LaunchInfo computed{
      0, major == 9 && attributes.ptxVersion >= 90 && attributes.numRegs >= entry_registers};
  if (computed.has_code) {
    XGO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
    int blocks_per_sm = 0;
    XGO_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, smem_bytes));
    computed.slots = static_cast<int64_t>(num_sms) * blocks_per_sm;
  }
  cache.emplace(key, computed);
  *info = computed;
  return XGO_OK;
}

// The driver's cuTensorMapEncodeTiled through the runtime (the library links no libcuda);
// nullptr where the driver does not offer it.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
}

// The sm_90a kernel's K/V tensor maps (Sm90KvTensorMap): boxes of one page, or of one tile where
// pages are larger than a tile. 16-bit caches: 64 columns per box with the 128-byte swizzle the
// wgmma descriptors read; fp8 caches: a whole row of kD bytes per box, unswizzled, into the staging
// buffer. One map serves K and V where they share a tensor (interleaved, paired), separate caches
// get a map each. The arrangement comes from the strides (launch.cu copies them from
// KvCacheLayout): HND where a head's rows are further apart than a page's rows, interleaved where
// the heads are two head extents apart, paired where V's block of a page follows K's. Left with
// box_rows 0 (cp.async only) where the page size is not a multiple of 8 (the swizzle repeats every
// 8 rows), neither divides nor is divided by the tile, a cache is not 16-byte aligned, the strides
// are none of these, a coordinate would pass INT32_MAX or the driver refuses: the kernel is
// correct either way.
template <int kD, bool kFp8>
Sm90KvTensorMap MakeSm90KvTensorMap(const PagedAttentionParams& params) {
  constexpr int kN = Sm90PrefillConfig<kD, kFp8>::kBlockN;
  constexpr int kElemBytes = kFp8 ? 1 : 2;
  Sm90KvTensorMap kv_map{};
  const int page_size = params.page_size;
  const int rows = std::min(page_size, kN);
  const bool tiles_fit = page_size > 0 && (kN % page_size == 0 || page_size % kN == 0);
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  // The tensor's d extent: head_dim, which may be below kD (a box's columns past it read zeros).
  const int64_t d = params.head_dim;
  const bool head_major = params.kv_head_stride > params.kv_row_stride;
  const int64_t head_extent = head_major ? page_size * d : d;
  const bool interleaved = params.kv_head_stride == 2 * head_extent;
  const int64_t heads = interleaved ? 2 * params.num_kv_heads : params.num_kv_heads;
  const int64_t block = heads * page_size * d;  // a page of one tensor's heads
  const bool paired =
      !interleaved && params.kv_page_stride == 2 * block && params.v_offset == block;
  const bool strides_known = params.kv_row_stride == (head_major ? d : heads * d) &&
                             params.kv_head_stride == (interleaved ? 2 : 1) * head_extent &&
                             params.kv_page_stride == (paired ? 2 : 1) * block;
  // NHD: (d, head, slot), a paired cache's pages as 2 * page_size slots (K's rows, then V's);
  // HND: (d, row, page * map_heads + head), a paired cache's pages as 2 * Hkv heads.
  const int64_t map_heads = head_major && paired ? 2 * heads : heads;
  // TMA coordinates are 32-bit, and so is the slot the producer's key walk hands over: a cache of
  // more slots or coordinates goes by cp.async (64-bit offsets).
  const int64_t slots = static_cast<int64_t>(params.num_pages) * page_size;
  const int64_t outer = head_major ? params.num_pages * map_heads : (paired ? 2 : 1) * slots;
  const char* keys = static_cast<const char*>(params.kv_cache);
  const char* values = keys + params.v_offset * kElemBytes;
  if (rows % 8 != 0 || !tiles_fit || reinterpret_cast<uintptr_t>(keys) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(values) % 16 != 0 || params.num_pages <= 0 || slots > INT32_MAX ||
      outer > INT32_MAX || encode == nullptr || !strides_known) {
    return kv_map;
  }
  const cuuint32_t box_cols = kFp8 ? kD : 64;
  const int64_t middle = head_major ? page_size : heads;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(middle),
                              static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * kElemBytes,
                                 static_cast<cuuint64_t>(middle * d) * kElemBytes};
  const cuuint32_t box[3] = {box_cols, head_major ? static_cast<cuuint32_t>(rows) : 1,
                             head_major ? 1 : static_cast<cuuint32_t>(rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  auto make = [&](CUtensorMap* map, const void* base) {
    return encode(map, kFp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                  const_cast<void*>(base), dims, strides, box, element_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE,
                  kFp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult result = make(&kv_map.map, keys);
  if (interleaved || paired) {
    kv_map.v_map = kv_map.map;
  } else if (result == CUDA_SUCCESS) {
    result = make(&kv_map.v_map, values);
  }
  kv_map.head_step = interleaved ? 2 : 1;
  kv_map.v_head = interleaved ? 1 : (paired && head_major ? static_cast<int>(heads) : 0);
  kv_map.head_major = head_major;
  kv_map.heads = static_cast<int>(map_heads);
  kv_map.pair_rows = paired && !head_major ? page_size : 0;
  kv_map.box_rows = result == CUDA_SUCCESS ? rows : 0;
  return kv_map;
}

// The sm_90a kernel's Q and output tensor maps (Sm90RowTensorMaps) over [T, Hq, D]: Q in boxes of a
// block's rows, the output in boxes of a warp's 16 rows. Each left with 0 box tokens (the threads
// copy) where the tensor is not 16-byte aligned, a box dimension would pass 256, the heads of a
// block do not divide 16 (output) or the driver refuses.
Sm90RowTensorMaps MakeSm90RowTensorMaps(const PagedAttentionParams& params) {
  Sm90RowTensorMaps maps{};
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  const int heads = params.heads_per_block;
  const int tokens = params.tokens_per_tile;
  if (encode == nullptr || params.num_tokens <= 0 || heads <= 0 || heads > 256 || tokens <= 0 ||
      tokens > 256) {
    return maps;
  }
  // [T, Hq, head_dim]: boxes of 64 columns, those past head_dim read as zeros (Q) or clipped
  const int64_t d = params.head_dim;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d),
                              static_cast<cuuint64_t>(params.num_q_heads),
                              static_cast<cuuint64_t>(params.num_tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * 2,
                                 static_cast<cuuint64_t>(params.num_q_heads * d) * 2};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  auto make = [&](CUtensorMap* map, const void* tensor, int box_tokens) {
    if (reinterpret_cast<uintptr_t>(tensor) % 16 != 0) return 0;
    const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(heads),
                               static_cast<cuuint32_t>(box_tokens)};
    const CUresult result =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(tensor), dims, strides,
               box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? box_tokens : 0;
  };
  maps.q_box_tokens = make(&maps.q, params.query, tokens);
  if (16 % heads == 0) maps.out_box_tokens = make(&maps.out, params.out, 16 / heads);
  return maps;
}

template <typename T, typename KV, int kD>
int32_t LaunchSm90PrefillKernel(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                                cudaStream_t stream) {
  using Cfg = Sm90PrefillConfig<kD, IsFp8<KV>>;
  auto kernel = PagedAttentionSm90PrefillKernel<T, KV, kD>;
  const size_t smem = Cfg::kLaunchSmemBytes;
  Sm90LaunchInfo info{};
  if (const int32_t status = GetSm90LaunchInfo(reinterpret_cast<const void*>(kernel), Cfg::kThreads,
                                               smem, Cfg::kEntryRegs, &info);
      status != XGO_OK) {
    return status;
  }
  if (!info.has_code) {  // the plan asked the same question (QueryPlanDevice): not reached
    return Fail(XGO_CUDA_ERROR, "paged_attention: no sm_90a code for the wgmma prefill kernel");
  }
  PrefillLaunch launch{};
  // Persistent: one block per SM slot (the phase timestamps showed ~4 us of each block's ~19 us
  // at B8 x 2k, D 128, in its lookup, set-up, first tile and epilogue, which the producer now
  // overlaps with the item before).
  if (const int32_t status =
          MakePrefillLaunch(plan, params, Cfg::kBlockRows, info.slots, info.slots, &launch);
      status != XGO_OK) {
    return status;
  }
  kernel<<<launch.blocks, Cfg::kThreads, smem, stream>>>(params, launch.grid,
                                                         MakeSm90KvTensorMap<kD, IsFp8<KV>>(params),
                                                         MakeSm90RowTensorMaps(params));
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace

// Any instance of the kernel answers for all: they are compiled in the same passes.
int32_t Sm90PrefillAvailable(bool* available) {
  Sm90LaunchInfo info{};
  using Cfg = Sm90PrefillConfig<128>;
  const int32_t status =
      GetSm90LaunchInfo(reinterpret_cast<const void*>(
                            PagedAttentionSm90PrefillKernel<__nv_bfloat16, __nv_bfloat16, 128>),
                        Cfg::kThreads, Cfg::kLaunchSmemBytes, Cfg::kEntryRegs, &info);
  *available = status == XGO_OK && info.has_code;
  return status;
}

template <typename T, typename KV>
int32_t LaunchPrefillSm90(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                          cudaStream_t stream) {
  switch (KernelHeadDim(params.head_dim)) {
    case 64:
      return LaunchSm90PrefillKernel<T, KV, 64>(plan, params, stream);
    case 128:
      return LaunchSm90PrefillKernel<T, KV, 128>(plan, params, stream);
    case 256:
      return LaunchSm90PrefillKernel<T, KV, 256>(plan, params, stream);
  }
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: no prefill kernel for head_dim %d",
              params.head_dim);
}

template int32_t LaunchPrefillSm90<__half, __half>(const PagedAttentionPlan&, PagedAttentionParams&,
                                                   cudaStream_t);
template int32_t LaunchPrefillSm90<__nv_bfloat16, __nv_bfloat16>(const PagedAttentionPlan&,
                                                                 PagedAttentionParams&,
                                                                 cudaStream_t);
template int32_t LaunchPrefillSm90<__half, __nv_fp8_e4m3>(const PagedAttentionPlan&,
                                                          PagedAttentionParams&, cudaStream_t);
template int32_t LaunchPrefillSm90<__nv_bfloat16, __nv_fp8_e4m3>(const PagedAttentionPlan&,
                                                                 PagedAttentionParams&,
                                                                 cudaStream_t);

}  // namespace xgo

// Test and benchmark hook (not part of c_api.h): 1 if the current device runs the sm_90a prefill
// kernel (compute capability 9.x and sm_90a code in this library), 0 if not, -1 on a CUDA error.
extern "C" XGO_EXPORT int32_t xgo_debug_sm90_prefill_available(void) {
  bool available = false;
  if (xgo::Sm90PrefillAvailable(&available) != XGO_OK) return -1;
  return available ? 1 : 0;
}
