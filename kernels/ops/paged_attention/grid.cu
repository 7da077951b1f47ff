// paged_attention: the launch facts every launch source shares (launch.h), below all of them: the
// per-(kernel, device) occupancy and programmatic-launch facts, cached once per device
// (GetKernelLaunchInfo), and a prefill kernel's grid and KV splits (MakePrefillLaunch). launch.cu
// and the prefill launchers (prefill_mma.cu, prefill_sm90.cu) call these; they call nothing back.
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "core/cuda_check.cuh"
#include "core/status.h"
#include "ops/paged_attention/launch.h"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/plan.h"

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

}  // namespace

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
  launch->grid =
      PrefillGrid{num_q_tiles, static_cast<int>(prefill_blocks), static_cast<int>(short_blocks),
                  static_cast<int>(blocks_per_split), persistent};
  // With a short region (one split) a 1-D grid holds both kinds; otherwise grid.z is the split.
  launch->blocks = short_blocks > 0
                       ? dim3(static_cast<unsigned>(prefill_blocks + short_blocks))
                       : dim3(static_cast<unsigned>(prefill_blocks / params.num_splits), 1u,
                              static_cast<unsigned>(params.num_splits));
  return XGO_OK;
}

int32_t GetKernelLaunchInfo(const void* kernel, size_t smem_bytes, KernelLaunchInfo* info) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, KernelLaunchInfo> cache;
  int device = 0;
  XGO_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  if (const auto it = cache.find(key); it != cache.end()) {
    *info = it->second;
    return XGO_OK;
  }
  XGO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  int num_sms = 0, blocks_per_sm = 0, major = 0;
  XGO_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  XGO_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  XGO_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, smem_bytes));
  // griddepcontrol exists only in code compiled for sm_90+ (older PTX JIT-compiled for a newer GPU
  // would skip the wait), so both the device and the kernel's PTX target must be >= 9.0.
  cudaFuncAttributes attributes{};
  XGO_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const bool programmatic = major >= 9 && attributes.ptxVersion >= 90;
  KernelLaunchInfo computed{num_sms * blocks_per_sm, programmatic};
  cache.emplace(key, computed);
  *info = computed;
  return XGO_OK;
}

}  // namespace xgo
