// paged_attention: launch of the prefill tiles of prefill-like f16/bf16 batches (LaunchMma in
// paged_attention_launch.cu calls it): the 128-row mma.sync kernel (paged_attention_prefill.cuh)
// or, on Hopper, the wgmma kernel (paged_attention_sm90.cuh), as the plan's path says; and the
// device facts the plan takes (QueryPlanDevice).
// Internal (hidden visibility, the library default) apart from the xgo_debug_* test hooks.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/cuda_check.cuh"
#include "xla_gpu_ops/launch_info.h"
#include "xla_gpu_ops/paged_attention_params.cuh"
#include "xla_gpu_ops/paged_attention_prefill.cuh"
#include "xla_gpu_ops/paged_attention_sm90.cuh"
#include "xla_gpu_ops/status.h"

namespace xgo {
namespace {

// Fewest splits (<= the workspace's planned count) that fill the GPU in whole waves.
int ChoosePrefillSplits(int planned, int64_t blocks_per_split, int64_t slots) {
  if (planned <= 1 || slots <= 0) return std::max(planned, 1);
  int best = planned;
  double best_efficiency = -1.0;
  for (int splits = 1; splits <= planned; ++splits) {
    const int64_t blocks = blocks_per_split * splits;
    if (blocks < slots) continue;
    const double waves = static_cast<double>(blocks) / static_cast<double>(slots);
    const double efficiency = waves / std::ceil(waves);
    if (efficiency > best_efficiency + 1e-3) {
      best_efficiency = efficiency;
      best = splits;
    }
  }
  return best;
}

// Grid of a prefill launch (both kernels): 128-row tiles of tokens_per_tile tokens x heads, the
// splits the launcher picks from the resident slots, and the short region's blocks.
struct PrefillLaunch {
  PrefillGrid grid;
  dim3 blocks;
};

// persistent_slots > 0 (the sm_90a kernel): a one-split launch with more items than that gets
// that many prefill blocks, which go on to the next item until none is left (NextPrefillItem).
int32_t MakePrefillLaunch(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                          int block_rows, int64_t slots, int64_t persistent_slots,
                          PrefillLaunch* launch) {
  // The plan's tile (16 rows per warp) sized the workspace; splits and merge do not depend on the
  // tile shape, so this kernel picks its own grid: block_rows = tokens_per_tile tokens x heads.
  params.tokens_per_tile = block_rows / params.heads_per_block;
  const int64_t num_q_tiles =
      static_cast<int64_t>(params.num_tokens) / params.tokens_per_tile + params.max_num_seqs;
  const int64_t num_head_blocks = plan.num_head_blocks;
  const int64_t blocks_per_split = num_q_tiles * num_head_blocks;
  if (blocks_per_split > INT32_MAX) {
    return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: %lld query tiles is too many",
                static_cast<long long>(blocks_per_split));
  }
  const int64_t real_blocks =
      std::min<int64_t>(num_q_tiles, params.num_tokens) * num_head_blocks;  // >= 1 token each
  params.num_splits = ChoosePrefillSplits(plan.num_splits, real_blocks, slots);
  // Both counts fit in int: CheckKernelLimits bounds prefill + short blocks statically, and
  // several splits only come with few blocks.
  const bool persistent =
      persistent_slots > 0 && params.num_splits == 1 && blocks_per_split > persistent_slots;
  const int64_t prefill_blocks =
      persistent ? persistent_slots : blocks_per_split * params.num_splits;
  const int64_t short_blocks =
      static_cast<int64_t>(params.max_num_seqs) * num_head_blocks * params.short_splits;
  launch->grid = PrefillGrid{num_q_tiles, static_cast<int>(prefill_blocks),
                             static_cast<int>(short_blocks), static_cast<int>(blocks_per_split),
                             persistent};
  // With a short region (one split) a 1-D grid holds both kinds; otherwise grid.z is the split.
  launch->blocks = short_blocks > 0
                       ? dim3(static_cast<unsigned>(prefill_blocks + short_blocks))
                       : dim3(static_cast<unsigned>(prefill_blocks / params.num_splits), 1u,
                              static_cast<unsigned>(params.num_splits));
  return XGO_OK;
}

template <typename T, int kD>
int32_t LaunchPrefillKernel(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                            cudaStream_t stream) {
  using Cfg = PrefillConfig<kD>;
  auto kernel = PagedAttentionPrefillKernel<T, kD>;
  // Short blocks run in the same launch; by default they need no more than a prefill block.
  const size_t smem = std::max(Cfg::kSmemBytes, ShortConfig<kD>::kSmemBytes);
  KernelLaunchInfo info{};  // cached per (kernel, device): no runtime calls per launch
  if (const int32_t status =
          GetKernelLaunchInfo(reinterpret_cast<const void*>(kernel), smem, &info);
      status != XGO_OK) {
    return status;
  }
  PrefillLaunch launch{};
  if (const int32_t status =
          MakePrefillLaunch(plan, params, Cfg::kBlockRows, info.slots, 0, &launch);
      status != XGO_OK) {
    return status;
  }
  kernel<<<launch.blocks, kThreads, smem, stream>>>(params, launch.grid);
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

// ---------------------------------------------------------------- the sm_90a kernel
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
    XGO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads,
                                                                 smem_bytes));
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

