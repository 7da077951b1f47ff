// Per-(kernel, device) launch facts, queried once and cached (paged_attention_launch.cu). Internal:
// shared by the decode launcher and the prefill launcher.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace xgo {

struct KernelLaunchInfo {
  int slots;                 // SMs x resident blocks per SM
  bool programmatic_launch;  // sm_90+: programmatic dependent launch
};

// The dynamic shared-memory attribute is set once and the resident-block count is queried once
// per (kernel, device); afterwards a launch costs no CUDA runtime call beyond cudaGetDevice (the
// eager / XLA path has no graph to amortise them). smem_bytes must be the same on every call for
// one kernel. Returns XGO_OK or the CUDA error's status.
int32_t GetKernelLaunchInfo(const void* kernel, size_t smem_bytes, KernelLaunchInfo* info);

}  // namespace xgo
