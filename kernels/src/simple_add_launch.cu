// simple_add: the plain C launcher (c_api.h). Static checks, then one grid-stride launch on the
// caller's stream: the 16-byte vector kernel when a, b and out are 16-byte aligned, else scalar.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "xla_gpu_ops/c_api.h"
#include "xla_gpu_ops/config_check.h"
#include "xla_gpu_ops/cuda_check.cuh"
#include "xla_gpu_ops/simple_add_kernels.cuh"
#include "xla_gpu_ops/status.h"

namespace xgo {
namespace {

constexpr int kAddThreads = 256;
// Enough blocks to keep every SM of the largest GPUs busy; the grid-stride loop does the rest.
constexpr int64_t kMaxAddBlocks = 4096;

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T>
int32_t LaunchSimpleAdd(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  T* tout = static_cast<T*>(out);
  if (Aligned16(a) && Aligned16(b) && Aligned16(out)) {
    const int64_t vectors = std::max<int64_t>(1, n / Vec16<T>::kSize);
    const int blocks = static_cast<int>(std::min(kMaxAddBlocks, (vectors + kAddThreads - 1) / kAddThreads));
    SimpleAddVectorKernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, tout, n);
  } else {
    const int blocks = static_cast<int>(std::min(kMaxAddBlocks, (n + kAddThreads - 1) / kAddThreads));
    SimpleAddScalarKernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, tout, n);
  }
  XGO_CUDA_CHECK(cudaGetLastError());
  return XGO_OK;
}

}  // namespace
}  // namespace xgo

extern "C" XGO_EXPORT int32_t xla_gpu_simple_add_launch(const XgoSimpleAddConfig* config,
                                                        const void* a, const void* b, void* out,
                                                        void* cuda_stream) {
  if (config == nullptr) return xgo::Fail(XGO_INVALID_ARGUMENT, "simple_add: config: is NULL");
  if (const XgoStatus status = xgo::CheckSimpleAddConfig(*config); status != XGO_OK) return status;
  const int64_t n = config->num_elements;
  if (n == 0) return XGO_OK;  // nothing to launch
  if (a == nullptr) return xgo::Fail(XGO_INVALID_ARGUMENT, "simple_add: a: pointer is NULL");
  if (b == nullptr) return xgo::Fail(XGO_INVALID_ARGUMENT, "simple_add: b: pointer is NULL");
  if (out == nullptr) return xgo::Fail(XGO_INVALID_ARGUMENT, "simple_add: out: pointer is NULL");
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream);
  switch (config->dtype) {
    case XGO_F32:
      return xgo::LaunchSimpleAdd<float>(a, b, out, n, stream);
    case XGO_F16:
      return xgo::LaunchSimpleAdd<__half>(a, b, out, n, stream);
    case XGO_BF16:
      return xgo::LaunchSimpleAdd<__nv_bfloat16>(a, b, out, n, stream);
  }
  return xgo::Fail(XGO_INVALID_ARGUMENT, "simple_add: a: dtype code %d is not f32/f16/bf16",
                   config->dtype);
}
