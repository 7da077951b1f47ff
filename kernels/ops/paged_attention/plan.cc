// paged_attention: what MakePagedAttentionPlan (paged_attention/plan.h) takes from the device a
// call runs on (QueryPlanDevice), the one debugging override of its path choice, and the test
// hooks that set that override and run the plan for a described device. Host code: no kernel.
#include "ops/paged_attention/plan.h"

#include <stdint.h>

#include <atomic>

#include "core/op_binding.h"
#include "core/status.h"
#include "ops/paged_attention/paged_attention.h"
#include "xla_gpu_ops/c_api.h"

namespace xgo {
namespace {

// The prefill kernel xgo_debug_force_prefill_kernel asks for (PrefillKernelChoice's value).
std::atomic<int> g_prefill_kernel{static_cast<int>(PrefillKernelChoice::kAuto)};

}  // namespace

int32_t QueryPlanDevice(PlanDevice* device) {
  device->prefill_kernel =
      static_cast<PrefillKernelChoice>(g_prefill_kernel.load(std::memory_order_relaxed));
  return Sm90PrefillAvailable(&device->sm90_prefill);
}

}  // namespace xgo

// Test and benchmark hooks (not part of c_api.h): run the two prefill kernels side by side in one
// process. kernel (the plan's PlanDevice::prefill_kernel from the next launch on): -1 lets the
// plan choose (the default), 0 forces the mma.sync kernel, 1 the sm_90a kernel where the device
// has it (elsewhere the plan still takes mma.sync). Returns the previous setting.
extern "C" XGO_EXPORT int32_t xgo_debug_force_prefill_kernel(int32_t kernel) {
  const int choice = static_cast<int>(xgo::PrefillKernelChoiceOf(kernel));
  return xgo::g_prefill_kernel.exchange(choice, std::memory_order_relaxed);
}

// Test hook (not part of c_api.h): the plan of `call`, after the static checks every entry point
// runs, for a device described by the arguments instead of the current one (no CUDA call):
// sm90_prefill 1 where the device runs the sm_90a kernel, prefill_kernel as
// xgo_debug_force_prefill_kernel takes it. Writes the path (AttentionPath's value) and the
// workspace size in float32 elements.
extern "C" XGO_EXPORT int32_t xgo_debug_paged_attention_plan(const XgoCall* call,
                                                             int32_t sm90_prefill,
                                                             int32_t prefill_kernel, int32_t* path,
                                                             int64_t* workspace_elems) {
  using xgo::PagedAttention;
  xgo::OpCall<PagedAttention> decoded;
  XGO_RETURN_IF_FAILED(xgo::DecodeCall(call, &decoded));
  PagedAttention::Config config;
  XgoResults results;
  XGO_RETURN_IF_FAILED(xgo::DescribeCall(decoded, &config, &results));
  if (path == nullptr || workspace_elems == nullptr) {
    return xgo::Fail(XGO_INVALID_ARGUMENT, "paged_attention: path, workspace_elems: NULL");
  }
  xgo::PlanDevice device;
  device.sm90_prefill = sm90_prefill != 0;
  device.prefill_kernel = xgo::PrefillKernelChoiceOf(prefill_kernel);
  const xgo::PagedAttentionPlan plan = xgo::MakePagedAttentionPlan(config, device);
  *path = static_cast<int32_t>(plan.path);
  *workspace_elems = plan.workspace_elems;
  return XGO_OK;
}
