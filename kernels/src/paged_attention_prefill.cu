// paged_attention: launch of the 128-row prefill kernel (paged_attention_prefill.cuh), called by
// LaunchMma in paged_attention_launch.cu for non-decode f16/bf16 batches with head_dim 64/128.
// Internal (hidden visibility, the library default): no C ABI here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>

#include "xla_gpu_ops/cuda_check.cuh"
#include "xla_gpu_ops/launch_info.h"
#include "xla_gpu_ops/paged_attention_params.cuh"
#include "xla_gpu_ops/paged_attention_prefill.cuh"
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
  // The plan's tile (16 rows per warp) sized the workspace; splits and merge do not depend on the
  // tile shape, so this kernel picks its own grid: 128 rows = tokens_per_tile tokens x heads.
  params.tokens_per_tile = Cfg::kBlockRows / params.heads_per_block;
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
  params.num_splits = ChoosePrefillSplits(plan.num_splits, real_blocks, info.slots);
  // Both counts fit in int: CheckKernelLimits bounds prefill + short blocks statically, and
  // several splits only come with few blocks.
  const int64_t prefill_blocks = blocks_per_split * params.num_splits;
  const int64_t short_blocks =
      static_cast<int64_t>(params.max_num_seqs) * num_head_blocks * params.short_splits;
  const PrefillGrid grid{num_q_tiles, static_cast<int>(prefill_blocks),
                         static_cast<int>(short_blocks)};
  // With a short region (one split) a 1-D grid holds both kinds; otherwise grid.z is the split.
  const dim3 blocks = short_blocks > 0
                          ? dim3(static_cast<unsigned>(prefill_blocks + short_blocks))
                          : dim3(static_cast<unsigned>(blocks_per_split), 1u,
                                 static_cast<unsigned>(params.num_splits));
  kernel<<<blocks, kThreads, smem, stream>>>(params, grid);
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace

template <typename T>
int32_t LaunchPrefillAttention(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                               cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return LaunchPrefillKernel<T, 64>(plan, params, stream);
    case 128:
      return LaunchPrefillKernel<T, 128>(plan, params, stream);
  }
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: prefill head_dim %d is not 64/128",
              params.head_dim);
}

template int32_t LaunchPrefillAttention<__half>(const PagedAttentionPlan&, PagedAttentionParams&,
                                                cudaStream_t);
template int32_t LaunchPrefillAttention<__nv_bfloat16>(const PagedAttentionPlan&,
                                                       PagedAttentionParams&, cudaStream_t);

}  // namespace xgo
