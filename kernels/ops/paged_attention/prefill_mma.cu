// paged_attention: launch of the prefill tiles of a kPrefillMma plan on the 128-row mma.sync
// prefill kernel (paged_attention/prefill_mma.cuh), with the short region's decode blocks in the
// same launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "core/cuda_check.cuh"
#include "core/status.h"
#include "ops/paged_attention/launch.h"
#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/plan.h"
#include "ops/paged_attention/prefill_mma.cuh"
#include "xla_gpu_ops/c_api.h"

namespace xgo {
namespace {

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

}  // namespace

template <typename T>
int32_t LaunchPrefillMma(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                         cudaStream_t stream) {
  switch (KernelHeadDim(params.head_dim)) {
    case 64:
      return LaunchPrefillKernel<T, 64>(plan, params, stream);
    case 128:
      return LaunchPrefillKernel<T, 128>(plan, params, stream);
  }
  return Fail(XGO_INVALID_ARGUMENT, "paged_attention: query: no prefill kernel for head_dim %d",
              params.head_dim);
}

template int32_t LaunchPrefillMma<__half>(const PagedAttentionPlan&, PagedAttentionParams&,
                                          cudaStream_t);
template int32_t LaunchPrefillMma<__nv_bfloat16>(const PagedAttentionPlan&, PagedAttentionParams&,
                                                 cudaStream_t);

}  // namespace xgo
