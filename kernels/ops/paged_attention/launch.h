// paged_attention: what the launch sources share (src/paged_attention/): per-(kernel, device)
// launch facts, the prefill launches' grid, and the prefill launchers PagedAttention::Launch calls.
// Internal; plain C++ (declarations only).
#ifndef XLA_GPU_OPS_PAGED_ATTENTION_LAUNCH_H_
#define XLA_GPU_OPS_PAGED_ATTENTION_LAUNCH_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/paged_attention/params.cuh"
#include "ops/paged_attention/plan.h"

namespace xgo {

struct KernelLaunchInfo {
  int slots;                 // SMs x resident blocks per SM
  bool programmatic_launch;  // sm_90+: programmatic dependent launch
};

// The dynamic shared-memory attribute is set once and the resident-block count is queried once
// per (kernel, device); afterwards a launch costs no CUDA runtime call beyond cudaGetDevice (the
// eager / XLA path has no graph to amortise them). smem_bytes must be the same on every call for
// one kernel. Returns XGO_OK or the CUDA error's status. Defined in launch.cu.
int32_t GetKernelLaunchInfo(const void* kernel, size_t smem_bytes, KernelLaunchInfo* info);

// Grid of a prefill launch (both kernels): tiles of block_rows rows = tokens_per_tile tokens x
// heads, the splits the launcher picks from the resident slots, and the short region's blocks.
struct PrefillLaunch {
  PrefillGrid grid;
  dim3 blocks;
};

// Sets params.tokens_per_tile and params.num_splits (<= the plan's). persistent_slots > 0 (the
// sm_90a kernel): a one-split launch with more items than that gets that many prefill blocks,
// which go on to the next item until none is left (NextPrefillItem). Defined in launch.cu.
int32_t MakePrefillLaunch(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                          int block_rows, int64_t slots, int64_t persistent_slots,
                          PrefillLaunch* launch);

// The prefill tiles of a kPrefillMma plan (kernel width 64 / 128) on the mma.sync prefill kernel
// (prefill_mma.cu), and of a kPrefillSm90 plan (width 64 / 128 / 256) on the wgmma kernel
// (prefill_sm90.cu). T: __half or __nv_bfloat16; KV: the cache's element type (T, or
// __nv_fp8_e4m3 on the wgmma kernel).
template <typename T>
int32_t LaunchPrefillMma(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                         cudaStream_t stream);
template <typename T, typename KV>
int32_t LaunchPrefillSm90(const PagedAttentionPlan& plan, PagedAttentionParams& params,
                          cudaStream_t stream);

// Whether the current device runs the sm_90a kernel: compute capability 9.x and sm_90a code in
// this library, queried once per device (prefill_sm90.cu).

}  // namespace xgo

#endif  // XLA_GPU_OPS_PAGED_ATTENTION_LAUNCH_H_