// The sm_90a kernel's K/V tensor map (Sm90KvTensorMap): boxes of one page, or of one tile where
// pages are larger than a tile. Left with box_rows 0 (cp.async only) where the page size is not a
// multiple of 8 (the swizzle repeats every 8 rows), neither divides nor is divided by the tile,
// the cache is not 16-byte aligned or has more than INT32_MAX slots, or the driver refuses: the
// kernel is correct either way.
template <int kD>
Sm90KvTensorMap MakeSm90KvTensorMap(const PagedAttentionParams& params) {
  constexpr int kN = Sm90PrefillConfig<kD>::kBlockN;
  Sm90KvTensorMap kv_map{};
  const int page_size = params.page_size;
  const int rows = std::min(page_size, kN);
  const bool tiles_fit = page_size > 0 && (kN % page_size == 0 || page_size % kN == 0);
  const auto address = reinterpret_cast<uintptr_t>(params.kv_cache);
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  // TMA coordinates are 32-bit: a cache of more slots goes by cp.async (64-bit offsets).
  const int64_t slots = static_cast<int64_t>(params.num_pages) * page_size;
  if (rows % 8 != 0 || !tiles_fit || address % 16 != 0 ||
      params.num_pages <= 0 || slots > INT32_MAX || encode == nullptr) {
    return kv_map;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kD),
                              static_cast<cuuint64_t>(2 * params.num_kv_heads),
                              static_cast<cuuint64_t>(slots)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kD) * 2,
                                 static_cast<cuuint64_t>(2 * params.num_kv_heads) * kD * 2};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(&kv_map.map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(params.kv_cache),
             dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  kv_map.box_rows = result == CUDA_SUCCESS ? rows : 0;
  return kv_map;
}

// The sm_90a kernel's Q and output tensor maps (Sm90RowTensorMaps) over [T, Hq, D]: Q in boxes of a
// block's rows, the output in boxes of a warp's 16 rows. Each left with 0 box tokens (the threads
// copy) where the tensor is not 16-byte aligned, a box dimension would pass 256, the heads of a
// block do not divide 16 (output) or the driver refuses.
template <int kD>
Sm90RowTensorMaps MakeSm90RowTensorMaps(const PagedAttentionParams& params) {
  Sm90RowTensorMaps maps{};
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  const int heads = params.heads_per_block;
  const int tokens = params.tokens_per_tile;
  if (encode == nullptr || params.num_tokens <= 0 || heads <= 0 ||
      heads > 256 || tokens <= 0 || tokens > 256) {
    return maps;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kD),
                              static_cast<cuuint64_t>(params.num_q_heads),
                              static_cast<cuuint64_t>(params.num_tokens)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kD) * 2,
                                 static_cast<cuuint64_t>(params.num_q_heads) * kD * 2};
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

template <typename T, int kD>
int32_t LaunchSm90PrefillKernel(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                                cudaStream_t stream) {
  using Cfg = Sm90PrefillConfig<kD>;
  auto kernel = PagedAttentionSm90PrefillKernel<T, kD>;
  const size_t smem = Cfg::kLaunchSmemBytes;
  Sm90LaunchInfo info{};
  if (const int32_t status = GetSm90LaunchInfo(reinterpret_cast<const void*>(kernel),
                                               Cfg::kThreads, smem, Cfg::kEntryRegs, &info);
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
  if (const int32_t status = MakePrefillLaunch(plan, params, Cfg::kBlockRows, info.slots,
                                               info.slots, &launch);
      status != XGO_OK) {
    return status;
  }
  kernel<<<launch.blocks, Cfg::kThreads, smem, stream>>>(params, launch.grid,
                                                         MakeSm90KvTensorMap<kD>(params),
                                                         MakeSm90RowTensorMaps<kD>(params));
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

// The prefill kernel xgo_debug_force_prefill_kernel asks for (PrefillKernelChoice's value).
std::atomic<int> g_prefill_kernel{static_cast<int>(PrefillKernelChoice::kAuto)};

// Whether the current device runs the sm_90a kernel (any instance answers for all: they are
// compiled in the same passes).
int32_t Sm90PrefillAvailable(bool* available) {
  Sm90LaunchInfo info{};
  using Cfg = Sm90PrefillConfig<128>;
  const int32_t status = GetSm90LaunchInfo(
      reinterpret_cast<const void*>(PagedAttentionSm90PrefillKernel<__nv_bfloat16, 128>),
      Cfg::kThreads, Cfg::kLaunchSmemBytes, Cfg::kEntryRegs, &info);
  *available = status == XGO_OK && info.has_code;
  return status;
}

}  // namespace

int32_t QueryPlanDevice(PlanDevice* device) {
  device->prefill_kernel =
      static_cast<PrefillKernelChoice>(g_prefill_kernel.load(std::memory_order_relaxed));
  return Sm90PrefillAvailable(&device->sm90_prefill);
}

template <typename T>
int32_t LaunchPrefillAttention(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                               cudaStream_t stream) {
  const bool sm90 = plan.path == AttentionPath::kPrefillSm90;
  if (sm90) {
    switch (params.head_dim) {
      case 64:
        return LaunchSm90PrefillKernel<T, 64>(plan, params, stream);
      case 128:
        return LaunchSm90PrefillKernel<T, 128>(plan, params, stream);
      case 256:
        return LaunchSm90PrefillKernel<T, 256>(plan, params, stream);
    }
  } else {
    switch (params.head_dim) {
      case 64:
        return LaunchPrefillKernel<T, 64>(plan, params, stream);
      case 128:
        return LaunchPrefillKernel<T, 128>(plan, params, stream);
    }
  }
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: prefill head_dim %d is not 64/128%s",
              params.head_dim, sm90 ? "/256" : "");
}

template int32_t LaunchPrefillAttention<__half>(const PagedAttentionPlan&, PagedAttentionParams&,
                                                cudaStream_t);
template int32_t LaunchPrefillAttention<__nv_bfloat16>(const PagedAttentionPlan&,
                                                       PagedAttentionParams&, cudaStream_t);

}  // namespace xgo

// Test and benchmark hooks (not part of c_api.h): run the two prefill kernels side by side in one
// process. kernel (the plan's PlanDevice::prefill_kernel from the next launch on): -1 lets the
// plan choose (the default), 0 forces the mma.sync kernel, 1 the sm_90a kernel where the device
// has it (elsewhere the plan still takes mma.sync). Returns the previous setting.
extern "C" XGO_EXPORT int32_t xgo_debug_force_prefill_kernel(int32_t kernel) {
  const int choice = static_cast<int>(xgo::PrefillKernelChoiceOf(kernel));
  return xgo::g_prefill_kernel.exchange(choice, std::memory_order_relaxed);
}

// 1 if the current device runs the sm_90a prefill kernel (compute capability 9.x and sm_90a code
// in this library), 0 if not, -1 on a CUDA error.
extern "C" XGO_EXPORT int32_t xgo_debug_sm90_prefill_available(void) {
  bool available = false;
  if (xgo::Sm90PrefillAvailable(&available) != XGO_OK) return -1;
  return available ? 1 : 0;
}
